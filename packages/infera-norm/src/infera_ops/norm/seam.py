"""The vLLM side of infera-norm, and how it is installed: the ``infera`` provider of vLLM's IR ops ``rms_norm``
and ``fused_add_rms_norm``.

Registered whenever the checks pass, so ``--ir-op-priority '{"rms_norm": ["infera"], ...}'`` can pick it.
It goes first in vLLM's default priority on the GPU families where that was measured not to lose end to
end (``FIRST_BY_DEFAULT``, empty today: docs/operators/norm.md), or anywhere the user names the op in
``INFERA_VLLM_OPS``; a user's own ``--ir-op-priority`` still wins (vLLM puts it before the defaults). The
plugin imports this module only once the spec's checks passed (it imports torch and vLLM).

The IR implementations are
thin calls into torch custom ops in the ``infera`` namespace with fake implementations, because under
Inductor vLLM's lowering pass traces the chosen provider into the graph. The ops are registered through
vLLM's ``direct_register_custom_op`` (a schema and one kernel for every device), as vLLM registers its own:
a call then costs about 1.9 us of dispatch, against about 20 for ``torch.library.custom_op``'s wrapper
(this project's CPU machine: ``benchmarks/norm_dispatch_host.py``), which a compiled graph run outside CUDA
graphs pays per call.
``fused_add_rms_norm`` is in place, as vLLM's ``vllm_c`` is: the normalised output overwrites ``x`` and the
sum overwrites the residual, so the working set is two tensors, not four (this decided the M = 1024 rows
measured in docs/operators/norm.md).

Per-call decisions are counted in the coverage report: ``at="call"`` for real tensors, ``at="trace"`` when
vLLM decides on fake tensors while compiling (then the graph runs it any number of times); while Dynamo
itself traces the provider (vLLM's CPU path) nothing is counted, to keep side effects out of the graph.
Decisions on fake tensors never read a symbolic size as a number: that would specialise the token
dimension of vLLM's compiled graph and fail its dynamic-shape guards (measured on vLLM 0.26: the engine
did not start).

Three hand-overs to vLLM's own kernels, counted as route ``handover`` with a reason (by design, so
``INFERA_VLLM_STRICT=1`` lets them through):
- ``eager-launch-cost``: a call on real tensors outside CUDA-graph capture, i.e. run eagerly, where
  Triton's Python launch costs 50-150 us of host time per call on the H200's host and vllm_c's C++ op
  ~5-10 us (benchmarks/results/h200/norm-final/: eager rows 0.05-0.5x up to 4096 tokens, 1.0-1.15x only
  at 16384 with H >= 2048). Decided in two places: in ``supports_args`` when vLLM runs without compiling
  (vLLM's next provider serves), and inside the ops at run time when a compiled graph runs outside CUDA
  graphs (a prefill past the capture sizes: the provider was baked in while compiling, and the call goes
  to vllm_c's op where vLLM built it). So by default the kernel serves what CUDA graphs capture, whose
  replays cost no host time; ``INFERA_NORM_EAGER_MIN_TOKENS=N`` serves eager calls from N tokens on (0:
  all). A call the self-check wants to look at runs the kernel (checked) whatever its size.
- ``per-head-fusion`` (declined in ``supports_args`` while compiling): an ``rms_norm`` of a per-head view
  (3-D or more, last dim <= 256: Qwen3's q/k norms over ``[tokens, heads, head_dim]``). vLLM's native
  provider traced there lets Inductor fuse both norms with the q/k/v split before them and the RoPE after
  them into one kernel; as an opaque op it leaves three (two norms, then RoPE re-reading q and k). Seen in
  the Inductor code vLLM 0.32's CPU build generates for a Qwen3 model (docs/operators/norm.md); on the
  H200 Qwen3-8B lost 3.2% at batch 1 with the norms opaque, about what two extra launches x 36 layers cost
  per step. ``INFERA_NORM_PER_HEAD_KERNEL=1`` keeps them on the kernel (for measuring).
- ``vllm-c-faster`` (inside ``infera::fused_add_rms_norm_``, at run time, so also inside compiled
  graphs): the in-place fused add with rows of >= 4096 at 512-2048 tokens, where vllm_c's kernel was
  faster with the inputs in L2 (0.83-0.95x, benchmarks/results/h200/norm-tune/); the call goes to
  ``torch.ops._C`` when vLLM built it.
"""

from typing import Optional

import torch
from torch import Tensor
from vllm import ir
from vllm.utils.torch_utils import direct_register_custom_op

from infera_ops.norm import launch, policy
from infera_ops.norm.spec import SPEC
from infera_vllm import coverage, seams, self_check
from infera_vllm.platform import interpreter_off
from infera_vllm.spec import Decline

# Families where infera goes first without being named. Not sm90: the kernels beat vllm_c under CUDA graphs
# and SmolLM2 end to end was 1.000x, but a Qwen3-8B-shaped model lost 3-8% end to end (H200, vLLM 0.26,
# benchmarks/results/h200/norm-qwen3/), so on sm90 the op must be named to go first.
FIRST_BY_DEFAULT: tuple[str, ...] = ()


def check(ctx) -> Decline | None:
    return interpreter_off(ctx.env.gpu_family, "vLLM's CPU kernels")


def activate(ctx) -> Decline | None:
    """Installs the seam; the plugin calls it only once ``check(ctx)`` passed."""
    install(ctx.spec.name, allow_cpu=ctx.env.gpu_family == "cpu")
    # what the provider bakes into compiled graphs beyond its version: vLLM's compile cache keys on it
    ctx.compile_key = "per-head:" + ("kernel" if ctx.switch("INFERA_NORM_PER_HEAD_KERNEL") else "vllm")
    named = ctx.switches.requested_explicitly(ctx.spec.name)
    validated = ctx.env.gpu_family in FIRST_BY_DEFAULT
    if named or validated:
        put_first_in_default_priority(ctx.spec.name)
        why = "named in INFERA_VLLM_OPS" if named else f"measured on {ctx.env.gpu_family}"
        ctx.note = f"first in the default IR priority ({why})"
    else:
        ctx.note = "registered, default priority unchanged"
    return None


PROVIDER = "infera"


def _vllm_c(name: str):
    """vLLM's own C++ op ``torch.ops._C.<name>`` (``rms_norm``: out, x, weight, epsilon; ``fused_add_rms_norm``:
    in place on x and residual), or None where this build has none."""
    try:
        import vllm._custom_ops  # noqa: F401  (loads vllm._C, which registers torch.ops._C)

        return getattr(torch.ops._C, name).default
    except (ImportError, AttributeError, RuntimeError):
        return None


def _vllm_c_fused_add():
    """vLLM's own in-place fused add (``torch.ops._C.fused_add_rms_norm``), or None where not built."""
    return _vllm_c("fused_add_rms_norm")


_self_check: dict = {"check": None}  # set by install(): the op's infera_vllm.self_check.Checker


def _native(op_name: str):
    """vLLM's own implementation of the IR op (``native``): what the self-check compares with."""
    return getattr(ir.ops, op_name).impls["native"].impl_fn


def _checked_bucket(x: Tensor):
    """(checker, bucket, capturing) for a call the self-check may look at (checker None while Dynamo traces;
    with the check off it neither declines nor wants a call, and perturbs where a test asks it to);
    ``capturing``: the call is being captured into a CUDA graph."""
    capturing = x.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    check = _self_check["check"]
    if check is None or torch.compiler.is_compiling():
        return None, "", capturing
    return check, coverage.bucket_of(x.numel() // max(1, x.shape[-1])), capturing


# set by install(): the counter, vLLM's C++ ops (None where not built or not used), and the token count from
# which eager calls run the kernel
_handover = {"count": None, "vllm_c": None, "vllm_c_rms": None, "eager_min": 0}


def _eager_to_vllm_c(x: Tensor, capturing: bool, checking: bool) -> bool:
    """Whether this call, run eagerly (real tensors, no CUDA-graph capture: a compiled graph run past the
    capture sizes), goes to vllm_c instead of Triton's launch (``eager-launch-cost``): below
    ``INFERA_NORM_EAGER_MIN_TOKENS`` tokens, unless the self-check is about to look at the kernel."""
    return not capturing and not checking and x.numel() // x.shape[-1] < _handover["eager_min"]


def _same_dtype(x: Tensor, weight: Optional[Tensor]) -> bool:
    """Whether vllm_c's ops could take the call: they read the weight in x's dtype, so an fp32 weight
    (GemmaRMSNorm's ``1 + w``, which vLLM's own vllm_c provider declines for that reason, leaving it to the
    native one) stays on the kernel, whose multiply is vLLM's for either weight dtype."""
    return weight is None or weight.dtype == x.dtype


def _rms_norm_op(x: Tensor, weight: Optional[Tensor], epsilon: float) -> Tensor:
    check, bucket, capturing = _checked_bucket(x)
    if check is not None and check.declined(bucket):  # a self-check mismatch: vLLM's implementation serves
        _handover["count"](self_check.MISMATCH, x)
        return _native("rms_norm")(x, weight, epsilon)
    checking = check is not None and check.wants(bucket, capturing)
    vllm_c = _handover["vllm_c_rms"] if _same_dtype(x, weight) else None
    if vllm_c is not None and weight is not None and x.is_contiguous() and _eager_to_vllm_c(x, capturing, checking):
        _handover["count"]("eager-launch-cost", x)
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        vllm_c(out.view(-1, x.shape[-1]), x.view(-1, x.shape[-1]), weight, epsilon)
        return out
    out = launch.rms_norm(x, weight, epsilon)
    if check is not None:
        check.perturb(out)
        if checking:
            with check.timed(bucket):
                theirs = _native("rms_norm")(x, weight, epsilon)
            if not check.judge(bucket, out, theirs, tuple(x.shape)):
                return theirs
    return out


def _rms_norm_fake(x: Tensor, weight: Optional[Tensor], epsilon: float) -> Tensor:
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _fused_add_rms_norm_op(x: Tensor, residual: Tensor, weight: Optional[Tensor], epsilon: float) -> None:
    vllm_c = _handover["vllm_c"] if _same_dtype(x, weight) else None
    if vllm_c is not None and policy.vllm_c_hands_over(x.numel() // x.shape[-1], x.shape[-1]):
        _handover["count"]("vllm-c-faster", x)
        vllm_c(x.view(-1, x.shape[-1]), residual.view(-1, x.shape[-1]), weight, epsilon)
        return
    check, bucket, capturing = _checked_bucket(x)
    if check is not None and check.declined(bucket):
        _handover["count"](self_check.MISMATCH, x)
        out, res = _native("fused_add_rms_norm")(x.clone(), residual.clone(), weight, epsilon)
        x.copy_(out), residual.copy_(res)
        return
    checking = check is not None and check.wants(bucket, capturing)
    if vllm_c is not None and _eager_to_vllm_c(x, capturing, checking):
        _handover["count"]("eager-launch-cost", x)
        vllm_c(x.view(-1, x.shape[-1]), residual.view(-1, x.shape[-1]), weight, epsilon)
        return
    inputs = (x.clone(), residual.clone()) if checking else None
    launch.fused_add_rms_norm(x, residual, weight, epsilon, out=x, residual_out=residual)
    if check is not None:
        check.perturb(x)
        if inputs is not None:  # judged on the normalised output; on a mismatch both outputs are vLLM's
            with check.timed(bucket):
                out, res = _native("fused_add_rms_norm")(*inputs, weight, epsilon)
            if not check.judge(bucket, x, out, tuple(x.shape)):
                x.copy_(out), residual.copy_(res)


def _fused_add_rms_norm_fake(x: Tensor, residual: Tensor, weight: Optional[Tensor], epsilon: float) -> None:
    return None


_LIBRARY = torch.library.Library("infera", "FRAGMENT")  # the ops live as long as it does: the process
direct_register_custom_op("rms_norm", _rms_norm_op, mutates_args=[], fake_impl=_rms_norm_fake, target_lib=_LIBRARY,
                          dispatch_key="CompositeExplicitAutograd")
direct_register_custom_op("fused_add_rms_norm_", _fused_add_rms_norm_op, mutates_args=["x", "residual"],
                          fake_impl=_fused_add_rms_norm_fake, target_lib=_LIBRARY,
                          dispatch_key="CompositeExplicitAutograd")


class _Counts:
    """The op's call counts from a tensor: nothing while Dynamo traces, ``at="trace"`` on fake tensors."""

    def __init__(self, op_name: str):
        self.counts = coverage.CallCounts(op_name, policy.HANDOVERS)

    def __call__(self, reason: Optional[str], x: Tensor) -> None:
        if torch.compiler.is_compiling():
            return
        at = "trace" if isinstance(x, torch._subclasses.FakeTensor) else "call"
        self.counts(reason, policy.concrete_tokens(x), at)


def install(op_name: str, allow_cpu: bool) -> None:
    """Register the provider with vLLM's IR through ``infera_vllm.seams`` (idempotent: a forked child already
    has it)."""
    if PROVIDER in ir.ops.rms_norm.impls:
        return
    count = _Counts(op_name)
    _self_check["check"] = self_check.Checker(op_name, SPEC.self_check_bound)
    # On the CPU (interpreter, validation only) neither hand-over applies: launch cost is not the question
    # there, and the tests must reach the kernel.
    eager_min = 0 if allow_cpu else policy.eager_min_tokens()
    per_head_to_vllm = not policy.per_head_kernel()  # on the CPU too: its compiled graphs fuse the same way
    _handover["count"] = count
    _handover["vllm_c"] = None if allow_cpu else _vllm_c_fused_add()
    _handover["vllm_c_rms"] = None if allow_cpu else _vllm_c("rms_norm")
    _handover["eager_min"] = eager_min

    def rms_supports(x, weight, epsilon, variance_size=None):
        reason = policy.decline_reason(x, weight, variance_size, allow_cpu=allow_cpu, eager_min_tokens=eager_min,
                                per_head_to_vllm=per_head_to_vllm)
        count(reason, x)
        return reason is None

    def fused_supports(x, x_residual, weight, epsilon, variance_size=None):
        reason = policy.decline_reason(x, weight, variance_size, x_residual, allow_cpu=allow_cpu,
                                       eager_min_tokens=eager_min)
        count(reason, x)
        return reason is None

    # vLLM requires the native signature exactly, annotations included.
    def rms_norm(x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None) -> Tensor:
        return torch.ops.infera.rms_norm(x, weight, epsilon)

    def fused_add_rms_norm(x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float,
                           variance_size: int | None = None) -> tuple[Tensor, Tensor]:
        torch.ops.infera.fused_add_rms_norm_(x, x_residual, weight, epsilon)
        return x, x_residual

    rms = ir.ops.rms_norm.register_impl(PROVIDER, supports_args=rms_supports, supported=True)
    fused = ir.ops.fused_add_rms_norm.register_impl(PROVIDER, supports_args=fused_supports, supported=True,
                                                    inplace=True)
    seams.register(op_name, ir.ops.rms_norm, "impls", PROVIDER, lambda: rms(rms_norm))
    seams.register(op_name, ir.ops.fused_add_rms_norm, "impls", PROVIDER, lambda: fused(fused_add_rms_norm))


def put_first_in_default_priority(op_name: str) -> None:
    """Make ``infera`` the first provider of both ops in the platform's default priority (the platform class's
    ``get_default_ir_op_priority`` wrapped through ``infera_vllm.seams``, once per process).

    vLLM appends the platform defaults after a user's ``--ir-op-priority``, so an explicit user choice
    still wins. Only done when the user named the op in INFERA_VLLM_OPS: end to end, Inductor's fused
    native code or vllm_c may still be faster, and validation decides per family before it becomes a default.
    """
    from vllm.platforms import current_platform

    def first(original):
        def get_default_ir_op_priority(klass, vllm_config):
            priority = original.__func__(klass, vllm_config)
            for field in ("rms_norm", "fused_add_rms_norm"):
                current = [p for p in getattr(priority, field) if p != PROVIDER]
                setattr(priority, field, [PROVIDER, *current])
            return priority

        return classmethod(get_default_ir_op_priority)

    seams.wrap(op_name, type(current_platform), "get_default_ir_op_priority", first)
