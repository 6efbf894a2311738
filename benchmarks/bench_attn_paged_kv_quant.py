"""Paged decode attention over quantized KV caches: infera's decode kernel (``launch.paged_decode`` with
``KVScales``, bf16 queries) against what vLLM 0.26 runs on the same cache, its bf16 time and the stream floor
of the quantized bytes, per KV-cache dtype. The cases, calls and measurement are _attn_paged_cases.py's.

The cache of each dtype is laid out as vLLM 0.26's TRITON_ATTN allocates it (logical (num_blocks, Hkv, bs,
content) over the NHD physical layout): ``fp8`` (per tensor) as uint8 elements typed as the platform's fp8,
content 2·D, with checkpoint-like scales k_scale = v_scale = 1/80 (not 1); ``int8_per_token_head`` /
``fp8_per_token_head`` with each of K and V padded by one fp32 scale per (token, head) (content 2·(D + 4)),
scales carved out by vLLM's own ``TritonAttentionImpl._ensure_scale_caches``. Elements quantized from N(0, 1)
keys and values as vLLM's writes quantize them (reference.quantize_per_tensor / quantize_per_token_head).

Baselines, called as vLLM 0.26 calls them:
- ``fa3`` (fp8 per tensor only): FLASH_ATTN's FA3 call with the queries quantized to fp8 as its attention
  layer does (static per-tensor QuantFP8 at ``_q_scale`` = 1; the quantization itself, fused by torch.compile
  into the layer before, is not timed), ``q/k/v_descale`` the layer's scales expanded to (B, Hkv), the
  scheduler metadata for fp8 inputs.
- ``triton``: ``unified_attention`` as TRITON_ATTN calls it on the same cache: for ``fp8``, fp8 queries too (on
  CUDA its impl declares ``supports_quant_query_input``); per token-head, bf16 queries with ``kv_quant_mode``
  and the scale caches.
- ``bf16``: our kernel on the bf16 cache of the same shape (what switching the cache to 1 byte gains).

Every output is checked against ``reference.paged_decode_reference`` (fp32) over the dequantized cache:
ours within 2e-2; the baselines that quantize the queries within 10x that (their error is recorded). Each
row's ``stream_floor_us``: the same pages (data and inline scales) read by a plain streaming kernel in one
launch; ``ours_pct_stream_floor`` = it / our time. Cold L2 (KV copies cycled, >= 4x L2), CUDA-graph replays.
On the CPU, ``meta/infera-vllm/tests/test_bench_attn_paged.py`` builds these caches at tiny sizes and checks
our kernel on them under Triton's interpreter.

    python benchmarks/bench_attn_paged_kv_quant.py [--kv-dtypes fp8,int8_per_token_head] [--out DIR]
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
from _attn_paged_cases import (  # noqa: E402
    FA3_MAX_NUM_SPLITS,
    HEADS,
    REP_MS,
    ROWS,
    TOL,
    Impl,
    fa3_call_kwargs,
    fa3_scheduler_kwargs,
    fa3_status,
    import_ours,
    kv_copies_for,
    make_case,
    make_ours,
    make_triton,
    measure,
    triton_buffers,
    triton_call_kwargs,
)
from _results import (  # noqa: E402
    Column,
    Panel,
    Series,
    arguments,
    copy_ceiling_tb_s,
    describe_machine,
    figure,
    fmt,
    ratio,
    results_dir,
    stream_floor_us,
    table,
    write_json,
)

KV_DTYPES = ("fp8", "int8_per_token_head", "fp8_per_token_head")
CONFIGS = ("llama3-8b", "gpt-oss-20b", "smollm2")
PER_TENSOR_SCALE = 1 / 80  # k_scale = v_scale: N(0, 1) elements up to ~5.6 land within fp8 e4m3's 448
QUANT_QUERY_TOL = 10 * TOL  # baselines whose queries are fp8 (FA3, TRITON_ATTN on an fp8 cache)


def fp8_dtype():
    """vLLM's current_platform.fp8_dtype(): e4m3fnuz on gfx942, OCP e4m3 elsewhere."""
    gfx = torch.version.hip and "gfx94" in torch.cuda.get_device_properties(0).gcnArchName
    return torch.float8_e4m3fnuz if gfx else torch.float8_e4m3fn


def quantize_case(launch, reference, case, kind: str):
    """The case's bf16 caches (every copy) in ``kind``'s layout as TRITON_ATTN allocates and writes it: adds
    ``kv_dtype``, ``qkeys`` / ``qvalues`` (typed views, one per copy), ``scales`` (launch.KVScales per copy),
    ``qkvs`` (the packed tensors: what the stream floor reads) and ``qkv_bytes``."""
    from vllm.v1.attention.backends.triton_attn import TritonAttentionImpl

    fp8 = fp8_dtype()
    nb, Hkv, bs, _ = case.kvs[0].shape
    D = case.D
    per_token = kind.endswith("per_token_head")
    elem = torch.int8 if kind.startswith("int8") else torch.uint8
    content = 2 * (D + 4) if per_token else 2 * D
    case.kv_dtype, case.qkeys, case.qvalues, case.scales, case.qkvs = kind, [], [], [], []
    for k, v in zip(case.keys, case.values):
        kv = torch.zeros(nb, bs, Hkv, content, dtype=elem, device=case.device).permute(0, 2, 1, 3)
        if per_token:
            holder = types.SimpleNamespace(_k_scale_cache=None, _v_scale_cache=None)
            TritonAttentionImpl._ensure_scale_caches(holder, kv)  # vLLM's own views of the inline scales
            kq, vq = kv.transpose(1, 2).split(D + 4, dim=-1)
            kq, vq = kq[..., :D], vq[..., :D]
            if elem == torch.uint8:
                kq, vq = kq.view(fp8), vq.view(fp8)
            kq[...], holder._k_scale_cache[...] = reference.quantize_per_token_head(k, kq.dtype)
            vq[...], holder._v_scale_cache[...] = reference.quantize_per_token_head(v, vq.dtype)
            scales = launch.KVScales(launch.KV_PER_TOKEN_HEAD, holder._k_scale_cache, holder._v_scale_cache)
        else:
            kq, vq = (x.view(fp8) for x in kv.transpose(1, 2).split(D, dim=-1))
            s = torch.tensor(PER_TENSOR_SCALE, dtype=torch.float32, device=case.device)
            kq[...], vq[...] = reference.quantize_per_tensor(k, s, fp8), reference.quantize_per_tensor(v, s, fp8)
            scales = launch.KVScales(launch.KV_PER_TENSOR, s, s.clone())
        case.qkeys.append(kq)
        case.qvalues.append(vq)
        case.scales.append(scales)
        case.qkvs.append(kv)
    case.qkv_bytes = case.B * case.ctx * Hkv * content  # one byte an element
    return case


def quant_reference(reference, case):
    return reference.paged_decode_reference(case.q, case.qkeys[0], case.qvalues[0], case.block_table,
                                            case.seq_lens, case.scale, kv_scales=case.scales[0])


def make_ours_quant(launch, case) -> Impl:
    base = make_ours(launch, case)  # the device's defaults, slice cap and workspace as the backend has them
    splits, ws = base.info["split_cap"], launch.Workspace(case.B * base.info["split_cap"], case.Hq, case.D,
                                                           case.device, max_splits=base.info["split_cap"])
    out = torch.empty_like(case.q)

    def run(i: int) -> None:
        launch.paged_decode(case.q, case.qkeys[i], case.qvalues[i], case.block_table, case.seq_lens, case.scale,
                            out, num_splits=splits, workspace=ws, kv_scales=case.scales[i])

    return Impl(run, out, dict(base.info))


def quantized_query(case):
    """The queries as vLLM's attention layer quantizes them for an fp8 cache (static per tensor, q_scale 1)."""
    fp8 = fp8_dtype()
    big = torch.finfo(fp8).max
    return case.q.float().clamp(-big, big).to(fp8)


def descales(case):
    shape = (case.B, case.Hkv)
    one = torch.ones((), dtype=torch.float32, device=case.device)
    return one.expand(shape), case.scales[0].k.expand(shape), case.scales[0].v.expand(shape)


def make_fa3_fp8(case) -> Impl:
    from vllm.vllm_flash_attn import flash_attn_varlen_func, get_scheduler_metadata

    q8 = quantized_query(case)
    view = types.SimpleNamespace(**{**case.__dict__, "q": q8, "keys": case.qkeys, "values": case.qvalues})
    sched = get_scheduler_metadata(**fa3_scheduler_kwargs(view))
    out = torch.empty_like(case.q)
    scales = descales(case)

    def run(i: int) -> None:
        flash_attn_varlen_func(**fa3_call_kwargs(view, i, out, sched, scales, None))

    return Impl(run, out, {"num_splits": FA3_MAX_NUM_SPLITS, "queries": "fp8"})


def make_triton_quant(case) -> Impl:
    from vllm.v1.attention.ops.triton_unified_attention import unified_attention
    from vllm.v1.kv_cache_interface import KVQuantMode

    per_token = case.kv_dtype.endswith("per_token_head")
    mode = {"fp8": KVQuantMode.FP8_PER_TENSOR, "int8_per_token_head": KVQuantMode.INT8_PER_TOKEN_HEAD,
            "fp8_per_token_head": KVQuantMode.FP8_PER_TOKEN_HEAD}[case.kv_dtype]
    q = case.q if per_token else quantized_query(case)
    view = types.SimpleNamespace(**{**case.__dict__, "q": q, "keys": case.qkeys, "values": case.qvalues})
    buffers = triton_buffers(case)
    # TRITON_ATTN: per token-head no descales (the scale caches instead); per tensor the layer's q_scale and
    # its k/v scales expanded to (B, Hkv)
    q_descale, k_descale, v_descale = (None, None, None) if per_token else descales(case)
    out = torch.empty_like(case.q)

    def run(i: int) -> None:
        kw = triton_call_kwargs(view, i, out, buffers, k_descale, v_descale, None)
        kw.update(q_descale=None if per_token else q_descale[:1, :1].reshape(()), kv_quant_mode=mode)
        if per_token:
            kw.update(k_scale_cache=case.scales[i].k, v_scale_cache=case.scales[i].v)
        unified_attention(**kw)

    info = make_triton(case).info
    return Impl(run, out, {**info, "queries": "bf16" if per_token else "fp8"})


def bench_row(launch, reference, case, ceiling: float, copies: int, fa3_ok: bool) -> dict:
    ref = quant_reference(reference, case)
    loose = {"okfn": lambda e: e is not None and math.isfinite(e) and e < QUANT_QUERY_TOL}
    impls = {"ours": (lambda: make_ours_quant(launch, case), {}),
             "fa3": ((lambda: make_fa3_fp8(case)) if fa3_ok and case.kv_dtype == "fp8" else None, loose),
             "triton": (lambda: make_triton_quant(case), {} if case.kv_dtype.endswith("head") else loose)}
    # each page's K, V (and inline scales) of every head: one contiguous region, read as 2-byte words
    floor_calls = [[[(kv.view(torch.int16), case.block_table.flatten(), kv[0].numel() // 2)]] for kv in case.qkvs]
    row = {"config": case.config, "kv_dtype": case.kv_dtype, "Hq": case.Hq, "Hkv": case.Hkv, "D": case.D,
           "B": case.B, "ctx": case.ctx, "bytes": case.qkv_bytes, "kv_copies": copies,
           "floor_us": case.qkv_bytes / (ceiling * 1e12) * 1e6, "stream_floor_us": stream_floor_us(floor_calls)}
    for name, (factory, check) in impls.items():
        res = (measure(factory, case, ref, copies=copies, rep=REP_MS, **check) if factory else
               {"us": None, "err": None, "ok": None, "error": "unavailable", "info": {}})
        row.update({f"{name}_us": res["us"], f"{name}_err": res["err"], f"{name}_ok": res["ok"],
                    f"{name}_error": res["error"], f"{name}_info": res["info"]})
    bf16 = measure(lambda: make_ours(launch, case), case,
                   reference.paged_decode_reference(case.q, case.keys[0], case.values[0], case.block_table,
                                                    case.seq_lens, case.scale), copies=copies, rep=REP_MS)
    row["bf16_us"], row["bf16_ok"] = bf16["us"], bf16["ok"]
    row["speedup_vs_fa3"] = ratio(row["fa3_us"], row["ours_us"])
    row["speedup_vs_triton"] = ratio(row["triton_us"], row["ours_us"])
    row["speedup_vs_bf16"] = ratio(row["bf16_us"], row["ours_us"])
    row["ours_pct_stream_floor"] = None if row["ours_us"] is None else row["stream_floor_us"] / row["ours_us"] * 100
    return row


def print_table(rows: list) -> None:
    print(table(rows, [
        Column("config", "config", align="<"), Column("kv", "kv_dtype", align="<"), Column("B", "B"),
        Column("ctx", "ctx"), Column("ours us", "ours_us", ".1f"), Column("FA3 us", "fa3_us", ".1f"),
        Column("triton us", "triton_us", ".1f"), Column("bf16 us", "bf16_us", ".1f"),
        Column("floor us", "stream_floor_us", ".1f"), Column("%floor", "ours_pct_stream_floor", ".0f"),
        Column("xFA3", "speedup_vs_fa3", ".2f"), Column("xtriton", "speedup_vs_triton", ".2f"),
        Column("xbf16", "speedup_vs_bf16", ".2f"),
        Column("err ours/FA3/tri", lambda r: "/".join(fmt(r[f"{n}_err"], ".1e") for n in ("ours", "fa3", "triton")),
               align="<"),
        Column("ok", lambda r: "/".join({True: "ok", False: "BAD", None: "-"}[r[f"{n}_ok"]]
                                        for n in ("ours", "fa3", "triton")), align="<"),
    ], "x = other_us / ours_us (>1: ours faster); %floor = stream floor of the quantized pages / ours"))
    for r in rows:
        for n in ("ours", "fa3", "triton"):
            if r[f"{n}_ok"] is False:
                print(f"!!! {n} {r['config']} {r['kv_dtype']} B={r['B']} ctx={r['ctx']}: "
                      f"{r[f'{n}_error'] or 'err ' + fmt(r[f'{n}_err'], '.3e')}")


def plot(rows: list, path: str) -> None:
    panels = []
    for (config, kind) in dict.fromkeys((r["config"], r["kv_dtype"]) for r in rows):
        sel = [r for r in rows if (r["config"], r["kv_dtype"]) == (config, kind)]
        x = [f"B{r['B']}\n{r['ctx'] // 1024}k" for r in sel]
        names = [("ours", "infera"), ("fa3", "FA3 fp8 q (vLLM)"), ("triton", "vLLM Triton"), ("bf16", "infera bf16")]
        panels.append(Panel(f"{config} {kind}", x, "µs per call (log)", logy=True,
                            bars=[Series(label, [r[f"{n}_us"] for r in sel]) for n, label in names],
                            lines=[Series("stream floor of the quantized pages", [r["stream_floor_us"] for r in sel],
                                          "k:")]))
    figure(path, [panels[i:i + 3] for i in range(0, len(panels), 3)],
           "paged decode over quantized KV caches, block 16: infera (bf16 queries) vs vLLM 0.26 (CUDA-graph replays)")


def main() -> int:
    parser = arguments(__doc__)
    parser.add_argument("--kv-dtypes", default=",".join(KV_DTYPES), help="comma-separated, of " + ", ".join(KV_DTYPES))
    parser.add_argument("--configs", default=",".join(CONFIGS), help="head configurations, of " + ", ".join(HEADS))
    parser.add_argument("--rows", type=lambda v: tuple(tuple(int(x) for x in r.split(":")) for r in v.split(",")),
                        default=ROWS, help="B:ctx pairs (default: the bf16 decode table's)")
    parser.add_argument("--table", metavar="JSON", help="print the table of a results file and exit (no GPU)")
    args = parser.parse_args()
    if args.table:
        with open(args.table) as f:
            print_table(json.load(f)["rows"])
        return 0
    kinds = [k for k in args.kv_dtypes.split(",") if k]
    bad = [k for k in kinds if k not in KV_DTYPES] + [c for c in args.configs.split(",") if c not in HEADS]
    if bad:
        parser.error(f"unknown: {', '.join(bad)}")
    if not torch.cuda.is_available():
        print("bench_attn_paged_kv_quant: needs a CUDA GPU. Its CPU check: "
              "meta/infera-vllm/tests/test_bench_attn_paged.py", file=sys.stderr)
        return 1
    t0 = time.time()
    launch, reference, ours_from = import_ours()
    machine = describe_machine()
    fa3_ok, fa3_reason = fa3_status()
    ceiling = copy_ceiling_tb_s()
    print(f"ours from {ours_from}; FA3 {'available' if fa3_ok else fa3_reason}; copy ceiling {ceiling:.2f} TB/s",
          flush=True)
    rows = []
    for config in args.configs.split(","):
        Hq, Hkv, D = HEADS[config]
        for B, ctx in args.rows:
            copies = kv_copies_for(B, ctx, Hkv, D, True)
            case = make_case(config, Hq, Hkv, D, B, ctx, device=torch.device("cuda"), copies=copies)
            for kind in kinds:
                row = bench_row(launch, reference, quantize_case(launch, reference, case, kind), ceiling, copies,
                                fa3_ok)
                rows.append(row)
                print(f"{config:<12} {kind:<20} B={B:<4} ctx={ctx:<6} ours {fmt(row['ours_us'], '.1f')} us "
                      f"({fmt(row['ours_pct_stream_floor'], '.0f')}% floor) FA3 {fmt(row['fa3_us'], '.1f')} "
                      f"triton {fmt(row['triton_us'], '.1f')} bf16 {fmt(row['bf16_us'], '.1f')}", flush=True)
            del case
            torch.cuda.empty_cache()
    print_table(rows)
    out_dir = args.out or results_dir(machine)
    doc = {"benchmark": "bench_attn_paged_kv_quant", "machine": machine, "copy_ceiling_tb_s": ceiling,
           "ours_from": ours_from, "fa3_available": fa3_ok, "fa3_unavailable_reason": fa3_reason,
           "per_tensor_scale": PER_TENSOR_SCALE, "rows": rows, "wall_s": time.time() - t0}
    print("wrote", write_json(out_dir, "bench_attn_paged_kv_quant", doc))
    plot(rows, os.path.join(out_dir, "bench_attn_paged_kv_quant.png"))
    return 0 if all(r["ours_ok"] for r in rows) else 2


if __name__ == "__main__":
    sys.exit(main())
