"""Which experts calls the decode kernel takes, and with which launch.

Which calls: plain checks on what vLLM passes to ``FusedMoEExpertsModular.apply`` (``decline_reason``); a
reason code for every call it does not take.

Launches: per-GPU-family tunables of the decode experts: which token counts the kernel serves (per expert shape)
and its blocks. One JSON file per family in ``tuning/`` (written by ``benchmarks/tune_moe_decode.py`` on that
GPU); ``INFERA_MOE_DECODE_TUNING=path.json`` replaces it, ``INFERA_MOE_DECODE_MAX_TOKENS=N`` serves every
call of up to N tokens whatever the file says. A family without a file is not tuned: the op declines at
startup unless the threshold is given.

File format::

    {"max_tokens": N,                                   # served up to N tokens for shapes not in "served"
     "served": {"E128-H2048-I768-K8": [1, 2, 4, 8, 16]}, # measured token bounds the kernel won at, per shape
     "config": {...LaunchConfig...}, "by_tokens": {"2": {...}, "8": {...}},
     "by_shape": {"E8-H4096-I14336-K2": {"2": {...}}}}     # optional: where one expert shape is faster so

A shape in ``served`` (experts E, hidden H, intermediate I, top-k K) takes a call of M tokens when the
smallest measured bound >= M is listed (the measured bounds: ``"measured"``, default 1, 2, 4, 8, 16); M
above every measured bound is handed over. ``by_tokens`` (optional)
maps an upper token bound to the blocks used up to it (the smallest bound >= M wins), ``config`` serves the
rest. ``by_shape`` (optional) holds, per expert shape, the launch at single measured bounds where that
shape's fastest launch is not the one best over all shapes: a call of M tokens takes it only when M's own
measured bound (the smallest >= M) is listed there, else ``by_tokens`` as for every shape. (It is not a
range: a shape's launch won at 2 tokens says nothing of 1.)

FP8 experts have a section of their own, ``"fp8": {...}`` in the same format (its launches in the forms that
read scaled weights, ``launch.SCALED_FORMS``): FP8 weights halve the bytes, so where the kernel wins and with
which blocks is measured apart. A file without it leaves FP8 layers to vLLM (``fp8-not-tuned``) unless
``INFERA_MOE_DECODE_MAX_TOKENS`` is set, which serves FP8 calls up to N tokens at ``default_config``.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from infera_ops.moe_decode import launch
from infera_ops.moe_decode.launch import SCALED_FORMS, LaunchConfig
from infera_ops.moe_decode.spec import SPEC
from infera_vllm import tuning_files
from infera_vllm.switches import SwitchError, op_value

DTYPES = (torch.bfloat16, torch.float16)
FP8_DTYPES = tuple(getattr(torch, name) for name in ("float8_e4m3fn", "float8_e4m3fnuz") if hasattr(torch, name))
# by design (vLLM's kernel is the better one there), not a capability limit: coverage route "handover"
HANDOVERS = ("tokens-above-threshold",)


def decline_reason(hidden_states, w1, w2, topk_ids, activation, expert_map, apply_router_weight_on_input,
                   a1q_scale, w1_bias, w2_bias, serves: Callable[[int, int, int, int, int], bool] | None,
                   scales=None) -> str | None:
    """None when the kernel can serve the call, else a reason code. What the kernel cannot compute (dtype,
    activation, bias, layout, ...) is checked before the token count, so a call the kernel could never take
    is counted under that reason, not handed over as too large. ``serves(M, E, H, I, top-k)``: whether the
    family's tuning takes M tokens for this expert shape (``Tuning.serves``; None: FP8 weights on a family
    whose tuning has no FP8 section); an expert map (expert parallel) is served: the kernel skips the experts
    held elsewhere. ``scales`` (``launch.ExpertScales``): FP8 weights' scales, whose layout must be one the
    kernels read; the activations arrive unquantized (``a1q_scale`` None) either way."""
    if hidden_states.dim() != 2 or topk_ids.dim() != 2 or w1.dim() != 3 or w2.dim() != 3:
        return "layout"
    if hidden_states.dtype not in DTYPES:
        return "dtype"
    if a1q_scale is not None:
        return "quantized-activations"
    if scales is not None:
        if w1.dtype not in FP8_DTYPES or w2.dtype != w1.dtype:
            return "weight-dtype"
        try:
            for scale, rows, cols in ((scales.w13, w1.shape[1], w1.shape[2]), (scales.w2, w2.shape[1], w2.shape[2])):
                grid = launch.scale_grid(scale, w1.shape[0], rows, cols, scales.block)
                launch.chunk_within(16, grid[5], grid[3])
        except ValueError:
            return "weight-scales"
    elif w1.dtype != hidden_states.dtype or w2.dtype != hidden_states.dtype:
        return "weight-dtype"
    if str(getattr(activation, "value", activation)).lower() != "silu":
        return "activation"
    if expert_map is not None and (expert_map.dim() != 1 or expert_map.device != hidden_states.device):
        return "expert-map"
    if apply_router_weight_on_input:
        return "router-weight-on-input"
    if w1_bias is not None or w2_bias is not None:
        return "bias"
    E, two_i, H = w1.shape
    if (w2.shape != (E, H, two_i // 2) or hidden_states.shape[1] != H or w1.stride(-1) != 1 or w2.stride(-1) != 1
            or hidden_states.stride(-1) != 1):
        return "layout"
    if hidden_states.device.type not in ("cuda", "cpu"):
        return "device"
    if serves is None:
        return "fp8-not-tuned"
    if not serves(hidden_states.shape[0], E, H, two_i // 2, topk_ids.shape[1]):
        return "tokens-above-threshold"
    return None


def site_decline(attrs: dict) -> tuple[str, str] | None:
    """What ``decline_reason`` would answer for every call of a MoE layer described by its model-site
    attributes (``infera_vllm.model_sites``: dtype, activation, bias), as (reason, detail); None when the
    layer's calls are the kernel's to take, up to the tuning's token counts."""
    dtype = str(attrs.get("dtype", "bfloat16")).replace("torch.", "")
    if dtype not in ("bfloat16", "float16"):
        return "dtype", f"{dtype}: the kernel takes bf16/fp16 experts"
    activation = str(attrs.get("activation", "silu")).lower()
    if activation != "silu":
        return "activation", f"{activation}: the kernel computes SiLU(gate) * up"
    if attrs.get("bias"):
        return "bias", "expert biases: the kernel has none"
    return None


class TuningError(ValueError):
    """A tuning file or switch that cannot be used (the op declines with this message)."""


def _switch(name: str):
    """A switch spec.py declares, by the rules the plugin checked it with before the op's check."""
    try:
        return op_value(SPEC, name)
    except SwitchError as exc:
        raise TuningError(str(exc)) from exc


MEASURED = (1, 2, 4, 8, 16)


def shape_key(experts: int, hidden: int, inter: int, topk: int) -> str:
    return f"E{experts}-H{hidden}-I{inter}-K{topk}"


@dataclass
class Tuning:
    max_tokens: int
    config: LaunchConfig = field(default_factory=LaunchConfig)
    source: str = "defaults"
    by_tokens: tuple = ()  # ((upper token bound, LaunchConfig), ...) ascending
    served: dict = field(default_factory=dict)  # shape_key -> frozenset of served bounds
    measured: tuple = MEASURED
    by_shape: dict = field(default_factory=dict)  # shape_key -> ((upper token bound, LaunchConfig), ...)
    fp8: "Tuning | None" = None  # FP8 experts' own (the file's "fp8" section, or the threshold's defaults)

    @property
    def largest_served(self) -> int:
        """The most tokens any shape is served at (the op's startup note)."""
        return max([self.max_tokens, *(max(b, default=0) for b in self.served.values())])

    def serves(self, tokens: int, experts: int, hidden: int, inter: int, topk: int) -> bool:
        bounds = self.served.get(shape_key(experts, hidden, inter, topk))
        if bounds is None:
            return tokens <= self.max_tokens
        bound = next((b for b in self.measured if b >= tokens), None)
        return bound is not None and bound in bounds

    def config_for(self, tokens: int, shape: str | None = None) -> LaunchConfig:
        """The launch for ``tokens`` tokens, of the expert shape ``shape`` (:func:`shape_key`) if given: the
        shape's own launch at the measured bound of ``tokens``, else ``by_tokens``'s, else ``config``."""
        bound = next((b for b in self.measured if b >= tokens), None)
        for at, config in self.by_shape.get(shape, ()):
            if at == bound:
                return config
        for bound, config in self.by_tokens:
            if tokens <= bound:
                return config
        return self.config


def default_config(family: str, form: str = "split", fp8: bool = False) -> LaunchConfig:
    """The launch a family gets without a ``config`` in its file (``INFERA_MOE_DECODE_MAX_TOKENS`` on an
    untuned family), chosen so that nothing spills (tests/test_moe_decode_compile.py): the defaults; two
    pipeline stages on AMD GPUs, whose 64 KB of LDS (gfx942, RDNA) three stages of the 64-wide tiles overflow
    (72 KB); on RDNA3 (gfx11xx) also a 64-deep H chunk, as the 128-deep one spills VGPRs in its WMMA layout;
    on RDNA4 (gfx12xx) the persistent form, which holds both projections' tiles, with 32-wide I blocks (64
    spill one VGPR). The stream form cuts its work into small units so that one program per SM gets an
    even share at decode sizes (16 columns of I, 16 of H) and streams them in 256-deep H chunks over 4
    stages (128-deep over 2 on AMD GPUs). FP8 weights (``fp8``; the split forms) on RDNA (gfx11xx, gfx12xx):
    32-deep H chunks and 64-deep I chunks, as the weights' conversion to bf16 beside deeper tiles spills
    VGPRs there (narrower I blocks spill more)."""
    if fp8 and family.startswith(("gfx11", "gfx12")):
        return LaunchConfig(form=form, block_h=32, block_k=64, num_stages=2)
    if form == "stream":
        amd = family.startswith("gfx")
        return LaunchConfig(form=form, block_i=16, block_h=128 if amd else 256, block_n=16, block_k=128,
                            programs_per_sm=1, num_stages=2 if amd else 4)
    if family.startswith("gfx11"):
        return LaunchConfig(form=form, block_h=64, num_stages=2)
    if family.startswith("gfx12") and form == "persistent":
        return LaunchConfig(form=form, block_i=32, num_stages=2)
    return LaunchConfig(form=form, num_stages=2 if family.startswith("gfx") else 3)


def _read(text: str, source: str) -> tuple[dict, str]:
    doc = tuning_files.document(text, source, TuningError)
    if not isinstance(doc, dict) or not isinstance(doc.get("max_tokens"), int) or doc["max_tokens"] < 0:
        raise TuningError(f"{source}: needs an integer 'max_tokens' >= 0")
    return doc, source


def load(family: str) -> Tuning | None:
    """The family's tuning (None: not tuned and no threshold given)."""
    found = tuning_files.load("infera_ops.moe_decode", family, "INFERA_MOE_DECODE_TUNING",
                              _switch("INFERA_MOE_DECODE_TUNING"), _read, TuningError)
    doc, source = found or (None, None)
    threshold = _switch("INFERA_MOE_DECODE_MAX_TOKENS")  # None: not set
    if doc is None and threshold is None:
        return None
    doc = doc or {}
    tuned = _tuning(doc, source, family, threshold)
    fp8 = doc.get("fp8")
    if fp8 is not None and (not isinstance(fp8, dict) or not isinstance(fp8.get("max_tokens"), int)):
        raise TuningError(f"{source}: 'fp8' needs an integer 'max_tokens' like the file itself")
    if fp8 is not None or threshold is not None:
        tuned.fp8 = _tuning(fp8 or {}, source, family, threshold, forms=SCALED_FORMS)
    return tuned


def fp8_launches(family: str) -> list[tuple[str, LaunchConfig]]:
    """The FP8 experts' launches on ``family`` (its compile test): the packaged file's FP8 section, else
    ``default_config``'s split and split_sum forms (what ``INFERA_MOE_DECODE_MAX_TOKENS`` serves)."""
    found = tuning_files.load("infera_ops.moe_decode", family, "", None, _read, TuningError)
    fp8 = (found[0] if found else {}).get("fp8")
    if fp8 is None:
        return [(f"defaults {form}", default_config(family, form, fp8=True)) for form in SCALED_FORMS]
    tuned = _tuning(fp8, found[1], family, None, forms=SCALED_FORMS)
    launches = [(f"M<={bound}", cfg) for bound, cfg in tuned.by_tokens] + [("config", tuned.config)]
    return launches + [(f"{shape} M<={bound}", cfg) for shape, entries in tuned.by_shape.items()
                       for bound, cfg in entries]


def _tuning(doc: dict, source, family: str, threshold, forms=None) -> Tuning:
    """One section of a tuning file (the file itself, or its "fp8" section, whose launches must be of
    ``forms``)."""
    try:
        config = LaunchConfig(**doc["config"]) if "config" in doc else default_config(family, fp8=forms is not None)
        by_tokens = tuple(sorted((int(bound), LaunchConfig(**blocks))
                                 for bound, blocks in doc.get("by_tokens", {}).items()))
        by_shape = {str(key): tuple(sorted((int(bound), LaunchConfig(**blocks)) for bound, blocks in entries.items()))
                    for key, entries in doc.get("by_shape", {}).items()}
    except (TypeError, ValueError, AttributeError) as exc:
        raise TuningError(f"{source}: bad 'config', 'by_tokens' or 'by_shape' ({exc})") from exc
    try:
        measured = tuple(sorted(int(b) for b in doc.get("measured", MEASURED)))
        served = {} if threshold is not None else {str(key): frozenset(int(b) for b in bounds)
                                 for key, bounds in doc.get("served", {}).items()}
    except (TypeError, ValueError, AttributeError) as exc:
        raise TuningError(f"{source}: bad 'served' or 'measured' ({exc})") from exc
    if forms is not None:
        wrong = {c.form for c in (config, *(c for _, c in by_tokens), *(c for e in by_shape.values() for _, c in e))}
        if wrong - set(forms):
            raise TuningError(f"{source}: FP8 launches in form {', '.join(sorted(wrong - set(forms)))}: the forms "
                              f"that read FP8 weights are {', '.join(forms)}")
    max_tokens = threshold if threshold is not None else doc.get("max_tokens", 0)
    return Tuning(max_tokens, config, source or "INFERA_MOE_DECODE_MAX_TOKENS", by_tokens, served, measured,
                  by_shape if threshold is None else {})
