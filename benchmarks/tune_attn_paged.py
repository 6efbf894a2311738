"""Tune infera-attn-paged's decode kernel for this GPU: per head size, the launch config, the split policy
and programmatic dependent launch that give the lowest geometric-mean time over the decode table's rows
(bench_attn_paged.py's ROWS for every head config of that size), in five passes, each from the best of
the last:

1. launch configs (block_n x warps x stages) under the current defaults' split policy and PDL;
2. split policies (programs per SM x fewest keys per slice) at that launch config;
3. slice caps above 64 (MAX_SPLITS_SWEEP x programs per SM enough to reach them at batch 1): more, shorter
   slices for the batch-1 rows, where every cap up to 64 was faster than the one below it;
4. PDL off (where the GPU has it), and the slices merged in the main kernel up to a slice cap
   (``merge_max_slices`` in MERGE_MAX_SLICES_SWEEP: no reduce launch at those caps, so no PDL there; each
   also compiled to the register budget of the chosen programs per SM, ``merge_max_registers``);
5. the launch config of the rows whose slice cap is 1 (launch.LaunchConfig.unsplit: large batches, one program
   per sequence and KV head, each walking a whole sequence), timed on those rows alone; from the same
   times, per query group (heads per KV head) the launch fastest on that group's rows where it differs
   (``unsplit_by_group``); each kept only if the whole table is faster with it.

Then the ragged prefill kernel, per head size of bench_attn_paged.PREFILL_CONFIGS: every launch of
PREFILL_SPACE (rows per program, key tile, warps, stages) that compiles for this GPU without spilling
(:func:`prefill_candidates`: compiled ahead of time first, in parallel, and launches whose compiled code is
the same counted once), the launch the op uses today first and then the largest tiles, over the prefill
table's cases (bench_attn_paged.PREFILL_CASES), each launch checked against the fp32 reference, lowest
geometric-mean time; the winner goes to the file's ``prefill`` section (head sizes not measured keep the
packaged entry). Not a coordinate descent: from 64 rows on 4 warps a sweep of the row count alone meets
only launches that spill (128 rows on 4 warps), and never reaches 128 rows on 8 warps, the usual
attention launch on Hopper. A time budget that ends the sweep early has tried the largest tiles.

Every candidate is checked against the fp32 reference on every row (a wrong candidate is never chosen) and
timed from CUDA-graph replays with a cold L2, as in the benchmark. Writes ``attn_paged_<family>.json`` (the
op's tuning format, policy.py, with what was measured) and ``tune_attn_paged.json`` (every candidate) into
``--out`` (default results/<gpu>/); the op reads the first from its ``tuning/`` folder once committed there,
or from ``INFERA_ATTN_PAGED_TUNING``.

    python benchmarks/tune_attn_paged.py [--budget-s 300] [--prefill-budget-s 150] [--no-decode] [--passes 3,5]
"""

from __future__ import annotations

import itertools
import json
import math
import os
import sys
import time
from dataclasses import asdict, replace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _attn_paged_cases as shared  # noqa: E402
import torch  # noqa: E402
from _results import arguments, describe_machine, fmt, ratio, results_dir, write_json  # noqa: E402

PROGRAMS_PER_SM = (2, 3, 4, 8, 16, 32, 64)  # 2-3: one wave of the split kernel's resident programs at small B
SPLIT_KEYS = (64, 128, 256, 512)
MAX_SPLITS_SWEEP = (128, 256)
MERGE_MAX_SLICES_SWEEP = (0, 4, 8, 16, 64)  # 0: the reduce kernel at every cap


PREFILL_SPACE = dict(block_m=(64, 128, 256), block_n=(32, 64, 128), num_warps=(4, 8), num_stages=(2, 3, 4))


def _launch(cfg) -> dict | None:
    return None if cfg is None else {k: getattr(cfg, k) for k in ("block_n", "num_warps", "num_stages")}


def table_entry(cfg, pol, pdl) -> dict:
    """A decode entry of the tuning file (policy.py's format) for these settings."""
    entry = {**asdict(replace(cfg, unsplit=None, unsplit_by_group=())), **asdict(pol), "pdl": bool(pdl)}
    entry.pop("unsplit")
    entry.pop("unsplit_by_group")
    if cfg.unsplit is not None:
        entry["unsplit"] = _launch(cfg.unsplit)
    if cfg.unsplit_by_group:
        entry["unsplit_by_group"] = {str(g): _launch(c) for g, c in cfg.unsplit_by_group}
    return entry


def keep_untuned(tuned: dict, packaged: dict, no_decode: bool) -> dict:
    """``tuned`` with what this run did not tune taken from the packaged file, each section with the record of
    the run that measured it: the prefill section always (a prefill sweep then updates the head sizes it
    measured), the decode section and its record with ``--no-decode``."""
    kept = {**tuned, "prefill": dict(packaged.get("prefill", {}))}
    old = packaged.get("measured", {})
    if no_decode:
        kept["decode"], kept["measured"] = packaged.get("decode", {}), dict(old)
    elif "prefill" in old:
        kept["measured"] = {**tuned["measured"], "prefill": old["prefill"]}
    return kept


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def unsplit_by_group(shared, measured, groups) -> tuple:
    """``LaunchConfig.unsplit_by_group`` from pass 5's measurements: ``measured`` = (unsplit launch or None,
    its ``seen`` entry on the cap-1 rows or None), ``groups`` = each of those rows' query heads per KV head.
    A group whose rows are fastest (geometric mean) on a launch other than ``shared`` gets that launch (None:
    the split launch's sizes); one group alone gets none (``shared`` is already its best)."""
    by_group = []
    for g in sorted(set(groups)):
        at = [i for i, row_group in enumerate(groups) if row_group == g]
        timed = [(geomean([entry["us"][i] for i in at]), launch) for launch, entry in measured
                 if entry is not None and entry["ok"]]
        if timed and len(set(groups)) > 1:
            best = min(timed, key=lambda t: t[0])[1]
            if best != shared:
                by_group.append((g, best))
    return tuple(by_group)


def prefill_candidates(launch, head_size: int, group: int, family: str, first: dict,
                       page: int = shared.BLOCK_SIZE, threads: int = 8) -> tuple[list[dict], dict]:
    """(launches to time, why each other one of PREFILL_SPACE is not): every launch with at least ``group``
    rows, compiled ahead of time for ``family`` (``infera_vllm.aot``, the same compiler the launch would
    run), dropped where it spills or does not fit, and counted once where its compiled code is another's
    (a stage count the loop cannot use); ``first`` (the op's launch today) leads, then the largest tiles
    (rows x keys), then the fewest warps and stages."""
    import hashlib
    from concurrent.futures import ThreadPoolExecutor

    from infera_ops.attn_paged.kernels import _paged_prefill_kernel
    from infera_vllm import aot

    pointers = {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "block_table_ptr": "*i32",
                "seq_lens_ptr": "*i32", "query_start_loc_ptr": "*i32", "sinks_ptr": "*fp32", "out_ptr": "*bf16"}
    space = [dict(zip(PREFILL_SPACE, values)) for values in itertools.product(*PREFILL_SPACE.values())]
    space = [p for p in space if p["block_m"] >= group]
    space.sort(key=lambda p: (p != first, -p["block_m"] * p["block_n"], p["num_warps"], p["num_stages"]))

    def compiled(p):
        cfg = launch.LaunchConfig(block_n=p["block_n"], num_warps=p["num_warps"], num_stages=p["num_stages"])
        try:
            kernel = aot.compile_kernel(
                _paged_prefill_kernel, family, pointers=pointers, floats={"scale", "softcap"},
                constexprs=launch.prefill_constexprs(group, head_size, page, p["block_m"], cfg),
                num_warps=p["num_warps"], num_stages=p["num_stages"])
        except Exception as exc:  # a launch the compiler rejects is not a candidate
            return None, f"compile error: {type(exc).__name__}: {str(exc)[:120]}"
        res = aot.resources(kernel)
        if res.problems():
            return None, "; ".join(res.problems())
        code = "\n".join(line for line in kernel.asm["ptx"].splitlines() if not line.lstrip().startswith("//"))
        return hashlib.sha256(code.encode()).hexdigest(), None

    with ThreadPoolExecutor(threads) as pool:
        results = list(pool.map(compiled, space))
    kept, dropped, codes = [], {}, {}
    for p, (code, why) in zip(space, results):
        key = " ".join(f"{k}={v}" for k, v in p.items())
        if code is None:
            dropped[key] = why
        elif code in codes:
            dropped[key] = f"same compiled code as {codes[code]}"
        else:
            codes[code] = key
            kept.append(p)
    return kept, dropped


def tune_prefill(launch, budget_s: float, device) -> tuple[dict, dict]:
    """(prefill section {head size: settings}, what was measured) over PREFILL_SPACE; see the docstring."""
    from infera_ops.attn_paged import policy

    t0 = time.time()
    section, measured = {}, {}
    torch.manual_seed(1)
    for n_done, name in enumerate(shared.PREFILL_CONFIGS):
        Hq, Hkv, D = shared.HEADS[name]
        deadline = t0 + budget_s * (n_done + 1) / len(shared.PREFILL_CONFIGS)
        cases = [shared.make_prefill_case(name, kind, label, Hq, Hkv, D, reqs, device=device)
                 for kind, label, reqs in shared.PREFILL_CASES]
        refs = [shared.prefill_ref(c) for c in cases]
        G = Hq // Hkv
        default_m, default_cfg = launch.prefill_config(D, G, device)
        start = dict(block_m=default_m, block_n=default_cfg.block_n, num_warps=default_cfg.num_warps,
                     num_stages=default_cfg.num_stages)
        seen = []
        by_key = {}

        def score(params, cases=cases, refs=refs, deadline=deadline, G=G, seen=seen, by_key=by_key):
            key = tuple(sorted(params.items()))
            if key in by_key:
                return by_key[key]["geomean_us"]
            if params["block_m"] < G or time.time() > deadline:
                return None
            bm, bn, w, st = params["block_m"], params["block_n"], params["num_warps"], params["num_stages"]
            cfg = launch.LaunchConfig(block_n=bn, num_warps=w, num_stages=st)

            def factory(case, bm=bm, cfg=cfg):
                out = torch.empty_like(case.q)

                def run(i: int) -> None:
                    launch.paged_prefill(case.q, case.keys[i], case.values[i], case.block_table, case.seq_lens,
                                         case.query_start_loc, case.scale, out, block_m=bm, config=cfg)

                return shared.Impl(run, out, {})

            rows = [shared.measure(lambda c=c: factory(c), c, ref, copies=1, rep=shared.PREFILL_REP_MS,
                                  errfn=shared.tol_ratio, okfn=shared.tol_ok) for c, ref in zip(cases, refs)]
            good = all(r["ok"] and r["us"] for r in rows)
            entry = {"block_m": bm, "block_n": bn, "num_warps": w, "num_stages": st, "ok": good,
                     "us": [r["us"] for r in rows], "errors": [r["error"] for r in rows if r["error"]],
                     "geomean_us": geomean([r["us"] for r in rows]) if good else None}
            seen.append(entry)
            by_key[key] = entry
            result = "failed or wrong"
            if good:
                tflops = ", ".join(f"{c.label} {c.flops / (r['us'] * 1e-6) / 1e12:.0f}" for c, r in zip(cases, rows))
                result = f"{entry['geomean_us']:.1f} us geomean, {tflops} TFLOP/s"
            # one line per launch as it is timed: a run cut short keeps what it measured
            print(f"  prefill D={D} block_m={bm} block_n={bn} warps={w} stages={st}: {result}", flush=True)
            return entry["geomean_us"]

        candidates, dropped = prefill_candidates(launch, D, G, policy.family_of(device), start)
        print(f"prefill head size {D}: {len(candidates)} launches to time, {len(dropped)} not "
              f"(spill, do not fit or repeat another's code)")
        score(start)  # the launch the op uses today, first (the baseline the winner is compared with)
        for params in candidates:
            if time.time() > deadline:
                break
            score(params)
        scored = [c for c in seen if c["ok"]]
        if not scored:
            print(f"prefill head size {D}: no launch ran every case correctly; the packaged entry stays")
            continue
        best, base = min(scored, key=lambda c: c["geomean_us"]), seen[0]
        tflops = [c.flops / (u * 1e-6) / 1e12 for c, u in zip(cases, best["us"])]
        print(f"\nprefill head size {D} ({name}): best block_m={best['block_m']} block_n={best['block_n']} "
              f"warps={best['num_warps']} stages={best['num_stages']}: {best['geomean_us']:.1f} us geomean "
              f"(default {fmt(base['geomean_us'], '.1f')}); {len(seen)} launches, "
              f"{sum(not c['ok'] for c in seen)} failed or wrong")
        for c, u, tf, d_us in zip(cases, best["us"], tflops, base["us"]):
            print(f"  {c.label:<16} {fmt(d_us, '9.1f')} -> {u:9.1f} us ({tf:5.0f} TFLOP/s)")
        section[str(D)] = {k: best[k] for k in ("block_m", "block_n", "num_warps", "num_stages")}
        measured[str(D)] = {"config": name, "cases": [c.label for c in cases], "tflops": tflops, "default": base,
                            "best": best, "candidates": seen, "not_timed": dropped,
                            "untimed_for_budget": [p for p in candidates if tuple(sorted(p.items())) not in by_key]}
        del cases, refs, score  # score's defaults hold the cases too
        torch.cuda.empty_cache()
    return section, measured


def main() -> int:
    parser = arguments(__doc__)
    parser.add_argument("--budget-s", type=float, default=300.0,
                        help="stop starting candidates after this (shared out over the head sizes)")
    parser.add_argument("--prefill-budget-s", type=float, default=150.0,
                        help="the same for the prefill launches (0: prefill not tuned)")
    parser.add_argument("--no-decode", action="store_true", help="tune the prefill launches only")
    parser.add_argument("--passes", default="1,2,3,4,5",
                        help="the decode passes to run (comma-separated), each from the best of the last, the first "
                             "from the settings in use (the packaged tuning file or INFERA_ATTN_PAGED_TUNING)")
    args = parser.parse_args()
    passes = {int(p) for p in args.passes.split(",") if p.strip()}
    if not torch.cuda.is_available():
        print("tune_attn_paged: needs a CUDA GPU", file=sys.stderr)
        return 1
    t0 = time.time()
    launch, reference, ours_from = shared.import_ours()
    from infera_ops.attn_paged import policy

    device = torch.device("cuda")
    machine = describe_machine()
    fa3_ok, _ = shared.fa3_status()
    torch.manual_seed(0)
    sizes = sorted({D for _, _, D in shared.HEADS.values()})
    doc = {"benchmark": "tune_attn_paged", "machine": machine, "ours_from": ours_from, "head_sizes": {}}
    table = {}
    for n_done, D in enumerate([] if args.no_decode else sizes):
        deadline = t0 + args.budget_s * (n_done + 1) / len(sizes)  # what one size leaves unused carries over
        cases = []
        for name, (Hq, Hkv, d) in shared.HEADS.items():
            if d != D:
                continue
            for B, ctx in shared.ROWS:
                copies = shared.kv_copies_for(B, ctx, Hkv, D, True)
                case = shared.make_case(name, Hq, Hkv, D, B, ctx, device=device, copies=copies)
                shared.append((case, copies, shared.reference_out(reference, case)))
        fa3 = [shared.measure(lambda c=c: shared.make_fa3(c), c, ref, copies=n, rep=shared.SWEEP_REP_MS)["us"]
               if fa3_ok else None for c, n, ref in cases]
        default = launch.decode_defaults(D, device)
        seen = {}

        def score(cand, only=None):
            """Geometric-mean µs over the rows (those indexed by ``only``, else all), or None if any row failed
            or was wrong (then never chosen)."""
            key = (cand, only)
            if key in seen:
                return seen[key]["geomean_us"]
            if time.time() > deadline:
                return None
            cfg, pol, pdl = cand
            picked = [cases[i] for i in only] if only else cases
            rows = [shared.measure(lambda c=c: shared.make_ours(launch, c, config=cfg, policy=pol, pdl=pdl), c, ref,
                                  copies=n, rep=shared.SWEEP_REP_MS) for c, n, ref in picked]
            good = all(r["ok"] and r["us"] for r in rows)
            seen[key] = {"config": asdict(cfg), "policy": asdict(pol), "pdl": pdl, "us": [r["us"] for r in rows],
                         "rows": list(only) if only else None, "ok": good,
                         "errors": [r["error"] for r in rows if r["error"]],
                         "geomean_us": geomean([r["us"] for r in rows]) if good else None}
            return seen[key]["geomean_us"]

        def best_of(cands, only=None):
            """The lowest-scoring candidate; the first (the best so far) when none could be scored."""
            scored = [(score(c, only), c) for c in cands]
            scored = [(s, c) for s, c in scored if s is not None]
            return min(scored, key=lambda sc: sc[0])[1] if scored else cands[0]

        cfg, pol, pdl = default
        if 1 in passes:
            cfg, pol, pdl = best_of([default] + [(launch.LaunchConfig(bn, w, st, unsplit=cfg.unsplit), pol, pdl)
                                                 for bn, w, st in itertools.product(
                                                     shared.SWEEP_BLOCK_N, shared.SWEEP_WARPS, shared.SWEEP_STAGES)])
        if 2 in passes:
            cfg, pol, pdl = best_of([(cfg, pol, pdl)] + [(cfg, launch.SplitPolicy(p, k), pdl) for p, k in
                                                         itertools.product(PROGRAMS_PER_SM, SPLIT_KEYS)])
        if 3 in passes:
            cfg, pol, pdl = best_of([(cfg, pol, pdl)] + [
                (cfg, launch.SplitPolicy(p, pol.split_keys, m), pdl) for m in MAX_SPLITS_SWEEP
                for p in sorted({pol.programs_per_sm, 8, 16, 32})])
        if 4 in passes:
            budget = launch.register_budget(pol.programs_per_sm, cfg.num_warps)
            cfg, pol, pdl = best_of([(cfg, pol, pdl)] + ([(cfg, pol, False)] if pdl else [])
                                    + [(cfg, replace(pol, merge_max_slices=m, merge_max_registers=r), pdl)
                                       for m in MERGE_MAX_SLICES_SWEEP for r in ((0, budget) if m else (0,))
                                       if (m, r) != (pol.merge_max_slices, pol.merge_max_registers)])
        # 5. the launch of the rows whose slice cap is 1 under the chosen policy, timed on those rows alone (the
        # others never use it); then per query group (heads per KV head) the launch fastest on that group's rows
        # of the same measurements, where it is not the shared one; then the whole table with and without them
        unsplit_rows = tuple(i for i, (c, _, _) in enumerate(cases) if launch.split_cap(c.B, c.Hkv, device, pol) == 1)
        if unsplit_rows and 5 in passes:
            plain = replace(cfg, unsplit=None, unsplit_by_group=())
            tried = [(plain, pol, pdl)] + [(replace(plain, unsplit=launch.LaunchConfig(bn, w, st)), pol, pdl)
                                           for bn, w, st in itertools.product(shared.SWEEP_BLOCK_N,
                                                                              shared.SWEEP_WARPS, shared.SWEEP_STAGES)]
            won = best_of(tried, only=unsplit_rows)
            grouped = replace(won[0], unsplit_by_group=unsplit_by_group(
                won[0].unsplit, [(c[0].unsplit, seen.get((c, unsplit_rows))) for c in tried],
                [cases[i][0].Hq // cases[i][0].Hkv for i in unsplit_rows]))
            cfg, pol, pdl = best_of([(cfg, pol, pdl), won] + ([(grouped, pol, pdl)] if grouped != won[0] else []))
        best, base = seen.get(((cfg, pol, pdl), None)), seen.get((default, None))
        labels = [f"{c.config} B{c.B} ctx{c.ctx}" for c, _, _ in cases]
        if best is None or not best["ok"]:
            print(f"\nhead size {D}: no candidate ran on every row within the budget; left untuned")
            continue
        print(f"\nhead size {D}: best block_n={cfg.block_n} warps={cfg.num_warps} stages={cfg.num_stages} "
              f"programs_per_sm={pol.programs_per_sm} split_keys={pol.split_keys} max_splits={pol.max_splits} "
              f"pdl={pdl} unsplit={table_entry(cfg, pol, pdl).get('unsplit')}; "
              f"{len(seen)} candidates, {sum(not e['ok'] for e in seen.values())} failed or wrong")
        print(f"  {'row':<28} {'default us':>10} {'best us':>9} {'FA3 us':>8} {'x FA3':>6}")
        for i, label in enumerate(labels):
            d_us = base["us"][i] if base else None
            print(f"  {label:<28} {fmt(d_us, '10.1f'):>10} {best['us'][i]:9.1f} "
                  f"{fmt(fa3[i], '8.1f'):>8} {fmt(ratio(fa3[i], best['us'][i]), '6.2f'):>6}")
        table[str(D)] = table_entry(cfg, pol, pdl)
        doc["head_sizes"][str(D)] = {"rows": labels, "fa3_us": fa3, "default": base, "best": best,
                                     "candidates": list(seen.values())}
        # this head size's tensors go before the next size's are made; emptied, not deleted: score reads the name
        shared.clear()
        torch.cuda.empty_cache()

    out_dir = args.out or results_dir(machine)
    family = policy.family_of(device)
    tuned = {"decode": table, "measured": {"by": "benchmarks/tune_attn_paged.py", "gpu": machine.get("gpu"),
                                           "commit": machine.get("commit"), "objective": "geometric-mean us over "
                                           "bench_attn_paged.ROWS, cold L2, CUDA-graph replays"}}
    packaged = os.path.join(os.path.dirname(policy.__file__), "tuning", f"{family}.json")
    if os.path.exists(packaged):
        with open(packaged) as f:
            tuned = keep_untuned(tuned, json.load(f), args.no_decode)
    if args.prefill_budget_s > 0:
        section, doc["prefill"] = tune_prefill(launch, args.prefill_budget_s, device)
        tuned.setdefault("prefill", {}).update(section)
        if section:
            tuned["measured"] = {**tuned.get("measured", {}), "prefill": {
                "by": "benchmarks/tune_attn_paged.py", "gpu": machine.get("gpu"), "commit": machine.get("commit"),
                "head_sizes": sorted(section, key=int),
                "objective": "geometric-mean us over bench_attn_paged.PREFILL_CASES, CUDA-graph replays"}}
    if not tuned.get("prefill"):
        tuned.pop("prefill", None)
    path = os.path.join(out_dir, f"attn_paged_{family}.json")
    os.makedirs(out_dir, exist_ok=True)
    with open(path, "w") as f:
        json.dump(tuned, f, indent=1)
    doc["tuning_file"] = tuned
    doc["seconds"] = time.time() - t0
    write_json(out_dir, "tune_attn_paged", doc)
    print(f"\nwrote {path} ({doc['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
