"""The vLLM side of infera-moe-decode, and how it is installed: an out-of-tree ``UnquantizedFusedMoEMethod``
whose experts class is vLLM's own with ``apply`` taking the calls the policy allows (policy.py) and passing the
rest to the parent, so routing, top-k, prepare/finalize, weight loading and the ``moe_forward`` op stay vLLM's.

Declines at startup, with its reason: on the CPU without ``TRITON_INTERPRET=1`` (``triton-interpreter-off``)
or before vLLM 0.32 (``cpu-monolithic``: the CPU path has no experts class to extend); a GPU family
without a tuning file (``not-tuned``) unless ``INFERA_MOE_DECODE_MAX_TOKENS`` is set; an unreadable
tuning file or switch (``bad-tuning``). The plugin imports this module only once the spec's checks passed (it
imports torch and vLLM).

- CUDA/ROCm: only where vLLM itself chose its Triton experts (``UnquantizedMoeBackend.TRITON``, the sm90
  default) and the user did not pick a MoE backend; the parent is ``TritonExperts``, so every call the
  policy hands over runs exactly what vLLM would have run. Elsewhere the layer keeps vLLM's choice and the
  report counts it (``vllm-backend-<name>``, ``user-moe-backend``).
- CPU (vLLM 0.32, Triton interpreter, validation only): the parent is vLLM's chosen CPU experts class,
  which prepacks the weights after loading; the kernel keeps the unpacked ``[E, 2I, H]`` / ``[E, H, I]``
  tensors (twice the expert memory: fine for tests, not for serving). Under Dynamo (vLLM's CPU path traces
  into the experts) the parent serves.

Self-check (docs/self-check.md; ``INFERA_MOE_DECODE_CHECK_REFERENCE``): by default vLLM's own experts on
the CPU build, and on GPUs the fp32 reference of the same maths (reference.py, over the experts the call
routes to): vLLM's Triton experts compile a kernel for each token count's launch on their first call,
0.7-1.0 s per bucket on the H200, which would be the check's whole startup cost; the fp32 pass took
0.02-0.17 s per bucket there and is the stricter judge. On a mismatch vLLM's experts compute the call's
result either way.
"""

import torch
from vllm.model_executor.layers.fused_moe import UnquantizedFusedMoEMethod
from vllm.model_executor.layers.fused_moe.oracle.unquantized import UnquantizedMoeBackend

try:  # the FP8 seam's module, loaded with this one (vLLM >= 0.26: spec.FP8_SEAM)
    import vllm.model_executor.layers.fused_moe.oracle.fp8  # noqa: F401
except ImportError:
    pass

from infera_ops.moe_decode import launch, policy, reference
from infera_ops.moe_decode.policy import Tuning, shape_key
from infera_ops.moe_decode.spec import FP8_SEAM
from infera_vllm import coverage, seams, self_check
from infera_vllm.compat import version_in
from infera_vllm.platform import interpreter_off
from infera_vllm.spec import Decline
from infera_vllm.switches import op_value


def _tuning(ctx):
    try:
        found = policy.load(ctx.env.gpu_family or "unknown")
    except policy.TuningError as exc:
        return None, Decline("bad-tuning", str(exc))
    if found is None:
        return None, Decline("not-tuned", f"no tuning file for {ctx.env.gpu_family}: run "
                                          "benchmarks/tune_moe_decode.py on that GPU, "
                                          "or set INFERA_MOE_DECODE_MAX_TOKENS")
    return found, None


def check(ctx) -> Decline | None:
    off = interpreter_off(ctx.env.gpu_family, "vLLM's CPU experts")
    if off is not None:
        return off
    if ctx.env.gpu_family == "cpu":
        if ctx.env.vllm and not version_in(ctx.env.vllm, ">=0.32"):
            return Decline("cpu-monolithic",
                           f"vLLM {ctx.env.vllm}'s CPU MoE is monolithic (no experts class to extend)")
    return _tuning(ctx)[1]


def activate(ctx) -> Decline | None:
    """Installs the seam; the plugin calls it only once ``check(ctx)`` passed."""
    found, _ = _tuning(ctx)
    cpu = ctx.env.gpu_family == "cpu"
    against = op_value(ctx.spec, "INFERA_MOE_DECODE_CHECK_REFERENCE")
    install(ctx.spec.name, found, cpu=cpu, bound=ctx.spec.self_check_bound,
            check_against_vllm=against == "vllm" or (against == "auto" and cpu),
            fp8=not ctx.env.vllm or version_in(ctx.env.vllm, FP8_SEAM))
    ctx.note = f"serves up to {found.largest_served} tokens ({found.source})"
    return None


def plan(site) -> Decline | None:
    """Would the kernel take this MoE layer's calls (``doctor --model``, and which runs ``validate`` makes)?
    The layer's activation, biases and dtype decide it (``policy.site_decline``); per call, the token count
    and the other reasons of ``policy.decline_reason`` still apply."""
    why = policy.site_decline(site.attrs)
    return None if why is None else Decline(*why)


def _experts_class(base: type, tuned: Tuning, count: coverage.CallCounts, check: self_check.Checker,
                   keep_unpacked: bool, check_against_vllm: bool, fp8: bool = False,
                   parent_serves: bool = True) -> type:
    """vLLM's experts class ``base`` with ``apply`` taking the calls the policy allows. ``fp8``: FP8 weights
    (``base`` is ``TritonExperts`` built by vLLM's FP8 MoE method): the call's scales come from the experts'
    quant config, the launches from the tuning's FP8 section, and the activations reach ``apply``
    unquantized (``expects_unquantized_inputs``; the parent quantizes them itself for the calls it takes, as
    it does under LoRA with all2all) unless the tokens are dispatched across ranks (all2all: the dispatch
    stays FP8, its calls decline ``quantized-activations``) or the user chose the MoE backend.
    ``parent_serves`` False (the CPU build, whose Triton experts cannot run): the calls the kernel does
    not take run the fp32 reference, still counted under their reason."""

    class InferaDecodeExperts(base):
        if fp8:
            def __init__(self, moe_config, quant_config, *args, **kwargs):
                super().__init__(moe_config, quant_config, *args, **kwargs)
                # the user's choice of MoE backend leaves every call to it (where there is one)
                self._infera_off = parent_serves and getattr(moe_config, "moe_backend", "auto") not in ("auto", None)
                self._infera_defer = not (self._infera_off or moe_config.moe_parallel_config.use_all2all_kernels)
                if self._infera_off:
                    count("user-moe-backend", 1, "plan")

            @property
            def expects_unquantized_inputs(self) -> bool:
                return self._infera_defer or super().expects_unquantized_inputs

        if not parent_serves:
            @staticmethod
            def _supports_current_device() -> bool:
                return True

            @staticmethod
            def _supports_quant_scheme(weight_key, activation_key) -> bool:
                return getattr(weight_key, "dtype", None) in policy.FP8_DTYPES  # the kernels take every FP8 scheme

        def process_weights_after_loading(self, layer) -> None:
            if keep_unpacked:  # before the parent repacks them into its own layout
                self._infera_weights = (layer.w13_weight.data, layer.w2_weight.data)
            super().process_weights_after_loading(layer)

        def _infera_scales(self):
            """The FP8 weights' scales from the quant config vLLM built, made once (fixed after loading)."""
            if getattr(self, "_infera_scales_made", None) is None:
                block = self.block_shape
                self._infera_scales_made = launch.ExpertScales(self.w1_scale, self.w2_scale,
                                                               None if block is None else tuple(block))
            return self._infera_scales_made

        def _infera_fallback(self, args, scales, kw1, kw2):
            if parent_serves:
                return super().apply(*args)
            output, hidden_states, topk_weights, topk_ids, expert_map = args[0], args[1], args[4], args[5], args[8]
            output.copy_(reference.moe_experts_reference(hidden_states, kw1, kw2, topk_weights, topk_ids,
                                                         expert_map, scales))
            return None

        def apply(self, output, hidden_states, w1, w2, topk_weights, topk_ids, activation, global_num_experts,
                  expert_map, a1q_scale, a2_scale, workspace13, workspace2, expert_tokens_meta,
                  apply_router_weight_on_input):
            args = (output, hidden_states, w1, w2, topk_weights, topk_ids, activation, global_num_experts,
                    expert_map, a1q_scale, a2_scale, workspace13, workspace2, expert_tokens_meta,
                    apply_router_weight_on_input)
            kw1, kw2 = getattr(self, "_infera_weights", (w1, w2))
            scales = self._infera_scales() if fp8 else None
            if torch.compiler.is_compiling() or getattr(self, "_infera_off", False):
                # Dynamo traces this on the CPU path: no side effects there
                return self._infera_fallback(args, scales, kw1, kw2)
            tuning = tuned.fp8 if fp8 else tuned
            reason = policy.decline_reason(hidden_states, kw1, kw2, topk_ids, activation, expert_map,
                                           apply_router_weight_on_input, a1q_scale, getattr(self, "w1_bias", None),
                                           getattr(self, "w2_bias", None), None if tuning is None else tuning.serves,
                                           scales=scales)
            capturing = hidden_states.is_cuda and torch.cuda.is_current_stream_capturing()
            tokens = hidden_states.shape[0]
            bucket = coverage.bucket_of(tokens)
            if reason is None and check.declined(bucket):
                reason = self_check.MISMATCH
            checking = reason is None and check.wants(bucket, capturing)
            if not checking:
                count(reason, tokens, "plan" if capturing else "call")
            if reason is not None:
                return self._infera_fallback(args, scales, kw1, kw2)
            theirs = None
            if checking and check_against_vllm and parent_serves:  # before ours: `output` may share their workspaces
                theirs = torch.empty_like(output)
                with check.timed(bucket):
                    super().apply(theirs, *args[1:])
            elif checking:
                with check.timed(bucket):
                    theirs = reference.moe_experts_reference(hidden_states, kw1, kw2, topk_weights, topk_ids,
                                                             expert_map, scales)
            shape = shape_key(kw1.shape[0], kw1.shape[2], kw1.shape[1] // 2, topk_ids.shape[1])
            launch.moe_experts(hidden_states, kw1, kw2, topk_weights, topk_ids, out=output,
                               config=tuning.config_for(tokens, shape), expert_map=expert_map, scales=scales)
            check.perturb(output)
            if theirs is not None:  # on a mismatch the call returns vLLM's result (the reference's without one)
                agreed = check.judge(bucket, output, theirs, tuple(hidden_states.shape))
                if not agreed and check_against_vllm and parent_serves:
                    output.copy_(theirs)
                elif not agreed:
                    self._infera_fallback(args, scales, kw1, kw2)
                count(None if agreed else self_check.MISMATCH, tokens, "call")
            return None

    return InferaDecodeExperts


def install(op_name: str, tuned: Tuning, cpu: bool, bound: float, check_against_vllm: bool,
            fp8: bool = True) -> None:
    """Register the out-of-tree MoE method and wrap the FP8 oracle's experts classes through
    ``infera_vllm.seams`` (idempotent: a forked child already has them; another plugin's method in the slot is
    left there)."""
    from vllm.model_executor import custom_op

    count = coverage.CallCounts(op_name, policy.HANDOVERS)  # per-layer decisions at construction: at="plan"
    check = self_check.Checker(op_name, bound)
    if fp8:
        _install_fp8(op_name, tuned, cpu, count, check, check_against_vllm)
    slot = UnquantizedFusedMoEMethod.__name__  # the key register_oot files the class under
    if slot in custom_op.op_registry_oot:
        return

    class InferaDecodeMoEMethod(UnquantizedFusedMoEMethod):
        def __init__(self, moe):
            super().__init__(moe)
            if getattr(moe, "moe_backend", "auto") not in ("auto", None):
                count("user-moe-backend", 1, "plan")
                return
            if cpu:
                if self.experts_cls is None:  # vLLM < 0.32 on the CPU: monolithic, no experts class
                    count("cpu-monolithic", 1, "plan")
                    return
                self.experts_cls = _experts_class(self.experts_cls, tuned, count, check, keep_unpacked=True,
                                                  check_against_vllm=check_against_vllm)
                return
            if self.unquantized_backend != UnquantizedMoeBackend.TRITON:
                count(f"vllm-backend-{self.unquantized_backend.name.lower()}", 1, "plan")
                return
            self.experts_cls = _experts_class(self.experts_cls, tuned, count, check, keep_unpacked=False,
                                              check_against_vllm=check_against_vllm)

    seams.register(op_name, custom_op, "op_registry_oot", slot,
                   lambda: UnquantizedFusedMoEMethod.register_oot(InferaDecodeMoEMethod))


def _install_fp8(op_name: str, tuned: Tuning, cpu: bool, count: coverage.CallCounts, check: self_check.Checker,
                 check_against_vllm: bool) -> None:
    """FP8 experts: vLLM's FP8 MoE methods (``Fp8MoEMethod``, compressed-tensors' and ModelOpt's W8A8 FP8)
    choose their backend in ``oracle.fp8.select_fp8_moe_backend``, which asks ``backend_to_kernel_cls`` (a
    module global it looks up per call) for each backend's experts classes in its priority order. Wrapped
    there, the ``TRITON`` backend's ``TritonExperts`` becomes ours (a subclass, with the same support checks),
    so vLLM's order, weight loading, scale conversion and prepare/finalize stay as they are and only a layer
    vLLM gives its Triton experts gets the kernel. Where the CPU build's oracle reaches ``TRITON`` (its own
    CPU FP8 experts come first, for block FP8 on x86 CPUs with AMX tiles; elsewhere it has none and the
    oracle would return ``NONE``), ours claim the CPU device and run every call, the kernel's under the
    interpreter and the rest on the fp32 reference (validation only)."""
    from vllm.model_executor.layers.fused_moe.experts.triton_moe import TritonExperts
    from vllm.model_executor.layers.fused_moe.oracle import fp8 as fp8_oracle  # (imported with this module)

    experts = _experts_class(TritonExperts, tuned, count, check, keep_unpacked=False,
                             check_against_vllm=check_against_vllm, fp8=True, parent_serves=not cpu)
    triton = fp8_oracle.Fp8MoeBackend.TRITON

    def make(original):
        def backend_to_kernel_cls(backend):
            classes = original(backend)
            return [experts if k is TritonExperts else k for k in classes] if backend == triton else classes
        return backend_to_kernel_cls

    seams.wrap(op_name, fp8_oracle, "backend_to_kernel_cls", make)
