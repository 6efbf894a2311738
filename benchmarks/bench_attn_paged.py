"""Paged attention, bf16: infera's Triton kernels vs vLLM 0.26's FA3 and Triton (unified_attention): decode
(``launch.paged_decode``, split-KV) and, after it, ragged prefill (``launch.paged_prefill``,
bench_attn_paged_prefill.py). The cases, references, calls and measurement are _attn_paged_cases.py's.

Decode: one query token per sequence over a paged KV cache (block size 16, every sequence ``ctx`` keys long), on
the cache exactly as vLLM 0.26's FLASH_ATTN / TRITON_ATTN backends (and ours) see it: the packed tensor of
logical shape ``(num_blocks, Hkv, block_size, 2·D)`` (``get_kv_cache_shape``) over the NHD physical layout
(stride order ``(0, 2, 1, 3)``), split in ``forward`` into the key / value views
``[num_blocks, block_size, Hkv, D]`` (``kv.transpose(1, 2).split(D, dim=-1)``); random block tables (a
permutation of the blocks), N(0, 1) keys and values, queries N(0, Q_STD²).

Baselines, called as vLLM 0.26 calls them:
- FA3: ``vllm.vllm_flash_attn.flash_attn_varlen_func(fa_version=3)`` on the same views (FlashAttentionImpl.
  forward), AOT ``scheduler_metadata`` from ``get_scheduler_metadata`` (FlashAttentionMetadataBuilder.build),
  ``num_splits`` = 32 = ``flash_attn_max_num_splits_for_cuda_graph`` (what the builder passes under full CUDA
  graphs), ``q/k/v_descale`` = the layer's unit scales expanded to (B, Hkv); sinks as bf16 ``s_aux``.
- Triton: ``unified_attention`` with the 3D-split buffers TritonAttentionMetadataBuilder preallocates
  (``seq_threshold_3D`` = 128 // Hkv, 16 softmax segments): batches up to the threshold take the 3D kernel.

Every output is checked against ``reference.paged_decode_reference`` (fp32) on every sequence, after an eager
call and again after the CUDA-graph replays (max abs error < 2e-2); a wrong result shows as ``BAD`` in the
``ok`` column and in a banner under the table. Timing: ``triton.testing.do_bench_cudagraph`` (median of the
replays), each implementation captured separately (ours with its preallocated Workspace). Unless
``--l2 warm``, the calls in a graph cycle over enough copies of the KV cache to exceed 4x the L2 (cold:
every KV byte from HBM, as when each layer reads its own cache), so that "% of copy BW" = KV bytes
(B·ctx·Hkv·D·2·2) / time / the copy ceiling measured in the same run (2 GiB bf16 copy, read + written).
Each row also has ``stream_floor_us``: the same pages, in the same KV copies, read by a plain streaming kernel
in one launch with nothing else to do (``_results.stream_floor_us``), the time a decode step's traffic takes
at this size, launch and ramp included; ``ours_pct_stream_floor`` = it / our time; ``ours_kernels_us``: each
of our kernels' GPU time per call (torch.profiler, eager calls: the decode kernel and the reduce apart).

Options: ``--out`` results folder (default results/<gpu>/); ``--sweep`` adds a sweep of our launch configs
and split counts (for llama3-8b and smollm2 heads; ``--sweep-budget-s`` bounds its time); ``--l2 warm``;
``--no-prefill``; ``--traceback`` prints a failed call's traceback; ``--batches`` and ``--rows B:ctx,...`` pick
the decode rows (other lengths than the table's: ``--rows 16:320,64:320``); ``--pdl on|off`` and
``--merge-max-slices N`` force our reduce's programmatic dependent launch and the slice cap up to which the
main kernel merges the slices itself (``--merge-max-registers R``: compiled to at most R registers, as the
tuning file's ``merge_max_registers``). On the CPU,
``meta/infera-vllm/tests/test_bench_attn_paged.py`` runs this benchmark's cases at tiny sizes under Triton's
interpreter (builders, layout, references, our kernel, the FA3 and Triton arguments), without timing.

    python benchmarks/bench_attn_paged.py [--sweep] [--out DIR]
"""

from __future__ import annotations

import gc
import itertools
import os
import sys
import time
from dataclasses import asdict, replace

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import _attn_paged_cases  # noqa: E402
import torch  # noqa: E402
from _attn_paged_cases import (  # noqa: E402
    BLOCK_SIZE,
    FA3_MAX_NUM_SPLITS,
    HEADS,
    IMPLS,
    L2_BYTES,
    LABELS,
    NUM_PAR_SOFTMAX_SEGMENTS,
    PREFILL_CASES,
    PREFILL_CONFIGS,
    Q_STD,
    REP_MS,
    ROWS,
    SINKS_CONFIG,
    SWEEP_BLOCK_N,
    SWEEP_CONFIGS,
    SWEEP_REP_MS,
    SWEEP_STAGES,
    SWEEP_WARPS,
    TOL,
    Case,
    check_layout,
    fa3_status,
    import_ours,
    kv_copies_for,
    make_case,
    make_fa3,
    make_ours,
    make_sinks,
    make_triton,
    measure,
    ok_flag,
    pct,
    reference_out,
    short,
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
    kernel_times_us,
    ratio,
    results_dir,
    stream_floor_us,
    table,
    write_json,
)
from bench_attn_paged_prefill import run_prefill  # noqa: E402


def bench_row(launch, reference, case: Case, sinks, label: str, ceiling: float, copies: int, fa3_ok: bool,
              pdl: bool | None = None, policy_overrides: dict | None = None) -> dict:
    ref = reference_out(reference, case, sinks)
    policy = None if not policy_overrides else replace(launch.decode_defaults(case.D, case.device)[1],
                                                       **policy_overrides)
    factories = {
        "ours": lambda: make_ours(launch, case, sinks, pdl=pdl, policy=policy),
        "fa3": (lambda: make_fa3(case, sinks)) if fa3_ok else None,
        "triton": lambda: make_triton(case, sinks),
    }
    row = {"config": label, "Hq": case.Hq, "Hkv": case.Hkv, "D": case.D, "sinks": sinks is not None,
           "B": case.B, "ctx": case.ctx, "bytes": case.kv_bytes, "kv_copies": copies,
           "floor_us": case.kv_bytes / (ceiling * 1e12) * 1e6,
           "stream_floor_us": stream_floor_us(case.stream_floor_calls())}
    for name, factory in factories.items():
        if factory is None:
            res = {"us": None, "err": None, "err_graph": None, "ok": None, "error": "unavailable", "info": {}}
        else:
            res = measure(factory, case, ref, copies=copies, rep=REP_MS)
        row[f"{name}_us"] = res["us"]
        row[f"{name}_err"] = res["err"]
        row[f"{name}_err_graph"] = res["err_graph"]
        row[f"{name}_ok"] = res["ok"]
        row[f"{name}_error"] = res["error"]
        row[f"{name}_info"] = res["info"]
        row[f"{name}_pct_copy"] = pct(case.kv_bytes, res["us"], ceiling)
    row["speedup_vs_fa3"] = ratio(row["fa3_us"], row["ours_us"])
    row["ours_pct_stream_floor"] = None if row["ours_us"] is None else row["stream_floor_us"] / row["ours_us"] * 100
    if row["ours_ok"]:  # each of our kernels' GPU time per call (the decode kernel, the reduce where it runs)
        impl = make_ours(launch, case, sinks, pdl=pdl)
        row["ours_kernels_us"] = kernel_times_us(lambda: [impl.run(i) for i in range(copies)], calls=copies)
    row["speedup_vs_triton"] = ratio(row["triton_us"], row["ours_us"])
    row["ours_splits"] = row["ours_info"].get("splits")
    row["triton_path"] = row["triton_info"].get("path")
    del ref
    return row



def print_row(row: dict) -> None:
    parts = [f"{row['config']:<18} B={row['B']:<4} ctx={row['ctx']:<6}"]
    for name in IMPLS:
        parts.append(f"{name} {fmt(row[f'{name}_us'], '8.1f')} us ({fmt(row[f'{name}_pct_copy'], '5.1f')}%, "
                     f"err {fmt(row[f'{name}_err'], '.1e')}, {ok_flag(row, name)})")
    line = (" | ".join(parts) + f" | splits {row['ours_splits']} triton {row['triton_path']} | stream floor "
            f"{row['stream_floor_us']:.1f} us | kernels "
            + ", ".join(f"{k[:28]} {v:.1f}" for k, v in (row.get("ours_kernels_us") or {}).items()))
    print(line, flush=True)
    for name in IMPLS:
        if row[f"{name}_error"] and row[f"{name}_error"] != "unavailable":
            print(f"    {name}: {row[f'{name}_error']}", flush=True)


def print_table(rows: list, ceiling: float) -> list:
    print()
    print(table(rows, [
        Column("config", "config", align="<"), Column("B", "B"), Column("ctx", "ctx"),
        Column("ours us", "ours_us", ".1f"), Column("FA3 us", "fa3_us", ".1f"), Column("triton us", "triton_us", ".1f"),
        Column("xFA3", "speedup_vs_fa3", ".2f"), Column("xtriton", "speedup_vs_triton", ".2f"),
        Column("ours%", "ours_pct_copy", ".1f"), Column("FA3%", "fa3_pct_copy", ".1f"),
        Column("tri%", "triton_pct_copy", ".1f"),
        Column("ok ours/FA3/tri", lambda r: "/".join(ok_flag(r, n) for n in IMPLS), align="<"),
        Column("splits", lambda r: f"{r['ours_splits']} (FA3 <={FA3_MAX_NUM_SPLITS}, triton {r['triton_path']})",
               align="<"),
    ], f"copy ceiling {ceiling:.2f} TB/s; % = KV bytes / time / ceiling; x = other_us / ours_us (>1: ours faster)"))
    bad = [(r, n) for r in rows for n in IMPLS if r[f"{n}_ok"] is False]
    if bad:
        print("\n" + "!" * 100)
        for r, n in bad:
            what = r[f"{n}_error"] or (f"max abs err eager {fmt(r[f'{n}_err'], '.3e')}, after graph replays "
                                        f"{fmt(r[f'{n}_err_graph'], '.3e')} (tolerance {TOL})")
            print(f"!!! WRONG/FAILED: {n} {r['config']} B={r['B']} ctx={r['ctx']}: {what}")
        print("!" * 100)
    return bad


def sink_overheads(rows: list) -> list:
    base = {(r["B"], r["ctx"]): r for r in rows if r["config"] == SINKS_CONFIG}
    out = []
    for r in rows:
        if r["config"] != SINKS_CONFIG + "+sinks" or (r["B"], r["ctx"]) not in base:
            continue
        b = base[(r["B"], r["ctx"])]
        out.append({"B": r["B"], "ctx": r["ctx"],
                    **{f"{n}_sinks_over_plain": ratio(r[f"{n}_us"], b[f"{n}_us"]) for n in IMPLS}})
    if out:
        print(f"\nsink overhead ({SINKS_CONFIG}, time with sinks / without): "
              + "; ".join(f"B={o['B']} ctx={o['ctx']}: " + " ".join(
                  f"{n} {fmt(o[f'{n}_sinks_over_plain'], '.3f')}" for n in IMPLS) for o in out))
    return out


# ----------------------------------------------------------------------------------------------------------
# Sweep (--sweep)
# ----------------------------------------------------------------------------------------------------------

SWEEP_PROGRAMS_PER_SM = (4, 8, 16, 32, 64)
SWEEP_SPLIT_KEYS = (64, 128, 256, 512)


def sweep_case(launch, reference, case: Case, copies: int, deadline: float, *, timed: bool = True,
               stages=SWEEP_STAGES) -> dict:
    """Three passes, each from the best of the last: launch configs (block_n x warps x stages) under the
    default split policy and PDL; split policies (programs_per_sm x split_keys); PDL off."""
    ref = reference_out(reference, case)
    default = launch.decode_defaults(case.D, case.device)
    results, failed, wrong, skipped = [], [], [], 0

    def run(cands):
        nonlocal skipped
        for cfg, pol, pdl in cands:
            if any(e["key"] == (cfg, pol, pdl) for e in results):
                continue
            if time.time() > deadline:
                skipped += 1
                continue
            res = measure(lambda: make_ours(launch, case, config=cfg, policy=pol, pdl=pdl), case, ref, copies=copies,
                          rep=SWEEP_REP_MS, timed=timed)
            entry = {"key": (cfg, pol, pdl), "config": asdict(cfg), "policy": asdict(pol), "pdl": pdl,
                     "splits": res["info"].get("splits"), "us": res["us"], "err": res["err"], "ok": res["ok"]}
            if res["error"]:
                entry["error"] = res["error"]
                failed.append(entry)
            elif not res["ok"]:
                wrong.append(entry)
            results.append(entry)
        good = [e for e in results if e["ok"] and e["us"] is not None]
        return min(good, key=lambda e: e["us"])["key"] if good else default

    cfg, pol, pdl = run([(launch.LaunchConfig(block_n=bn, num_warps=w, num_stages=st), default[1], default[2])
                         for bn, w, st in itertools.product(SWEEP_BLOCK_N, SWEEP_WARPS, stages)] + [default])
    cfg, pol, pdl = run([(cfg, launch.SplitPolicy(programs_per_sm=p, split_keys=k), pdl)
                         for p, k in itertools.product(SWEEP_PROGRAMS_PER_SM, SWEEP_SPLIT_KEYS)])
    run([(cfg, pol, not pdl)] if default[2] else [])
    for e in results:
        e.pop("key")
    good = [e for e in results if e["ok"] and e["us"] is not None]
    best = min(good, key=lambda e: e["us"]) if good else None
    dflt = next((e for e in results if e["config"] == asdict(default[0]) and e["policy"] == asdict(default[1])
                 and e["pdl"] == default[2]), None)
    out = {"config": case.config, "B": case.B, "ctx": case.ctx, "best": best, "default": dflt,
           "gain_vs_default": ratio(dflt["us"] if dflt else None, best["us"] if best else None),
           "n_candidates": len(results) + skipped, "n_failed_to_run": len(failed), "n_wrong": len(wrong),
           "n_skipped_budget": skipped, "failed": failed, "wrong": wrong, "candidates": results}

    def describe(e):
        c, p = e["config"], e["policy"]
        return (f"block_n={c['block_n']} warps={c['num_warps']} stages={c['num_stages']} "
                f"pps={p['programs_per_sm']} split_keys={p['split_keys']} pdl={int(e['pdl'])} "
                f"splits={e['splits']} {e['us']:.1f} us")

    print(f"sweep {case.config:<10} B={case.B:<4} ctx={case.ctx:<6} best " + (describe(best) if best else "none")
          + (f" | default {describe(dflt)}" if dflt and dflt["us"] else "")
          + (f" | x{out['gain_vs_default']:.3f}" if out["gain_vs_default"] else "")
          + (f" | {len(failed)} failed to compile/run (skipped)" if failed else "")
          + (f" | {len(wrong)} WRONG" if wrong else "")
          + (f" | {skipped} not run (time budget)" if skipped else ""), flush=True)
    for e in failed[:3]:
        print(f"    skipped {e['config']} {e['policy']}: {e['error']}", flush=True)
    for e in wrong:
        print(f"    !!! WRONG {e['config']} {e['policy']} pdl={e['pdl']}: err {fmt(e['err'], '.3e')}", flush=True)
    return out


# ----------------------------------------------------------------------------------------------------------
# Plot
# ----------------------------------------------------------------------------------------------------------

def plot(rows: list, ceiling: float, path: str) -> None:
    """Per head configuration: µs per call (log) over the KV bytes' floor and the stream floor, and % of the
    copy ceiling; ours, FA3 and vLLM's Triton side by side, wrong results marked BAD."""
    top, bottom = [], []
    for name in dict.fromkeys(r["config"] for r in rows):
        sel = [r for r in rows if r["config"] == name]
        x = [f"B{r['B']}\n{r['ctx'] // 1024}k" if r["ctx"] % 1024 == 0 else f"B{r['B']}\n{r['ctx']}" for r in sel]
        bad = {n: [r[f"{n}_ok"] is False for r in sel] for n in IMPLS}
        title = f"{name} (Hq {sel[0]['Hq']}, Hkv {sel[0]['Hkv']}, D {sel[0]['D']})"
        top.append(Panel(title, x, "µs per call (log)", logy=True,
                         bars=[Series(LABELS[n], [r[f"{n}_us"] for r in sel], bad=bad[n]) for n in IMPLS],
                         lines=[Series("floor: KV bytes / copy ceiling", [r["floor_us"] for r in sel], "k--"),
                                Series("stream floor: the same pages read alone", [r["stream_floor_us"] for r in sel],
                                       "k:")]))
        bottom.append(Panel(title, x, "% of copy bandwidth", ceiling=(100, f"copy ceiling {ceiling:.2f} TB/s"),
                            bars=[Series(LABELS[n], [r[f"{n}_pct_copy"] for r in sel], bad=bad[n]) for n in IMPLS]))
    figure(path, [top, bottom], "paged decode attention, bf16, block 16: infera vs vLLM 0.26 FA3 / Triton "
                                "(CUDA-graph replays)")


# ----------------------------------------------------------------------------------------------------------
# Main (GPU)
# ----------------------------------------------------------------------------------------------------------

def main() -> int:
    parser = arguments(__doc__)
    parser.add_argument("--l2", choices=("cold", "warm"), default="cold",
                        help="cold: the calls cycle over KV copies >= 4x the L2; warm: one copy")
    parser.add_argument("--sweep", action="store_true", help="also sweep our launch configs and split counts")
    parser.add_argument("--sweep-budget-s", type=float, default=180.0)
    parser.add_argument("--no-prefill", action="store_true", help="the decode table only")
    parser.add_argument("--traceback", action="store_true", help="print a failed call's traceback")
    parser.add_argument("--batches", type=lambda v: {int(b) for b in v.split(",")},
                        help="only the decode rows of these batch sizes, e.g. 1 or 1,16")
    parser.add_argument("--rows", type=lambda v: tuple(tuple(int(x) for x in r.split(":")) for r in v.split(",")),
                        default=ROWS, help="the decode rows as B:ctx pairs, e.g. 16:320,64:320 (default: the table's)")
    parser.add_argument("--pdl", choices=("tuned", "on", "off"), default="tuned",
                        help="our reduce as a programmatic dependent launch: as the tuning file says, or forced")
    parser.add_argument("--merge-max-slices", type=int, default=None,
                        help="merge the slices in the main kernel up to this slice cap (0: never) instead of as the "
                             "tuning file says")
    parser.add_argument("--merge-max-registers", type=int, default=None,
                        help="the merging kernel's register cap (Triton's maxnreg; 0: the compiler's choice) instead "
                             "of the tuning file's")
    args = parser.parse_args()
    overrides = {k: v for k, v in (("merge_max_slices", args.merge_max_slices),
                                   ("merge_max_registers", args.merge_max_registers)) if v is not None}
    pdl = {"tuned": None, "on": True, "off": False}[args.pdl]
    _attn_paged_cases.TRACEBACK = args.traceback
    if not torch.cuda.is_available():
        print("bench_attn_paged: needs a CUDA GPU (none found). Its CPU check: "
              "meta/infera-vllm/tests/test_bench_attn_paged.py (nox runs it)", file=sys.stderr)
        return 1
    t0 = time.time()
    launch, reference, ours_from = import_ours()
    machine = describe_machine()
    cold = args.l2 == "cold"
    sweep = args.sweep
    fa3_ok, fa3_reason = fa3_status()
    print(f"ours from {ours_from}; FA3 {'available' if fa3_ok else 'UNAVAILABLE: ' + str(fa3_reason)}; "
          f"L2 {'cold (KV copies cycled, >= 4x L2)' if cold else 'warm (one KV copy)'}", flush=True)
    device = torch.device("cuda")
    ceiling = copy_ceiling_tb_s()
    print(f"copy ceiling {ceiling:.2f} TB/s", flush=True)

    out_dir = args.out or results_dir(machine)
    doc = {"benchmark": "bench_attn_paged", "machine": machine, "copy_ceiling_tb_s": ceiling,
           "ours_from": ours_from, "fa3_available": fa3_ok, "fa3_unavailable_reason": fa3_reason,
           "settings": {"block_size": BLOCK_SIZE, "dtype": "bfloat16", "tolerance_max_abs": TOL, "q_std": Q_STD,
                        "l2": "cold" if cold else "warm", "l2_bytes_assumed": L2_BYTES, "rep_ms": REP_MS,
                        "timing": "triton.testing.do_bench_cudagraph, median",
                        "fa3_num_splits": FA3_MAX_NUM_SPLITS,
                        "triton_seq_threshold_3D": "128 // Hkv (not snapped to a capture size)",
                        "triton_num_par_softmax_segments": NUM_PAR_SOFTMAX_SEGMENTS,
                        "pdl": args.pdl, "batches": sorted(args.batches) if args.batches else "all",
                        "rows": [list(r) for r in args.rows], "merge_max_slices": args.merge_max_slices,
                        "merge_max_registers": args.merge_max_registers},
           "rows": []}
    path = None
    torch.manual_seed(0)
    for name, (Hq, Hkv, D) in HEADS.items():
        for B, ctx in args.rows:
            if args.batches and B not in args.batches:
                continue
            copies = kv_copies_for(B, ctx, Hkv, D, cold)
            case = make_case(name, Hq, Hkv, D, B, ctx, device=device, copies=copies)
            check_layout(case)
            row = bench_row(launch, reference, case, None, name, ceiling, copies, fa3_ok, pdl, overrides)
            doc["rows"].append(row)
            print_row(row)
            if name == SINKS_CONFIG:
                sinks = make_sinks(Hq, ctx, device)
                row = bench_row(launch, reference, case, sinks, name + "+sinks", ceiling, copies, fa3_ok, pdl,
                                overrides)
                row["sinks_values"] = sinks.tolist()
                doc["rows"].append(row)
                print_row(row)
            del case
            gc.collect()
            torch.cuda.empty_cache()
        path = write_json(out_dir, "bench_attn_paged", doc)  # partial results survive a timeout
    print(f"main part {time.time() - t0:.0f} s", flush=True)

    bad = print_table(doc["rows"], ceiling)
    doc["sink_overhead"] = sink_overheads(doc["rows"])
    doc["n_wrong_or_failed"] = len(bad)
    path = write_json(out_dir, "bench_attn_paged", doc)
    try:
        plot(doc["rows"], ceiling, path.replace(".json", ".png"))
    except Exception as exc:  # noqa: BLE001
        print(f"plot failed: {short(exc)}")

    prefill_bad = []
    if not args.no_prefill:
        print(f"\nprefill: {len(PREFILL_CONFIGS)} configs x {len(PREFILL_CASES)} ragged batches (--no-prefill "
              f"skips)", flush=True)
        prefill_bad = run_prefill(launch, doc, out_dir, fa3_ok, device)
        path = write_json(out_dir, "bench_attn_paged", doc)

    if sweep:
        budget = args.sweep_budget_s
        start = time.time()
        jobs = [(name, B, ctx) for name in SWEEP_CONFIGS for B, ctx in ROWS]
        print(f"\nsweep of our LaunchConfig x splits (budget {budget:.0f} s, shared out over the {len(jobs)} rows; "
              f"candidates that fail to compile or run are skipped and counted)", flush=True)
        doc["sweep"] = []
        doc["sweep_budget_s"] = budget
        for k, (name, B, ctx) in enumerate(jobs):
            Hq, Hkv, D = HEADS[name]
            deadline = start + budget * (k + 1) / len(jobs)  # time a row leaves unused carries over
            copies = kv_copies_for(B, ctx, Hkv, D, cold)
            case = make_case(name, Hq, Hkv, D, B, ctx, device=device, copies=copies)
            doc["sweep"].append(sweep_case(launch, reference, case, copies, deadline))
            del case
            gc.collect()
            torch.cuda.empty_cache()
            path = write_json(out_dir, "bench_attn_paged", doc)
    print(f"total {time.time() - t0:.0f} s; wrote {path}")
    return 1 if bad or prefill_bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
