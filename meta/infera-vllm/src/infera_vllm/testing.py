"""Checks every op wheel's tests share (test-only helpers; nothing here runs in vLLM)."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys

from infera_vllm.spec import ENTRY_POINT_GROUP, OpSpec

HEAVY = ("torch", "triton", "vllm")


def modules_imported_by(module: str) -> set[str]:
    """Top-level packages a fresh interpreter has loaded after ``import module``."""
    code = f"import json, sys; import {module}; print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def assert_import_light(module: str) -> None:
    heavy = modules_imported_by(module) & set(HEAVY)
    assert not heavy, f"importing {module} pulled in {sorted(heavy)}; spec modules must stay plain data"


def assert_advertised(spec: OpSpec) -> None:
    """The installed distribution advertises exactly this spec under its name in ``infera_vllm.ops``."""
    eps = [ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.name == spec.name]
    assert len(eps) == 1, f"expected one {ENTRY_POINT_GROUP} entry point named {spec.name!r}, found {eps}"
    assert eps[0].load() is spec
    assert eps[0].dist is not None and eps[0].dist.metadata["Name"] == spec.distribution
    requires = eps[0].dist.requires or []
    assert any(r.startswith("infera-vllm") for r in requires), f"{spec.distribution} must depend on infera-vllm"


class OpWheelContract:
    """Tests every op wheel passes against the real installed vLLM; subclass in the wheel's tests with
    ``spec`` and ``spec_module`` set (pytest collects the inherited ``test_*`` methods)."""

    spec: OpSpec
    spec_module: str
    expected_decline: str | None = None  # a placeholder op sets "not-implemented"

    def test_spec_module_is_import_light(self):
        assert_import_light(self.spec_module)

    def test_advertised_through_entry_point(self):
        assert_advertised(self.spec)

    def test_compatible_with_installed_vllm(self):
        from infera_vllm import compat

        env = compat.Environment.detect()
        assert compat.check(self.spec, env) is None, compat.check(self.spec, env)

    def test_activation_verdict(self):
        from infera_vllm import activation, compat, discovery
        from infera_vllm.switches import Switches

        (found,) = [f for f in discovery.discover() if f.name == self.spec.name]
        verdict = activation.evaluate(found, compat.Environment.detect(), Switches(allow=frozenset({self.spec.name})),
                                      install=False)
        if self.expected_decline is None:
            assert verdict.active, verdict.line()
        else:
            assert verdict.decline is not None and verdict.decline.code == self.expected_decline, verdict.line()


def run_script(script: str, *args: str, env: dict[str, str]) -> str:
    """Run a Python script in a fresh interpreter (vLLM spawns more processes from it), with ``env`` over this
    process's environment; its stdout, or an AssertionError carrying the failure's tail."""
    import os

    proc = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return proc.stdout


def result_json(stdout: str, tag: str = "RESULT"):
    """The JSON a script printed after ``tag`` on its last such line (vLLM may log after it)."""
    return json.loads(stdout.split(tag)[-1].splitlines()[0])


# --- Judging a bf16 run of a random-weight model -------------------------------------------------------------
#
# On random weights the logits hold near-ties, so two correct bf16 runs (vLLM's kernel, ours) can pick other
# tokens, and how far their log-probabilities drift apart depends on the machine's roundings. Neither run is
# the truth: the fp32 model is. So each run is judged against the same checkpoint evaluated in fp32
# (transformers, on the CPU) on that run's own tokens, and the plugin-on run must be no worse than vLLM's own
# bf16 run (plugin off) beyond twice its error plus one bf16 unit (2^-7, the spacing of bf16 at 1): the rule
# FlashAttention's tests use for a kernel against the framework's bf16 implementation. A broken kernel (a
# dropped router weight, a wrong activation, an expert's rows skipped) misses by orders of magnitude.

BF16_UNIT = 2.0 ** -7


def fp32_logprobs(checkpoint: str, sequences: list[list[int]]) -> list:
    """Per sequence, the fp32 log-softmax at every position (``[len, vocab]``) of the checkpoint's model."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    with torch.no_grad():
        return [torch.log_softmax(model(torch.tensor([seq])).logits[0].float(), dim=-1) for seq in sequences]


def run_error(run: dict, reference: list) -> dict:
    """How far one run is from the fp32 model on the run's own tokens. ``run``: ``prompts`` (token ids),
    ``steps`` ((token, log-prob[, [[token, log-prob], ...] of the step's top candidates]) per greedy step of
    each prompt) and, optionally, ``prompt_logprobs`` (the log-prob of each prompt token after the first,
    teacher-forced); ``reference[i]``: ``fp32_logprobs`` over prompt i followed by the run's tokens.

    Per generated step: the log-prob error |lp - lp_fp32| of the chosen token and of each listed candidate,
    and the chosen token's regret lp_fp32(fp32's best) - lp_fp32(chosen), 0 where the run picked fp32's argmax
    and small at a near-tie; per prompt position the log-prob error. Returns the largest over all of them,
    and where it is."""
    worst, where = 0.0, None
    for i, prompt in enumerate(run["prompts"]):
        for t, (token, lp, *top) in enumerate(run["steps"][i]):
            row = reference[i][len(prompt) + t - 1]
            err = max(abs(lp - float(row[token])), float(row.max() - row[token]),
                      *(abs(c_lp - float(row[c])) for c, c_lp in (top[0] if top else [])))
            if err > worst:
                worst, where = err, ("step", i, t)
        for j, lp in enumerate((run.get("prompt_logprobs") or [[]] * len(run["prompts"]))[i]):
            err = abs(lp - float(reference[i][j][prompt[j + 1]]))
            if err > worst:
                worst, where = err, ("prompt", i, j + 1)
    return {"error": worst, "at": where}


def assert_no_worse_than_vllm(checkpoint: str, on: dict, off: dict) -> dict:
    """The plugin-on run's error against fp32 (``run_error``) is at most 2x vLLM's own (plugin off) + one
    bf16 unit. Both runs as ``run_error`` takes them, on the same prompts."""
    assert on["prompts"] == off["prompts"]
    errors = {}
    for name, run in (("on", on), ("off", off)):
        ref = fp32_logprobs(checkpoint, [p + [step[0] for step in s]
                                         for p, s in zip(run["prompts"], run["steps"], strict=True)])
        errors[name] = run_error(run, ref)
    bound = 2 * errors["off"]["error"] + BF16_UNIT
    assert errors["on"]["error"] <= bound, (f"plugin on {errors['on']} vs fp32, bound {bound:.4f} "
                                            f"from plugin off {errors['off']}")
    return {**errors, "bound": bound}
