"""What infera-REPLACE_ME_OP declares to the plugin. Plain data: imports nothing but ``infera_vllm.spec``."""

from infera_vllm.spec import OpSpec, Switch, Symbol

SPEC = OpSpec(
    name="REPLACE_ME_OP",
    distribution="infera-REPLACE_ME_OP",
    seam="REPLACE_ME: where it plugs into vLLM (one line, shown in logs and doctor)",
    vllm=">=0.24,<0.33",  # the releases whose seam you checked (docs/vllm-seams.md)
    requires=(
        # every vLLM symbol the seam touches; params= the parameter names you pass; vllm= if it moved
        Symbol("vllm.REPLACE_ME.module", "REPLACE_ME_attr", params=()),
    ),
    gpu_families=("cpu", "sm90"),  # where the kernel is validated; "cpu" = Triton interpreter in CI
    activate="infera_ops.REPLACE_ME_MODULE.seam:activate",
    sites=(),  # model-site kinds for `doctor --model`: "rms_norm", "attention", "moe", "linear"
    # the op's own environment switches: the plugin parses them before check() (a bad value declines the op
    # bad-switch), doctor lists them, docs/switches.md must list each; read one with
    # infera_vllm.switches.op_value(SPEC, name), or ctx.switch(name) in check/activate. Kinds: "flag" (default
    # True/False), "int" (minimum=...), "choice" (choices=(...), default one of them), "path"; unset: default.
    switches=(
        Switch("INFERA_REPLACE_ME_EAGER", "flag", False, doc="REPLACE_ME: what turning it on changes"),
        Switch("INFERA_REPLACE_ME_TUNING", "path", doc="tuning file replacing the family's tuning/<family>.json"),
    ),
)
