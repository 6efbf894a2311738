"""Paged attention, bf16, ragged prefill: infera's Triton kernel vs vLLM 0.26's FA3 and Triton
(``launch.paged_prefill``); bench_attn_paged.py runs it after its decode table, or alone:

    python benchmarks/bench_attn_paged_prefill.py [--out DIR]

Heads llama3-8b (32/8 x 128) and smollm2 (9/3 x 64), block 16, ragged batches (a) plain prefill 1 x 4096, 8 x 1024 and
32 x 256 new tokens; (b) chunked prefill 4 requests x 512 new tokens after 7680 cached ones; (c) mixed: 63
decode requests (1 token after 2048 cached) then one of 2048 new tokens. Inputs as vLLM hands them over:
q ``[T, Hq, D]``, the packed cache views of the decode benchmark (the new tokens' K/V already in it, random),
block_table ``[R, pages]``, seq_lens ``[R]`` = context + new and query_start_loc ``[R + 1]`` (cumulative new
tokens), all int32. Ours: ``launch.paged_prefill(q, key_cache, value_cache, block_table, seq_lens,
query_start_loc, scale, out)``. FA3: ``flash_attn_varlen_func`` with cu_seqlens_q = query_start_loc,
max_seqlen_q = the longest query, seqused_k = seq_lens, max_seqlen_k = the longest sequence, causal, and the
AOT ``scheduler_metadata`` of FlashAttentionMetadataBuilder.build (v1/attention/backends/flash_attn.py
489-499, 504-530, 632-639): ``num_splits`` = 0 (FA3's own heuristic) in both, since the builder sets
max_num_splits = 32 only for batches of at most max_cudagraph_capture_size (512) tokens and every batch here is
larger (prefill attention runs outside full graphs: piecewise / eager). Triton: ``unified_attention`` as in the decode
benchmark with max_seqlen_q > 1, which always takes its 2D kernel. Checked, after the eager call and after the
replays, against an fp32 reference that gathers each request's keys once and applies the causal mask in one
matmul per request and KV head (``reference.paged_prefill_reference_fast``; the CPU test cross-checks it against
``reference.paged_prefill_reference``, which is one decode per query token and too slow for these sizes),
``torch.testing.assert_close``-style: ok iff |out - ref| <= 2e-2 + 2e-2·|ref| everywhere (column err/tol =
the largest |out - ref| / (2e-2 + 2e-2·|ref|)). Timed like decode (do_bench_cudagraph, median) but on a
single KV copy: prefill is compute-bound, so a cold L2 changes little (where a graph capture fails, eager
do_bench timing instead, flagged). Reported: µs, TFLOP/s (FLOPs = 4·D·Hq·Σ over query tokens of the keys
visible to it, causal) and speedups FA3_us / ours_us, triton_us / ours_us; JSON under "prefill", its own
table, and ``bench_attn_paged_prefill.png`` with the dense bf16 ceiling 790 TFLOP/s.
"""

from __future__ import annotations

import gc
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
from _attn_paged_cases import (  # noqa: E402
    BLOCK_SIZE,
    HEADS,
    IMPLS,
    LABELS,
    PEAK_BF16_TFLOPS,
    PREFILL_ATOL,
    PREFILL_CASES,
    PREFILL_CONFIGS,
    PREFILL_REP_MS,
    PREFILL_RTOL,
    Q_STD,
    PrefillCase,
    check_layout,
    fa3_status,
    import_ours,
    make_fa3_prefill,
    make_ours_prefill,
    make_prefill_case,
    make_triton_prefill,
    measure,
    ok_flag,
    prefill_ref,
    short,
    tol_ok,
    tol_ratio,
)
from _results import (  # noqa: E402
    Column,
    Panel,
    Series,
    arguments,
    describe_machine,
    figure,
    fmt,
    ratio,
    results_dir,
    table,
    write_json,
)


def prefill_row(launch, case: PrefillCase, fa3_ok: bool) -> dict:
    t = time.time()
    ref = prefill_ref(case)
    ref_s = time.time() - t
    factories = {"ours": lambda: make_ours_prefill(launch, case),
                 "fa3": (lambda: make_fa3_prefill(case)) if fa3_ok else None,
                 "triton": lambda: make_triton_prefill(case)}
    row = {"config": case.config, "kind": case.kind, "case": case.label, "Hq": case.Hq, "Hkv": case.Hkv,
           "D": case.D, "R": case.B, "T": case.T, "max_seqlen_q": case.max_seqlen_q, "max_seqlen_k": case.ctx,
           "context": list(case.context), "new": list(case.new), "flops": case.flops,
           "floor_us": case.flops / (PEAK_BF16_TFLOPS * 1e12) * 1e6, "reference_s": ref_s}
    for name, factory in factories.items():
        if factory is None:
            res = {"us": None, "err": None, "err_graph": None, "ok": None, "error": "unavailable", "info": {}}
        else:
            res = measure(factory, case, ref, copies=1, rep=PREFILL_REP_MS, errfn=tol_ratio, okfn=tol_ok,
                          eager_fallback=True)
        row[f"{name}_us"] = res["us"]
        row[f"{name}_err"] = res["err"]  # max |out - ref| / (atol + rtol·|ref|): ok <= 1
        row[f"{name}_err_graph"] = res["err_graph"]
        row[f"{name}_ok"] = res["ok"]
        row[f"{name}_error"] = res["error"]
        row[f"{name}_info"] = res["info"]
        row[f"{name}_timing"] = res.get("timing")
        row[f"{name}_tflops"] = None if res["us"] is None else case.flops / (res["us"] * 1e-6) / 1e12
        if case.device.type == "cuda":
            torch.cuda.empty_cache()
    row["speedup_vs_fa3"] = ratio(row["fa3_us"], row["ours_us"])
    row["speedup_vs_triton"] = ratio(row["triton_us"], row["ours_us"])
    row["triton_path"] = row["triton_info"].get("path")
    row["fa3_num_splits"] = row["fa3_info"].get("num_splits")
    # what the backend runs for this batch by default (INFERA_ATTN_PAGED_PREFILL=auto): FA3 where it runs
    row["route"] = "fa3" if fa3_ok and row["fa3_us"] is not None and case.D % 8 == 0 else "ours"
    row["route_us"] = row[f"{row['route']}_us"]
    row["route_vs_fa3"] = ratio(row["fa3_us"], row["route_us"])
    del ref
    return row


def print_prefill_row(row: dict) -> None:
    parts = [f"{row['config']:<10} {row['case']:<15} T={row['T']:<5}"]
    for name in IMPLS:
        parts.append(f"{name} {fmt(row[f'{name}_us'], '8.1f')} us ({fmt(row[f'{name}_tflops'], '5.1f')} TF/s, "
                     f"err/tol {fmt(row[f'{name}_err'], '.2f')}, {ok_flag(row, name)})")
    print(" | ".join(parts) + f" | triton {row['triton_path']}", flush=True)
    for name in IMPLS:
        if row[f"{name}_error"] and row[f"{name}_error"] != "unavailable":
            print(f"    {name}: {row[f'{name}_error']}", flush=True)
        if row[f"{name}_timing"] not in (None, "cudagraph"):
            print(f"    {name}: timed as {row[f'{name}_timing']}", flush=True)


def print_prefill_table(rows: list) -> list:
    print()
    print(table(rows, [
        Column("config", "config", align="<"), Column("case", "case", align="<"), Column("R", "R"), Column("T", "T"),
        Column("GFLOP", lambda r: r["flops"] / 1e9, ".1f"), Column("route", "route"),
        Column("route us", "route_us", ".1f"), Column("ours us", "ours_us", ".1f"), Column("FA3 us", "fa3_us", ".1f"),
        Column("triton us", "triton_us", ".1f"), Column("xFA3", "speedup_vs_fa3", ".2f"),
        Column("xtriton", "speedup_vs_triton", ".2f"), Column("oursTF", "ours_tflops", ".1f"),
        Column("FA3TF", "fa3_tflops", ".1f"), Column("triTF", "triton_tflops", ".1f"),
        Column("ok ours/FA3/tri", lambda r: "/".join(ok_flag(r, n) for n in IMPLS), align="<"),
        Column("err/tol ours/FA3/tri", lambda r: "/".join(fmt(r[f"{n}_err"], ".2f") for n in IMPLS), align="<"),
    ], f"prefill (ragged causal, bf16, block {BLOCK_SIZE}); TF = TFLOP/s (4·D·Hq·causal key visits / time; dense "
       f"bf16 ceiling {PEAK_BF16_TFLOPS:.0f}); x = other_us / ours_us (>1: ours faster); err/tol = max |out - ref| / "
       f"({PREFILL_ATOL} + {PREFILL_RTOL}·|ref|), ok <= 1"))
    for r in rows:
        for n in IMPLS:
            if r[f"{n}_timing"] not in (None, "cudagraph"):
                print(f"note: {n} {r['config']} {r['case']} timed as {r[f'{n}_timing']}")
    bad = [(r, n) for r in rows for n in IMPLS if r[f"{n}_ok"] is False]
    if bad:
        print("\n" + "!" * 100)
        for r, n in bad:
            what = r[f"{n}_error"] or (f"err/tol eager {fmt(r[f'{n}_err'], '.3f')}, after graph replays "
                                        f"{fmt(r[f'{n}_err_graph'], '.3f')} (ok <= 1)")
            print(f"!!! WRONG/FAILED (prefill): {n} {r['config']} {r['case']}: {what}")
        print("!" * 100)
    return bad


def plot_prefill(rows: list, path: str) -> None:
    """Per head configuration: µs per call (log) over the FLOPs' floor, and TFLOP/s against the dense bf16
    peak; ours, FA3 and vLLM's Triton side by side, wrong results marked BAD."""
    top, bottom = [], []
    for name in dict.fromkeys(r["config"] for r in rows):
        sel = [r for r in rows if r["config"] == name]
        x = [f"{r['kind']}\n{r['case']}" for r in sel]
        bad = {n: [r[f"{n}_ok"] is False for r in sel] for n in IMPLS}
        title = f"{name} (Hq {sel[0]['Hq']}, Hkv {sel[0]['Hkv']}, D {sel[0]['D']})"
        top.append(Panel(title, x, "µs per call (log)", logy=True,
                         bars=[Series(LABELS[n], [r[f"{n}_us"] for r in sel], bad=bad[n]) for n in IMPLS],
                         lines=[Series(f"floor: FLOPs / {PEAK_BF16_TFLOPS:.0f} TFLOP/s", [r["floor_us"] for r in sel],
                                       "k--")]))
        bottom.append(Panel(title, x, "TFLOP/s (causal FLOPs)", ylim=(0, PEAK_BF16_TFLOPS * 1.1),
                            ceiling=(PEAK_BF16_TFLOPS, f"bf16 dense peak {PEAK_BF16_TFLOPS:.0f} TFLOP/s"),
                            bars=[Series(LABELS[n], [r[f"{n}_tflops"] for r in sel], bad=bad[n]) for n in IMPLS]))
    figure(path, [top, bottom], "paged prefill attention (ragged, causal), bf16, block 16: infera vs vLLM 0.26 FA3 / "
                                "Triton 2D (CUDA-graph replays)")


def run_prefill(launch, doc: dict, out_dir: str, fa3_ok: bool, device) -> list:
    """The prefill section on the GPU: a row per (config, case) into doc["prefill"]["rows"], the table, the
    figure; returns the wrong or failed (row, impl) pairs."""
    t0 = time.time()
    sec = doc["prefill"] = {
        "settings": {"configs": {n: HEADS[n] for n in PREFILL_CONFIGS}, "block_size": BLOCK_SIZE,
                     "dtype": "bfloat16", "q_std": Q_STD, "atol": PREFILL_ATOL, "rtol": PREFILL_RTOL,
                     "err": "max |out - ref| / (atol + rtol·|ref|) vs an fp32 gather + masked-matmul reference; "
                            "ok <= 1",
                     "rep_ms": PREFILL_REP_MS, "timing": "triton.testing.do_bench_cudagraph, median; one KV copy "
                     "(warm L2: compute-bound)", "peak_bf16_tflops": PEAK_BF16_TFLOPS,
                     "flops": "4·D·Hq·sum over query tokens of the keys visible to it (causal)",
                     "fa3_num_splits": "fa3_builder_num_splits(T): 0 for every case (> 512 tokens)",
                     "triton": "unified_attention 2D (max_seqlen_q > 1)",
                     "cases": [{"kind": k, "case": lab, "requests_context_new": [list(x) for x in reqs]}
                               for k, lab, reqs in PREFILL_CASES]},
        "rows": []}
    torch.manual_seed(1)
    for name in PREFILL_CONFIGS:
        Hq, Hkv, D = HEADS[name]
        for kind, label, reqs in PREFILL_CASES:
            case = make_prefill_case(name, kind, label, Hq, Hkv, D, reqs, device=device)
            check_layout(case)
            row = prefill_row(launch, case, fa3_ok)
            sec["rows"].append(row)
            print_prefill_row(row)
            del case
            gc.collect()
            torch.cuda.empty_cache()
            write_json(out_dir, doc["benchmark"], doc)  # partial results survive a timeout
    bad = print_prefill_table(sec["rows"])
    sec["n_wrong_or_failed"] = len(bad)
    sec["seconds"] = time.time() - t0
    write_json(out_dir, doc["benchmark"], doc)
    try:
        plot_prefill(sec["rows"], os.path.join(out_dir, "bench_attn_paged_prefill.png"))
    except Exception as exc:  # noqa: BLE001
        print(f"prefill plot failed: {short(exc)}")
    print(f"prefill part {sec['seconds']:.0f} s", flush=True)
    return bad


def main() -> int:
    args = arguments(__doc__).parse_args()
    if not torch.cuda.is_available():
        print("bench_attn_paged_prefill: needs a CUDA GPU (none found)", file=sys.stderr)
        return 1
    launch, _, ours_from = import_ours()
    machine = describe_machine()
    fa3_ok, fa3_reason = fa3_status()
    print(f"ours from {ours_from}; FA3 {'available' if fa3_ok else 'UNAVAILABLE: ' + str(fa3_reason)}", flush=True)
    doc = {"benchmark": "bench_attn_paged_prefill", "machine": machine, "ours_from": ours_from,
           "fa3_available": fa3_ok, "fa3_unavailable_reason": fa3_reason}
    bad = run_prefill(launch, doc, args.out or results_dir(machine), fa3_ok, torch.device("cuda"))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
