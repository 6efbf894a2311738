"""Decode MoE experts: infera's kernels vs vLLM's ``fused_experts`` (Triton), bf16, random routing, one GPU.
``--fp8 block`` (128 x 128 weight blocks, vLLM's per-token-group FP8 activations) or ``--fp8 tensor`` (a
scale per expert and projection, dynamic per-tensor FP8 activations): FP8 weights, vLLM's Triton experts
called with the FP8 quant config vLLM's FP8 MoE method builds (the activation quantization inside the call),
ours with the same weights and scales and bf16 activations, each form that reads FP8 weights timed
(``infera_forms_us``; the tuning's FP8 section, or ``policy.default_config``'s blocks); ``infera_err`` and
``vllm_err``: each one's error against the fp32 reference over the dequantized weights.

Bytes = distinct experts read x 3·I·H x the weight's bytes (the weight traffic; activations and block scales,
1/16384 of FP8 blocks, are negligible at decode).
Timed from CUDA-graph replays (``do_bench_cudagraph``), as vLLM runs decode, with a cold L2: each replay
runs ROTATIONS calls whose routings use different experts (as consecutive layers read different weights),
and the time per call is the replay's over ROTATIONS. Copy and read ceilings measured in the same run
(``infera_pct_copy``, ``infera_pct_read``), and each row's traffic floor: the same experts' weights
read by a streaming kernel with nothing else to do, replayed the same way, W13's then W2's in two dependent
launches as the split forms read them (``floor_two_launch_us``) and in one (``floor_one_launch_us``);
``infera_pct_floor`` = the two-launch floor / the kernel's time: what is left to gain without removing a
launch. Per kernel (``infera_kernels_us``, ``vllm_kernels_us``: each kernel's GPU time per call from
torch.profiler on eager calls, no launch gaps) beside the floors of each projection's weights read alone
(``floor_w13_us``, ``floor_w2_us``), to place a loss in one kernel or the other. Blocks from the family's
tuning (``tuning/<family>.json`` or ``INFERA_MOE_DECODE_TUNING``); ``served`` says whether the op takes that
(dims, M) in serving (else it hands over to vLLM: the production ratio there is 1.0 by construction). Prints a
table, writes JSON + a plot under ``results/<gpu>/`` (or ``--out``).

    python benchmarks/bench_moe_decode.py [--dims qwen3-30b-a3b,mixtral] [--tokens 1,2,4] [--fp8 block]
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from _results import (  # noqa: E402
    Column,
    Panel,
    Series,
    arguments,
    copy_ceiling_tb_s,
    describe_machine,
    figure,
    graph_us,
    kernel_times_us,
    read_ceiling_tb_s,
    results_dir,
    stream_floor_us,
    table,
    write_json,
)

DIMS = {  # name: (E, H, I, top-k)
    "qwen3-30b-a3b": (128, 2048, 768, 8),
    "deepseek-v3": (256, 7168, 2048, 8),
    "mixtral": (8, 4096, 14336, 2),
    "deepseek-v2-lite": (64, 2048, 1408, 6),  # many small experts; its shared expert runs outside the op
    "phi-3.5-moe": (16, 4096, 6400, 2),
}
MS = (1, 2, 4, 8, 16, 32, 64)
ROTATIONS = 4


class Case:
    """One (dims, M): weights, ROTATIONS routings over different experts, and both implementations."""

    def __init__(self, weights: tuple, dims: str, M: int, gen: torch.Generator):
        E, H, I, K = DIMS[dims]
        self.dims, self.M, (self.w13, self.w2, self.scales) = dims, M, weights
        self.x = [torch.randn(M, H, generator=gen).to("cuda", torch.bfloat16) for _ in range(ROTATIONS)]
        self.routing = []
        perm = torch.randperm(E, generator=gen)
        for r in range(ROTATIONS):  # token m of rotation r picks from a window of experts shifted by r·K
            logits = torch.randn(M, E, generator=gen)
            weights, ids = logits.softmax(-1).topk(K)
            ids = perm[(ids + r * K) % E]
            self.routing.append((weights.to("cuda"), ids.to("cuda", torch.int32)))
        # distinct experts per call, averaged over the rotations (each replay runs all of them)
        self.distinct = sum(int(torch.unique(ids).numel()) for _, ids in self.routing) / ROTATIONS
        self.bytes = int(self.distinct * 3 * I * H * self.w13.element_size())

    def run(self, fn, r=0):
        weights, ids = self.routing[r]
        return fn(self.x[r], self.w13, self.w2, weights, ids)

    def floor_calls(self, launches: int | str) -> list:
        """Each rotation's weight reads as _results.stream_floor_us takes them: the distinct experts' W13
        regions then their W2 regions, in two launches or in one; or one projection's alone ("w13", "w2")."""
        _, H, I, _ = DIMS[self.dims]
        calls = []
        for _, ids in self.routing:
            used = torch.unique(ids)
            w13, w2 = (self.w13, used, 2 * I * H), (self.w2, used, H * I)
            calls.append({2: [[w13], [w2]], 1: [[w13, w2]], "w13": [[w13]], "w2": [[w2]]}[launches])
        return calls

    def kernels_us(self, fn) -> dict | None:
        """Each kernel's GPU time per call of ``fn`` over the rotations (_results.kernel_times_us)."""
        return kernel_times_us(lambda: [self.run(fn, r) for r in range(ROTATIONS)], calls=ROTATIONS)

    def time_us(self, fn) -> float:
        """µs per call, the rotations replayed in turn from a CUDA graph (_results.graph_us)."""
        return graph_us([lambda r=r: self.run(fn, r) for r in range(ROTATIONS)])


def vllm_experts(scales=None):
    """vLLM's Triton experts; with ``scales`` (launch.ExpertScales) FP8 weights under the quant config of
    vLLM's FP8 MoE method (fp8 w8a8: activations quantized per 128-group for blocks, per tensor else)."""
    from vllm.model_executor.layers.fused_moe.config import fp8_w8a8_moe_quant_config
    from vllm.model_executor.layers.fused_moe.fused_moe import fused_experts

    if scales is None:
        return lambda x, w13, w2, weights, ids: fused_experts(x, w13, w2, weights, ids)
    config = fp8_w8a8_moe_quant_config(w1_scale=scales.w13, w2_scale=scales.w2,
                                       block_shape=None if scales.block is None else list(scales.block))
    return lambda x, w13, w2, weights, ids: fused_experts(x, w13, w2, weights, ids, quant_config=config)


BLOCK = (128, 128)


def make_weights(dims: str, fp8: str | None = None):
    """Random expert weights of that dims, made on the GPU (DeepSeek-V3's are 22 GB in bf16): bf16, or FP8
    (``fp8`` "block" or "tensor") with their fp32 scales (launch.ExpertScales), quantized one expert at a time
    with amax scaling."""
    from infera_ops.moe_decode.launch import ExpertScales

    E, H, I, _ = DIMS[dims]
    if fp8 is None:
        w13 = torch.empty(E, 2 * I, H, dtype=torch.bfloat16, device="cuda").normal_().div_(H**0.5)
        w2 = torch.empty(E, H, I, dtype=torch.bfloat16, device="cuda").normal_().div_(I**0.5)
        return w13, w2, None
    from vllm.platforms import current_platform

    dtype = current_platform.fp8_dtype()
    out, scales = [], []
    for rows, cols in ((2 * I, H), (H, I)):
        w = torch.empty(E, rows, cols, dtype=dtype, device="cuda")
        bn, bk = BLOCK if fp8 == "block" else (rows, cols)
        s = torch.empty(E, rows // bn, cols // bk, dtype=torch.float32, device="cuda")
        for e in range(E):
            x = torch.randn(rows, cols, device="cuda").div_(cols**0.5).view(rows // bn, bn, cols // bk, bk)
            s[e] = x.abs().amax(dim=(1, 3)) / torch.finfo(dtype).max
            w[e] = (x / s[e][:, None, :, None]).view(rows, cols).to(dtype)
        out.append(w)
        scales.append(s if fp8 == "block" else s.view(E))
    return out[0], out[1], ExpertScales(scales[0], scales[1], BLOCK if fp8 == "block" else None)


def rel_err(got, want) -> float:
    return ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()


def main() -> int:
    parser = arguments(__doc__)
    parser.add_argument("--dims", default=",".join(DIMS), help="comma-separated names from DIMS")
    parser.add_argument("--tokens", default=",".join(map(str, MS)), help="comma-separated token counts M")
    parser.add_argument("--fp8", choices=("block", "tensor"), help="FP8 weights with these scales")
    parser.add_argument("--table", metavar="JSON", help="print the table of a results file and exit (no GPU)")
    args = parser.parse_args()
    if args.table:
        with open(args.table) as f:
            doc = json.load(f)
        print_table(doc["rows"], doc["copy_ceiling_tb_s"], doc["read_ceiling_tb_s"])
        return 0
    from infera_ops.moe_decode import launch, policy
    from infera_ops.moe_decode.launch import LaunchConfig
    from infera_ops.moe_decode.reference import moe_experts_reference
    from infera_vllm.platform import detect_gpu_family

    machine = describe_machine()
    family = detect_gpu_family()[0]
    tuned = policy.load(family)
    if args.fp8:
        tuned = tuned and tuned.fp8
    print(f"blocks: {tuned.source if tuned else 'defaults (no tuning file)'}", flush=True)
    copy, read = copy_ceiling_tb_s(), read_ceiling_tb_s()
    print(f"copy ceiling {copy:.2f} TB/s, read ceiling {read:.2f} TB/s", flush=True)
    rows, gen = [], torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    for name in args.dims.split(","):
        E, H, I, K = DIMS[name]
        weights = make_weights(name, args.fp8)
        scales = weights[2]
        theirs = vllm_experts(scales)
        for M in map(int, args.tokens.split(",")):
            case = Case(weights, name, M, gen)
            if tuned:
                cfgs = [tuned.config_for(M, policy.shape_key(E, H, I, K))]
            elif args.fp8:
                cfgs = [policy.default_config(family, form, fp8=True) for form in launch.SCALED_FORMS]
            else:
                cfgs = [LaunchConfig()]

            def infera(cfg):
                return lambda x, w13, w2, weights, ids: launch.moe_experts(x, w13, w2, weights, ids, config=cfg,
                                                                            scales=scales)

            forms_us = {c.form: case.time_us(infera(c)) for c in cfgs}
            cfg = next(c for c in cfgs if c.form == min(forms_us, key=forms_us.get))
            ours = infera(cfg)
            err, vllm_err = 0.0, None  # vllm_err: not measured
            if args.fp8 or M <= 2:  # the fp32 pass over every routed expert: slow at large M, once per row
                ref = moe_experts_reference(case.x[0], case.w13, case.w2, *case.routing[0], scales=scales)
                err, vllm_err = rel_err(case.run(ours), ref), rel_err(case.run(theirs), ref)
            if not args.fp8:  # bf16: ours and vLLM's compute the same maths (FP8: vLLM quantizes activations)
                err = max(rel_err(case.run(ours), case.run(theirs)), err)
            t_ours, t_vllm = forms_us[cfg.form], case.time_us(theirs)
            floor2, floor1 = stream_floor_us(case.floor_calls(2)), stream_floor_us(case.floor_calls(1))
            floor13, floor_w2 = stream_floor_us(case.floor_calls("w13")), stream_floor_us(case.floor_calls("w2"))
            k_ours, k_vllm = case.kernels_us(ours), case.kernels_us(theirs)
            tbs = case.bytes / 1e6  # MB / us = TB/s
            row = {"dims": name, "E": E, "H": H, "I": I, "topk": K, "M": M, "distinct_experts": case.distinct,
                   "bytes": case.bytes, "infera_us": t_ours, "vllm_us": t_vllm, "speedup": t_vllm / t_ours,
                   "infera_pct_copy": tbs / t_ours / copy * 100, "infera_pct_read": tbs / t_ours / read * 100,
                   "vllm_pct_copy": tbs / t_vllm / copy * 100, "vllm_pct_read": tbs / t_vllm / read * 100,
                   "floor_two_launch_us": floor2, "floor_one_launch_us": floor1,
                   "infera_pct_floor": floor2 / t_ours * 100, "vllm_pct_floor": floor2 / t_vllm * 100,
                   "floor_w13_us": floor13, "floor_w2_us": floor_w2, "infera_kernels_us": k_ours,
                   "vllm_kernels_us": k_vllm,
                   "max_rel_err": err, "infera_err": err, "vllm_err": vllm_err, "infera_forms_us": forms_us,
                   "served": bool(tuned and tuned.serves(M, E, H, I, K)), "config": cfg.as_dict()}
            rows.append(row)
            print(f"{name:<17} M={M:<3} experts={case.distinct:<5.1f} infera {t_ours:8.1f} us "
                  f"({row['infera_pct_read']:5.1f}% read) vllm {t_vllm:8.1f} us ({row['vllm_pct_read']:5.1f}%) "
                  f"x{row['speedup']:.2f} floor {floor2:.1f} us in 2 launches, {floor1:.1f} in 1 "
                  f"({row['infera_pct_floor']:.0f}%) rel.err {err:.1e}"
                  f"{'' if vllm_err is None else f' (vllm {vllm_err:.1e} vs fp32)'}"
                  f"{'' if row['served'] else ' (handed over in serving)'}",
                  flush=True)
            print(f"    kernels (W13 alone {floor13:.1f} us, W2 alone {floor_w2:.1f}): infera "
                  + ", ".join(f"{k[:40]} {v:.1f}" for k, v in (k_ours or {}).items())
                  + " | vllm " + ", ".join(f"{k[:40]} {v:.1f}" for k, v in (k_vllm or {}).items()), flush=True)
        del weights
        torch.cuda.empty_cache()
    out_dir = args.out or results_dir(machine)
    stem = "bench_moe_decode" + (f"_fp8_{args.fp8}" if args.fp8 else "")
    path = write_json(out_dir, stem, {"benchmark": stem, "machine": machine, "fp8": args.fp8,
                                                    "copy_ceiling_tb_s": copy, "read_ceiling_tb_s": read,
                                                    "rotations": ROTATIONS,
                                                    "tuning": tuned.source if tuned else None, "rows": rows})
    print_table(rows, copy, read)
    plot(rows, read, path.replace(".json", ".png"))
    print(f"wrote {path}")
    return 0


def print_table(rows: list, copy: float, read: float) -> None:
    print()
    print(table(rows, [
        Column("dims", "dims", align="<"), Column("M", "M"), Column("experts", "distinct_experts", ".1f"),
        Column("infera us", "infera_us", ".1f"), Column("vllm us", "vllm_us", ".1f"), Column("x", "speedup", ".2f"),
        Column("infera%read", "infera_pct_read", ".1f"), Column("vllm%read", "vllm_pct_read", ".1f"),
        Column("infera%copy", "infera_pct_copy", ".1f"), Column("floor2 us", "floor_two_launch_us", ".1f"),
        Column("floor1 us", "floor_one_launch_us", ".1f"), Column("%floor2", "infera_pct_floor", ".0f"),
        Column("rel.err", "max_rel_err", ".1e"), Column("served", lambda r: "yes" if r["served"] else "handed over",
                                                        align="<"),
    ], f"copy ceiling {copy:.2f} TB/s, read ceiling {read:.2f} TB/s; % = weight bytes / time / ceiling; x = vllm_us "
       f"/ infera_us; floor2/floor1 = the same weights streamed in 2 / 1 launches; %floor2 = floor2 / infera_us"))


def plot(rows, read, path):
    """Per dims: weight bytes / time over M for ours, vLLM's fused_experts and the two-launch traffic floor,
    against the read ceiling."""
    panels = []
    for name in dict.fromkeys(r["dims"] for r in rows):
        sel = [r for r in rows if r["dims"] == name]
        panels.append(Panel(name, [r["M"] for r in sel], "weight bytes / time (TB/s)", xlabel="M (tokens)", logx=True,
                            ceiling=(read, f"read ceiling {read:.2f} TB/s"),
                            lines=[Series(label, [r["bytes"] / (r[key] * 1e-6) / 1e12 for r in sel])
                                   for key, label in (("infera_us", "infera"), ("vllm_us", "vLLM fused_experts"),
                                                      ("floor_two_launch_us", "traffic floor, 2 launches"))]))
    figure(path, [panels])


if __name__ == "__main__":
    raise SystemExit(main())
