"""The vLLM side of infera-linear-hipblaslt, and how it is installed: vLLM's unquantized GEMM dispatch, wrapped,
serving the shapes of the family's tuning table (policy.py).

Declines at startup, with its reason: on the CPU without ``TRITON_INTERPRET=1`` (``triton-interpreter-off``);
a family without a table (``not-tuned``: run ``infera-vllm tune linear`` on that GPU); an unreadable table or
switch (``bad-tuning``). ``plan`` answers ``infera-vllm doctor --model`` per linear layer. The plugin imports
this module only once the spec's checks passed (it imports torch and vLLM).

``vllm.model_executor.layers.linear.dispatch_unquantized_gemm`` returns the GEMM a linear layer calls (0.24 /
0.26: on every call; 0.32: once per layer, at construction, from ``--linear-backend``). The wrapper returns,
for each GEMM vLLM would pick on this platform (``F.linear`` on CUDA, vLLM's ROCm or CPU GEMMs), a function
that serves the shapes in the tuning table through the torch custom op ``infera::linear`` and passes the rest
to vLLM's pick; a backend the user chose (``--linear-backend``, 0.32) is returned untouched and counted.
The LM head calls its own imported reference (``vocab_parallel_embedding``): wrapped only to count it.

Decisions that read only static facts (weight shape, dtypes, strides, table membership) are taken in Python,
where Dynamo traces them as constants; the token count is read inside the custom op, on real tensors (each
eager call, once at CUDA-graph capture), so nothing here specialises vLLM's compiled graph. Counting happens
only outside Dynamo's tracing.

Self-check (infera_vllm.self_check), per weight shape and token bucket (``4096x4096 3-4``): the first eager call
of a shape the table gives the kernel also runs vLLM's GEMM on the same inputs and compares. That includes
eager calls handed over for launch cost (``eager-launch-cost``): vLLM's warm-up runs each capture size eagerly
before capturing it, so the kernel that a CUDA graph will bake in is checked there (that call still returns
vLLM's result). A mismatch hands the shape's bucket to vLLM's GEMM for the rest of the process
(``self-check-mismatch``).
"""

import functools
from typing import Optional

import torch
from torch import Tensor

from infera_ops.linear_hipblaslt import launch, policy
from infera_ops.linear_hipblaslt.policy import Table
from infera_ops.linear_hipblaslt.spec import SPEC
from infera_vllm import coverage, seams, self_check
from infera_vllm.platform import interpreter_off
from infera_vllm.spec import Decline
from infera_vllm.switches import op_value


def _table(family: str):
    try:
        found = policy.load(family)
    except policy.TableError as exc:
        return None, Decline("bad-tuning", str(exc))
    if found is None:
        return None, Decline("not-tuned", f"no tuning table for {family}: run `infera-vllm tune linear --model CONFIG` "
                                          "on that GPU (or set INFERA_LINEAR_TUNING)")
    return found, None


def check(ctx) -> Decline | None:
    return interpreter_off(ctx.env.gpu_family, "vLLM's CPU GEMM") or _table(ctx.env.gpu_family or "unknown")[1]


def activate(ctx) -> Decline | None:
    """Installs the seam; the plugin calls it only once ``check(ctx)`` passed."""
    found, _ = _table(ctx.env.gpu_family or "unknown")
    install(ctx.spec.name, found, cpu=ctx.env.gpu_family == "cpu")
    ctx.note = f"{len(found)} tuned shapes ({found.source})"
    # which shapes go to infera::linear is decided while Dynamo traces: another table is another graph
    ctx.compile_key = found.digest()
    return None


def plan(site) -> Decline | None:
    """Would the op take this linear layer (``doctor --model``)? Tokens are not known here: a tuned shape
    is taken, and its buckets decide per call."""
    if site.attrs.get("lm_head"):
        return Decline("lm-head", "the LM head calls vLLM's GEMM through its own reference; counted, not served")
    from infera_vllm.platform import detect_gpu_family

    found, decline = _table(detect_gpu_family()[0] or "unknown")
    if decline is not None:
        return decline
    if found.buckets(site.attrs["n"], site.attrs["k"], site.attrs.get("dtype", "bfloat16"), False) is None:
        return Decline("untuned", f"N={site.attrs['n']} K={site.attrs['k']} is not in {found.source}")
    return None


DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16"}
# vLLM's GEMM serves these by design (measured or unmeasured), not for lack of capability: route "handover"
HANDOVERS = ("untuned", "above-table", "default-faster", "eager-launch-cost", "lm-head", "user-linear-backend")

_state: dict = {"table": None, "count": None, "eager": False, "vllm_gemm": None, "check": None}


def _tokens(x: Tensor) -> int:
    return x.numel() // x.shape[-1] if x.shape[-1] else 0


@torch.library.custom_op("infera::linear", mutates_args=())
def linear_op(x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    """A tuned shape: the bucket for this call's token count decides (real tensors here, never symbolic)."""
    m = _tokens(x)
    capturing = x.is_cuda and torch.cuda.is_current_stream_capturing()
    buckets = _state["table"].buckets(weight.shape[0], weight.shape[1], DTYPES[x.dtype], bias is not None)
    bucket = Table.choose(buckets, m)
    if bucket is None:
        reason = "above-table"
    elif bucket.choice != "triton":
        reason = "default-faster"
    elif not capturing and not _state["eager"]:
        reason = "eager-launch-cost"  # Triton's Python launch costs more host time than cuBLAS's (docs)
    else:
        reason = None
    check: self_check.Checker = _state["check"]
    kernel_serves = reason is None or reason == "eager-launch-cost"  # now, or once captured in a CUDA graph
    key = f"{weight.shape[0]}x{weight.shape[1]} {coverage.bucket_of(m)}"
    if kernel_serves and check.declined(key):
        reason, kernel_serves = self_check.MISMATCH, False
    if kernel_serves and check.wants(key, capturing):
        ours = launch.skinny_linear(x, weight, bias, bucket.config)
        check.perturb(ours)
        with check.timed(key):
            theirs = _state["vllm_gemm"](None, x, weight, bias)
        if not check.judge(key, ours, theirs, (m, weight.shape[0], weight.shape[1])):
            reason = self_check.MISMATCH
        _state["count"](reason, m, "call")
        return ours if reason is None else theirs
    _state["count"](reason, m, "plan" if capturing else "call")
    if reason is None:
        out = launch.skinny_linear(x, weight, bias, bucket.config)
        check.perturb(out)
        return out
    return _state["vllm_gemm"](None, x, weight, bias)


@linear_op.register_fake
def _linear_fake(x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def static_reason(x: Tensor, weight: Tensor, bias: Optional[Tensor], allow_cpu: bool) -> Optional[str]:
    """Why a linear call cannot or should not reach ``infera::linear``, from static facts only; None: it can."""
    if weight.dim() != 2 or weight.numel() == 0:
        return "weight-replaced"  # vLLM's CPU path moves the weight into its own packed GEMM after loading
    if x.dtype not in DTYPES or weight.dtype != x.dtype or (bias is not None and bias.dtype != x.dtype):
        return "dtype"
    if x.device.type != "cuda" and not (allow_cpu and x.device.type == "cpu"):
        return "device"
    if weight.stride(-1) != 1 or x.stride(-1) != 1:
        return "layout"
    if _state["table"].buckets(weight.shape[0], weight.shape[1], DTYPES[x.dtype], bias is not None) is None:
        return "untuned"
    return None


def _make_gemm(vllm_gemm, allow_cpu: bool):
    def infera_gemm(layer, x, weight, bias=None):
        reason = static_reason(x, weight, bias, allow_cpu)
        if reason is None:
            return torch.ops.infera.linear(x, weight, bias)
        if not torch.compiler.is_compiling():
            _state["count"](reason, _tokens(x), "call")
        return vllm_gemm(layer, x, weight, bias)

    return infera_gemm


def _wrap_dispatch(original, ours: tuple, platform_gemm):
    """``ours``: ((vLLM's GEMM, its wrapped version), ...); ``platform_gemm``: the wrapped version of what the
    argument-less call returns on this platform. 0.24/0.26 call the dispatcher without arguments on every
    linear call, inside Dynamo's trace: that path returns the precomputed function and runs nothing else."""

    @functools.wraps(original)  # inspect.signature still shows vLLM's parameters (the spec's symbol check)
    def dispatch_unquantized_gemm(*args, **kwargs):
        if not args and not kwargs:
            return platform_gemm
        chosen = original(*args, **kwargs)  # 0.32: once per layer, at construction, with --linear-backend
        for vllm_gemm, gemm in ours:
            if chosen is vllm_gemm:
                return gemm
        if not torch.compiler.is_compiling():  # a GEMM backend the user asked for (--linear-backend): theirs
            _state["count"]("user-linear-backend", None, "plan")
        return chosen

    return dispatch_unquantized_gemm


def _wrap_lm_head(original):
    @functools.wraps(original)
    def dispatch_unquantized_gemm(*args, **kwargs):
        chosen = original(*args, **kwargs)

        def lm_head_gemm(layer, x, weight, bias=None):
            if not torch.compiler.is_compiling():
                _state["count"]("lm-head", _tokens(x), "call")
            return chosen(layer, x, weight, bias)

        return lm_head_gemm

    return dispatch_unquantized_gemm


def _layerless(vllm_gemm, utils):
    """vLLM's GEMM for calls a tuned shape hands back from inside ``infera::linear``, where the layer is not
    known: on CUDA vLLM's default is ``F.linear`` itself, on ROCm its GEMM ignores the layer; the CPU build's
    calls the layer's packed GEMM, so in CPU validation runs these calls take ``F.linear`` (same maths)."""
    if vllm_gemm is getattr(utils, "rocm_unquantized_gemm", None):
        return vllm_gemm
    return lambda layer, x, weight, bias: torch.nn.functional.linear(x, weight, bias)


def install(op_name: str, table: Table, cpu: bool) -> None:
    """Wrap vLLM's dispatch in both modules through :mod:`infera_vllm.seams`, once per process (a forked
    child already has it, with the records)."""
    import vllm.model_executor.layers.linear as linear_mod
    import vllm.model_executor.layers.utils as utils
    import vllm.model_executor.layers.vocab_parallel_embedding as vocab

    if seams.changes(op_name):
        return
    _state.update(table=table, count=coverage.CallCounts(op_name, HANDOVERS),
                  eager=op_value(SPEC, "INFERA_LINEAR_EAGER"), check=self_check.Checker(op_name, SPEC.self_check_bound))
    vllm_gemms = [getattr(utils, name) for name in ("default_unquantized_gemm", "rocm_unquantized_gemm",
                                                     "cpu_unquantized_gemm") if hasattr(utils, name)]
    platform_default = linear_mod.dispatch_unquantized_gemm()
    _state["vllm_gemm"] = _layerless(platform_default, utils)
    ours = tuple((fn, _make_gemm(fn, allow_cpu=cpu)) for fn in vllm_gemms)
    platform_gemm = (next((gemm for fn, gemm in ours if fn is platform_default), None)
                     or _make_gemm(platform_default, cpu))
    seams.wrap(op_name, linear_mod, "dispatch_unquantized_gemm",
               lambda original: _wrap_dispatch(original, ours, platform_gemm))
    seams.wrap(op_name, vocab, "dispatch_unquantized_gemm", _wrap_lm_head)
