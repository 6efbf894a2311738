"""Tune infera-attn-paged's decode kernel for this GPU: per head size, the launch config, the split policy
and programmatic dependent launch that give the lowest geometric-mean time over the decode table's rows
(bench_attn_paged.py's ROWS for every head config of that size), in three passes, each from the best of
the last:

1. launch configs (block_n x warps x stages) under the current defaults' split policy and PDL;
2. split policies (programs per SM x fewest keys per slice) at that launch config;
3. PDL off (where the GPU has it).

Every candidate is checked against the fp32 reference on every row (a wrong candidate is never chosen) and
timed from CUDA-graph replays with a cold L2, as in the benchmark. Writes ``attn_paged_<family>.json`` (the
op's tuning format, tuning.py, with what was measured) and ``tune_attn_paged.json`` (every candidate) into
BENCH_OUT (default results/<gpu>/); the op reads the first from its ``tuning/`` folder once committed there,
or from ``INFERA_ATTN_PAGED_TUNING``.

    python benchmarks/tune_attn_paged.py [--budget-s 300]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import time
from dataclasses import asdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_attn_paged as bench  # noqa: E402
import torch  # noqa: E402
from _results import describe_machine, results_dir, write_json  # noqa: E402

PROGRAMS_PER_SM = (4, 8, 16, 32, 64)
SPLIT_KEYS = (64, 128, 256, 512)


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget-s", type=float, default=300.0,
                        help="stop starting candidates after this (shared out over the head sizes)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("tune_attn_paged: needs a CUDA GPU", file=sys.stderr)
        return 1
    t0 = time.time()
    ops, reference, ours_from = bench.import_ours()
    from infera_ops.attn_paged import tuning

    device = torch.device("cuda")
    machine = describe_machine()
    fa3_ok, _ = bench.fa3_status()
    torch.manual_seed(0)
    sizes = sorted({D for _, _, D in bench.HEADS.values()})
    doc = {"benchmark": "tune_attn_paged", "machine": machine, "ours_from": ours_from, "head_sizes": {}}
    table = {}
    for n_done, D in enumerate(sizes):
        deadline = t0 + args.budget_s * (n_done + 1) / len(sizes)  # what one size leaves unused carries over
        cases = []
        for name, (Hq, Hkv, d) in bench.HEADS.items():
            if d != D:
                continue
            for B, ctx in bench.ROWS:
                copies = bench.kv_copies_for(B, ctx, Hkv, D, True)
                case = bench.make_case(name, Hq, Hkv, D, B, ctx, device=device, copies=copies)
                cases.append((case, copies, bench.reference_out(reference, case)))
        fa3 = [bench.measure(lambda c=c: bench.make_fa3(c), c, ref, copies=n, rep=bench.SWEEP_REP_MS)["us"]
               if fa3_ok else None for c, n, ref in cases]
        default = ops.decode_defaults(D, device)
        seen = {}

        def score(cand):
            """Geometric-mean µs over the rows, or None if any row failed or was wrong (then never chosen)."""
            if cand in seen:
                return seen[cand]["geomean_us"]
            if time.time() > deadline:
                return None
            cfg, pol, pdl = cand
            rows = [bench.measure(lambda c=c: bench.make_ours(ops, c, config=cfg, policy=pol, pdl=pdl), c, ref,
                                  copies=n, rep=bench.SWEEP_REP_MS) for c, n, ref in cases]
            good = all(r["ok"] and r["us"] for r in rows)
            seen[cand] = {"config": asdict(cfg), "policy": asdict(pol), "pdl": pdl, "us": [r["us"] for r in rows],
                          "ok": good, "errors": [r["error"] for r in rows if r["error"]],
                          "geomean_us": geomean([r["us"] for r in rows]) if good else None}
            return seen[cand]["geomean_us"]

        def best_of(cands):
            scored = [(score(c), c) for c in cands]
            scored = [(s, c) for s, c in scored if s is not None]
            return min(scored, key=lambda sc: sc[0])[1] if scored else default

        cfg, pol, pdl = best_of([default] + [(ops.LaunchConfig(bn, w, st), default[1], default[2]) for bn, w, st in
                                             itertools.product(bench.SWEEP_BLOCK_N, bench.SWEEP_WARPS,
                                                               bench.SWEEP_STAGES)])
        cfg, pol, pdl = best_of([(cfg, pol, pdl)] + [(cfg, ops.SplitPolicy(p, k), pdl) for p, k in
                                                     itertools.product(PROGRAMS_PER_SM, SPLIT_KEYS)])
        cfg, pol, pdl = best_of([(cfg, pol, pdl)] + ([(cfg, pol, False)] if pdl else []))
        best, base = seen.get((cfg, pol, pdl)), seen.get(default)
        labels = [f"{c.config} B{c.B} ctx{c.ctx}" for c, _, _ in cases]
        if best is None or not best["ok"]:
            print(f"\nhead size {D}: no candidate ran on every row within the budget; left untuned")
            continue
        print(f"\nhead size {D}: best block_n={cfg.block_n} warps={cfg.num_warps} stages={cfg.num_stages} "
              f"programs_per_sm={pol.programs_per_sm} split_keys={pol.split_keys} pdl={pdl}; "
              f"{len(seen)} candidates, {sum(not e['ok'] for e in seen.values())} failed or wrong")
        print(f"  {'row':<28} {'default us':>10} {'best us':>9} {'FA3 us':>8} {'x FA3':>6}")
        for i, label in enumerate(labels):
            d_us = base["us"][i] if base else None
            print(f"  {label:<28} {bench.fmt(d_us, '10.1f'):>10} {best['us'][i]:9.1f} "
                  f"{bench.fmt(fa3[i], '8.1f'):>8} {bench.fmt(bench.ratio(fa3[i], best['us'][i]), '6.2f'):>6}")
        table[str(D)] = {**asdict(cfg), **asdict(pol), "pdl": bool(pdl)}
        doc["head_sizes"][str(D)] = {"rows": labels, "fa3_us": fa3, "default": base, "best": best,
                                     "candidates": list(seen.values())}
        # this head size's tensors go before the next size's are made; emptied, not deleted: score reads the name
        cases.clear()
        torch.cuda.empty_cache()

    out_dir = os.environ.get("BENCH_OUT") or results_dir(machine)
    family = tuning.family_of(device)
    tuned = {"decode": table, "measured": {"by": "benchmarks/tune_attn_paged.py", "gpu": machine.get("gpu"),
                                           "commit": machine.get("commit"), "objective": "geometric-mean us over "
                                           "bench_attn_paged.ROWS, cold L2, CUDA-graph replays"}}
    # this tunes decode only: the family's packaged prefill launch sizes (chosen to compile without spills) stay
    packaged = os.path.join(os.path.dirname(tuning.__file__), "tuning", f"{family}.json")
    if os.path.exists(packaged):
        with open(packaged) as f:
            tuned.update({k: v for k, v in json.load(f).items() if k == "prefill"})
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
