"""The numerics self-check: an op's kernel against vLLM's own implementation, on the live inputs.

The first time an op serves a shape bucket in a process, outside CUDA-graph capture (vLLM runs its
profile pass and each capture size eagerly before capturing it, so every bucket a graph will bake in is
seen eagerly first), the op also runs vLLM's implementation on the same inputs and hands both outputs to
:meth:`Checker.judge`. The error is ``max |ours - vLLM's| / max |vLLM's|``, judged against the bound the op
states in its spec (``OpSpec.self_check_bound``, from its kernel's measured bf16 error). On a mismatch the
bucket is declined for the rest of the process (the op counts its calls there as fallback
``self-check-mismatch``), the checked call returns vLLM's result, and one WARNING names the op, the
bucket, the shape and the error; in strict mode (``INFERA_VLLM_STRICT=1``) it raises instead.

``INFERA_VLLM_SELF_CHECK``: ``off``; ``first`` (the default, also any flag's on value); ``every`` eager call;
or a rate in (0, 1): also that share of later eager calls, so a kernel that goes wrong on other data is
caught too. A bucket first reached under graph capture is served unchecked and counted as such.
``INFERA_VLLM_SELF_CHECK_PERTURB=op`` scales that op's kernel outputs by 1.25 (:meth:`Checker.perturb`): a
deliberately wrong kernel for tests of this check.

The coverage report carries, per op and bucket: checked, passed, failed, the largest error seen, the
count of buckets captured unchecked, and the seconds spent running vLLM's implementation for the checks
(:meth:`Checker.timed`: the check's own cost, device work included; docs/report-format.md).
"""

from __future__ import annotations

import contextlib
import random
import time

from infera_vllm import coverage, log

MISMATCH = "self-check-mismatch"
PERTURB_SCALE = 1.25

_mode = "first"
_rate = 0.0
_perturb = ""
_strict = False


class SelfCheckMismatch(RuntimeError):
    """A kernel disagreed with vLLM's implementation beyond its bound, in strict mode."""


def configure(*, mode: str, rate: float, perturb: str, strict: bool) -> None:
    """Set once per process by the plugin from its switches."""
    global _mode, _rate, _perturb, _strict
    _mode, _rate, _perturb, _strict = mode, rate, perturb, strict


class Checker:
    """One op's self-check state in this process, per bucket (the coverage report's token-count buckets,
    or any string the op keys its shapes by)."""

    def __init__(self, op: str, bound: float):
        self.op, self.bound = op, float(bound)
        self._declined: set[str] = set()
        self._rng = random.Random(0)

    @property
    def enabled(self) -> bool:
        return _mode != "off" and self.bound > 0

    @property
    def idle(self) -> bool:
        """Nothing to check and nothing declined: an op may skip forming bucket keys on its hot path."""
        return not self.enabled and not self._declined

    def declined(self, bucket: str) -> bool:
        """Whether a mismatch has declined this bucket: the op hands such calls to vLLM."""
        return bucket in self._declined

    def wants(self, bucket: str, capturing: bool) -> bool:
        """Whether this call should be checked: the bucket's first eager call, or a sampled later one."""
        if not self.enabled or bucket in self._declined:
            return False
        entry = coverage.self_check_entry(self.op, bucket)
        if capturing:
            if not entry["checked"]:
                entry["unchecked_at_capture"] += 1
            return False
        if not entry["checked"]:
            return True
        return _rate > 0 and self._rng.random() < _rate

    @contextlib.contextmanager
    def timed(self, bucket: str):
        """Around the op's run of vLLM's implementation for a check: its wall time, device work included
        (synchronised at both ends on CUDA, so queued work before it is not billed to it), added to the
        bucket's ``seconds``. Only checked calls enter it: never under graph capture, nothing per call after."""
        _synchronize()
        start = time.perf_counter()
        try:
            yield
        finally:
            _synchronize()
            coverage.self_check_entry(self.op, bucket)["seconds"] += time.perf_counter() - start

    def judge(self, bucket: str, ours, theirs, shape: tuple = ()) -> bool:
        """Compare the kernel's output with vLLM's (tensors of one shape; any float dtype); record the
        result; on a mismatch decline the bucket and return False (the caller then returns ``theirs``).

        Both outputs all zero (vLLM's warm-up batches often give attention zero keys and values) prove
        nothing: such a call is not counted as checked, and the bucket's next eager call is checked instead
        (or, if a CUDA graph captures it first, it is counted as captured unchecked)."""
        ref = theirs.float()
        scale = float(ref.abs().max()) if ref.numel() else 0.0
        diff = float((ours.float() - ref).abs().max()) if ref.numel() else 0.0
        if scale == 0 and diff == 0:
            return True
        error = diff / scale if scale > 0 else float("inf")
        if error != error:  # NaN in either output
            error = float("inf")
        entry = coverage.self_check_entry(self.op, bucket)
        entry["checked"] += 1
        entry["max_error"] = max(entry["max_error"], error)
        if error <= self.bound:
            entry["passed"] += 1
            return True
        entry["failed"] += 1
        self._declined.add(bucket)
        message = (f"infera-vllm: {self.op} self-check failed for {bucket} tokens (shape {tuple(shape)}): "
                   f"error {error:.3g} > bound {self.bound:.3g}; vLLM's kernel serves that bucket from now on")
        if _strict:
            raise SelfCheckMismatch(message + " (INFERA_VLLM_STRICT=1)")
        log.warning("%s", message)
        return False

    def perturb(self, out) -> None:
        """Testing the check: scale the kernel's output in place when INFERA_VLLM_SELF_CHECK_PERTURB names
        this op (every call, checked or not, as a wrong kernel would be)."""
        if _perturb == self.op:
            out.mul_(PERTURB_SCALE)


def _synchronize() -> None:
    """Wait for the current CUDA device's queued work, where torch has CUDA in use (not on the CPU)."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
