"""Tune infera-moe-decode on this GPU and write its family's tuning file: profile -> tune -> write -> re-profile.

1. profile: vLLM's ``fused_experts`` (Triton) at M in TOKENS for every dims in bench_moe_decode.DIMS,
   CUDA-graph replays with a cold L2 (bench_moe_decode.Case);
2. tune, per M and per form (split, persistent; fused, split_sum and stream up to FUSED_UP_TO,
   SPLIT_SUM_UP_TO and STREAM_UP_TO tokens; ``--forms`` picks them): coordinate descent over the launch
   parameters (SEARCH: each form's first launch and space; each parameter swept in turn with the others at
   their best so far,
   PASSES times; the sweep order puts the largest effects first), "best" =
   the highest geometric mean of the speedup over vLLM across the dims (one file serves every model: the
   ``min_programs`` rule fits BLOCK_I to each model's expert size); candidates with a wrong answer excluded;
   ``--baseline FILE`` adds that tuning file's launches for each M (its common one and each dims' own) as
   more candidates (a re-tune of one form keeps what the others had won, per shape too); ``--reuse
   TUNE.json`` takes every candidate's times from an earlier run's JSON (its ``swept`` section) instead of
   sweeping, so a change to the rules below costs only step 4;
3. write ``tuning/<family>.json``: ``by_tokens`` = each M's best launch; ``by_shape`` = per dims and M the
   fastest of the forms' bests (and the baseline's) where that is not ``by_tokens``'s, or the fastest of
   every candidate timed where that is at least SPECIALIST_MARGIN faster still (the geometric mean over the
   dims picks the forms' bests, so a launch best for one expert shape alone is otherwise lost; the margin
   keeps a single lucky timing from being chosen, and step 4 times it again); ``served`` = per dims
   the M at which its launch is at least MIN_SPEEDUP x vLLM (so a serving call is never slower);
   ``max_tokens`` (for expert shapes not measured here) = the largest M up to which every dims is served;
4. re-profile through the written file's own lookup on fresh inputs: a served (dims, M) that is slower than
   vLLM there (below 1.0x, the noise allowance under MIN_SPEEDUP) is no longer served and the file is written
   again, so a lookup that disagrees with the sweep can never ship a slower launch; table + JSON (every
   candidate's time per dims and M too) under results/<gpu>/.

    python benchmarks/tune_moe_decode.py [--write] [--tokens 1,2,4,8,16] [--forms split,...,stream]
                                         [--baseline policy.json] [--reuse tune_moe_decode.json] [--out DIR]
                                         [--fp8]

The file also goes to OUT/<family>.json for runs that use it through INFERA_MOE_DECODE_TUNING.

``--fp8``: the same for FP8 experts, written as the file's ``fp8`` section (the rest of the family's file kept):
block-FP8 weights (bench_moe_decode.make_weights) at every dims, vLLM's Triton FP8 experts as the baseline,
the forms that read FP8 weights (split, split_sum), a candidate's answer checked against the fp32 reference
over the dequantized weights (vLLM's quantizes its activations, so it is no judge of ours).
"""

from __future__ import annotations

import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from _results import arguments, describe_machine, results_dir, write_json  # noqa: E402
from _search import descend  # noqa: E402
from bench_moe_decode import DIMS, Case, make_weights, rel_err, vllm_experts  # noqa: E402

TOKENS = (1, 2, 4, 8, 16)
MIN_SPEEDUP = 1.02  # served where the kernel is at least this much faster than vLLM's in the same run
SPECIALIST_MARGIN = 0.01  # a launch fastest on one dims alone replaces the forms' best there if this much faster
PASSES = 1
FUSED_UP_TO = 4  # the fused form is tried up to this M (its fp32 partials grow with M·TOPK·I/BLOCK_I)
SPLIT_START = dict(form="split", block_i=64, block_h=128, block_n=64, block_k=128, num_warps=4, num_stages=4,
                   min_programs=0, pdl=False, prefetch_down=False, early_down=False, fill_per_sm=0)
SPLIT_SPACE = {"early_down": (False, True), "pdl": (False, True), "prefetch_down": (False, True),
               "block_i": (32, 64, 128), "fill_per_sm": (0, 1), "block_h": (64, 128),
               "num_stages": (2, 3, 4), "block_n": (64, 128), "min_programs": (0, 264)}
FUSED_START = dict(form="fused", block_i=64, block_h=128, block_n=128, num_warps=4, num_stages=3, min_programs=0,
                   pdl=False)
FUSED_SPACE = {"pdl": (False, True), "block_i": (32, 64, 128), "block_h": (64, 128), "num_stages": (2, 3, 4),
               "block_n": (64, 128), "min_programs": (0, 264)}
PERSISTENT_START = dict(form="persistent", block_i=32, block_h=128, block_n=64, block_k=128, num_warps=4,
                        num_stages=4, min_programs=0, pdl=False, programs_per_sm=2)
PERSISTENT_SPACE = {"programs_per_sm": (1, 2, 3, 4), "block_i": (16, 32, 64), "num_warps": (4, 8),
                    "num_stages": (3, 4), "block_n": (64, 128), "block_h": (128, 256), "block_k": (128, 256),
                    "pdl": (False, True)}
SPLIT_SUM_UP_TO = 4  # the split_sum form is tried up to this M (tokens that share an expert each read it)
SPLIT_SUM_START = dict(form="split_sum", block_i=64, block_h=128, block_n=16, block_k=128, num_warps=4,
                       num_stages=4, min_programs=0, pdl=False, fill_per_sm=0, split_i=1)
SPLIT_SUM_SPACE = {"split_i": (1, 2, 4, 8), "block_n": (16, 32, 64), "block_k": (64, 128, 256), "pdl": (False, True),
                   "block_i": (32, 64, 128), "fill_per_sm": (0, 1), "num_stages": (3, 4, 5), "num_warps": (2, 4),
                   "min_programs": (0, 264)}
STREAM_UP_TO = 4  # the stream form is tried up to this M (it does not group tokens by expert either)
# from the H200's best launch so far, tiles up to 128 wide and from 64 to 256 deep both ways (launches
# beyond the GPU's shared memory are refused and score as failed)
STREAM_START = dict(form="stream", block_i=32, block_h=256, block_n=32, block_k=256, num_warps=4, num_stages=4,
                    programs_per_sm=2, prefetch_down=False)
STREAM_SPACE = {"block_h": (64, 128, 256), "block_i": (16, 32, 64, 128), "block_k": (64, 128, 256),
                "block_n": (16, 32, 64, 128), "programs_per_sm": (1, 2, 3), "num_stages": (3, 4, 5),
                "num_warps": (4, 8), "prefetch_down": (False, True)}
# form: (first launch, the space its descent sweeps, the largest M it is tried at)
SEARCH = {"split": (SPLIT_START, SPLIT_SPACE, None), "fused": (FUSED_START, FUSED_SPACE, FUSED_UP_TO),
          "persistent": (PERSISTENT_START, PERSISTENT_SPACE, None),
          "split_sum": (SPLIT_SUM_START, SPLIT_SUM_SPACE, SPLIT_SUM_UP_TO),
          "stream": (STREAM_START, STREAM_SPACE, STREAM_UP_TO)}
FORMS = tuple(SEARCH)


class Scorer:
    """Cases of every dims at one M, vLLM's time on each, and a cache of candidate scores."""

    def __init__(self, weights: dict, M: int, gen: torch.Generator):
        from infera_ops.moe_decode.reference import moe_experts_reference

        self.cases = [Case(weights[d], d, M, gen) for d in DIMS]
        theirs = [vllm_experts(c.scales) for c in self.cases]
        self.want = [c.run(t) if c.scales is None else
                     moe_experts_reference(c.x[0], c.w13, c.w2, *c.routing[0], scales=c.scales).to(c.x[0].dtype)
                     for c, t in zip(self.cases, theirs)]
        self.vllm_us = [c.time_us(t) for c, t in zip(self.cases, theirs)]
        self.seen: dict[tuple, tuple[float, list[float]]] = {}

    def __call__(self, params: dict) -> tuple[float, list[float]]:
        from triton.runtime.errors import OutOfResources

        from infera_ops.moe_decode import launch
        from infera_ops.moe_decode.launch import LaunchConfig

        key = tuple(sorted(params.items()))
        if key not in self.seen:
            cfg = LaunchConfig(**params)

            times = []
            try:
                for case, want in zip(self.cases, self.want):
                    def ours(x, w13, w2, weights, ids, scales=case.scales):
                        return launch.moe_experts(x, w13, w2, weights, ids, config=cfg, scales=scales)

                    ok = rel_err(case.run(ours), want) <= 2e-2  # a wrong answer (or NaN) is never a candidate
                    times.append(case.time_us(ours) if ok else float("inf"))
            except OutOfResources as exc:  # tiles beyond the GPU's shared memory: refused before the launch
                print(f"  not launchable: {params}: {exc}", flush=True)
                times = [float("inf")] * len(self.cases)
            score = math.exp(sum(math.log(v / t) if t < float("inf") else -30 for v, t in zip(self.vllm_us, times))
                             / len(times))
            self.seen[key] = (score, times)
        return self.seen[key]


class RecordedScorer:
    """A Scorer's answers from an earlier run's JSON (``swept[M]``): the candidates' geometric means and
    times per dims, vLLM's times; nothing is run (a launch not recorded scores as failed)."""

    def __init__(self, record: dict):
        if list(record["dims"]) != list(DIMS):
            raise ValueError(f"--reuse: recorded dims {record['dims']} are not this benchmark's {list(DIMS)}")
        self.vllm_us = list(record["vllm_us"])
        self.seen = {tuple(sorted(c["params"].items())): (c["geomean_speedup"], c["us"]) for c in record["candidates"]}

    def __call__(self, params: dict) -> tuple[float, list[float]]:
        return self.seen.get(tuple(sorted(params.items())), (0.0, [float("inf")] * len(DIMS)))

    def best_of(self, form: str) -> dict | None:
        """The recorded candidate of ``form`` with the highest geometric mean (what its descent chose)."""
        mine = [(sc, dict(key)) for key, (sc, _) in self.seen.items() if dict(key).get("form") == form]
        return max(mine, key=lambda sp: sp[0])[1] if mine else None


def specialist(seen: dict, i: int, chosen_us: float, margin: float = SPECIALIST_MARGIN) -> dict | None:
    """The candidate fastest on dims ``i`` among every one timed (``seen``: params key -> (score, times)),
    if it is at least ``margin`` faster there than ``chosen_us`` (the forms' best on that dims); else None."""
    timed = [(times[i], dict(key)) for key, (_, times) in seen.items() if times[i] < float("inf")]
    if not timed:
        return None
    t, params = min(timed, key=lambda tp: tp[0])
    return params if t < chosen_us * (1 - margin) else None


def served_everywhere(served: dict, tokens) -> int:
    """For shapes not measured: the largest M up to which every measured dims is served (0: none)."""
    max_tokens = 0
    for M in tokens:
        if not all(m in served[d] for d in DIMS for m in tokens if m <= M):
            break
        max_tokens = M
    return max_tokens


def baseline_candidates(base, M: int, recorded: dict | None = None) -> tuple[dict | None, list[dict]]:
    """A baseline tuning file's launches at M as candidates: its common one (``by_tokens``) and, each once,
    the other launches its per-shape entries give the dims (a re-tune of one form must not lose a shape's
    specialist). With ``recorded`` (--reuse: params key -> times) only launches that run timed (no time to
    compare otherwise)."""
    from infera_ops.moe_decode import policy

    if base is None:
        return None, []
    common = base.config_for(M).as_dict()
    timed = [p for p in (common, *(base.config_for(M, policy.shape_key(*DIMS[d])).as_dict() for d in DIMS))
             if recorded is None or tuple(sorted(p.items())) in recorded]
    common = common if common in timed else None
    return common, [p for i, p in enumerate(timed) if p != common and p not in timed[:i]]


def tune(tokens, write: bool, out: str, forms=FORMS, baseline: str | None = None, reuse: dict | None = None,
         fp8: bool = False) -> dict:
    from infera_ops.moe_decode import policy
    from infera_vllm.platform import detect_gpu_family

    family, _ = detect_gpu_family()
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    weights = {d: make_weights(d, "block" if fp8 else None) for d in DIMS}
    rows, by_tokens, served, by_shape, swept = [], {}, {d: [] for d in DIMS}, {}, {}
    base = None
    family_file = os.environ.get("INFERA_MOE_DECODE_TUNING") or os.path.join(
        os.path.dirname(policy.__file__), "tuning", f"{family}.json")  # what an fp8 section is written into
    if baseline:
        os.environ["INFERA_MOE_DECODE_TUNING"] = baseline
        base = policy.load(family)
        base = base.fp8 if fp8 and base else base
    for M in tokens:
        if reuse is not None:
            if str(M) not in reuse:
                raise ValueError(f"--reuse: no recorded sweep at M={M}")
            score = RecordedScorer(reuse[str(M)])
            bests = {f: score.best_of(f) if f in forms else None for f in FORMS}
        else:
            score = Scorer(weights, M, gen)

            def cost(p, score=score):  # the geometric-mean speedup over vLLM, highest first
                return -score(p)[0]

            bests = {f: descend(cost, start, space, PASSES) if f in forms and (up_to is None or M <= up_to) else None
                     for f, (start, space, up_to) in SEARCH.items()}
        kept, shape_kept = baseline_candidates(base, M, score.seen if reuse is not None else None)
        candidates = list(filter(None, (*bests.values(), kept))) + shape_kept
        best = max(candidates, key=lambda p: score(p)[0])
        gm, _ = score(best)
        by_tokens[str(M)] = best
        for i, (dims, v) in enumerate(zip(DIMS, score.vllm_us)):
            mine = min(candidates, key=lambda p: (score(p)[1][i], p != best))  # ties keep the common one
            mine = specialist(score.seen, i, score(mine)[1][i]) or mine
            t = score(mine)[1][i]
            if mine != best:
                by_shape.setdefault(policy.shape_key(*DIMS[dims]), {})[str(M)] = mine
            form_us = {f"{name}_best_us": score(p)[1][i] if p else None
                       for name, p in (*bests.items(), ("baseline", kept))}
            rows.append({"dims": dims, "M": M, "vllm_us": v, "tuned_us": t, "speedup": v / t, "config": mine,
                         **form_us})
            print(f"M={M:<3} {dims:<17} vLLM {v:8.1f} us | tuned {t:8.1f} us x{v / t:.2f} ("
                  + ", ".join(f"{k[:-8]} {u:.1f}" for k, u in form_us.items() if u is not None) + ")", flush=True)
        print(f"M={M:<3} geomean x{gm:.3f} over {len(score.seen)} candidates: {best}", flush=True)
        swept[str(M)] = {"dims": list(DIMS), "vllm_us": score.vllm_us,
                         "candidates": [{"params": dict(key), "geomean_speedup": sc, "us": times}
                                        for key, (sc, times) in score.seen.items()]}
    for row in rows:
        if row["speedup"] >= MIN_SPEEDUP:
            served[row["dims"]].append(row["M"])
    max_tokens = served_everywhere(served, tokens)
    section = {"comment": f"written by benchmarks/tune_moe_decode.py{' --fp8' if fp8 else ''} on "
                          f"{torch.cuda.get_device_name()} over {', '.join(DIMS)} dims; served = M where the tuned "
                          f"kernel is >= {MIN_SPEEDUP}x vLLM's {'FP8 ' if fp8 else ''}fused_experts for that expert "
                          "shape; max_tokens for other shapes",
               "min_speedup": MIN_SPEEDUP, "max_tokens": max_tokens, "measured": list(tokens),
               "served": {policy.shape_key(*DIMS[d]): sorted(ms) for d, ms in served.items()},
               "config": by_tokens[str(tokens[-1])], "by_tokens": by_tokens, "by_shape": by_shape}
    doc = section
    if fp8:  # the family's file with this as its fp8 section
        with open(family_file) as f:
            doc = {**json.load(f), "fp8": section}
    path = os.path.join(os.path.dirname(policy.__file__), "tuning", f"{family}.json")

    def save():
        if write:
            with open(path, "w") as f:
                json.dump(doc, f, indent=1)
            print(f"wrote {path}")
        with open(os.environ["INFERA_MOE_DECODE_TUNING"], "w") as f:
            json.dump(doc, f, indent=1)

    os.makedirs(out, exist_ok=True)
    os.environ["INFERA_MOE_DECODE_TUNING"] = os.path.join(out, f"{family}.json")
    save()
    loaded = policy.load(family)
    loaded = loaded.fp8 if fp8 else loaded
    dropped = []
    for M in tokens:  # re-profile through the file's own lookup, on fresh inputs
        score = Scorer(weights, M, gen)
        times = [score(loaded.config_for(M, policy.shape_key(*DIMS[c.dims])).as_dict())[1][i]
                 for i, c in enumerate(score.cases)]
        for case, v, t in zip(score.cases, score.vllm_us, times):
            row = next(r for r in rows if r["M"] == M and r["dims"] == case.dims)
            row["reprofile_us"], row["reprofile_vllm_us"] = t, v
            serves = loaded.serves(M, *DIMS[case.dims])
            print(f"re-profile M={M:<3} {case.dims:<17} {t:8.1f} us vs vLLM {v:8.1f} us x{v / t:.2f} "
                  f"(served: {'yes' if serves else 'no, handed over'})", flush=True)
            if serves and v / t < 1.0:
                dropped.append((case.dims, M))
    if dropped:
        for dims, M in dropped:
            served[dims].remove(M)
            section["served"][policy.shape_key(*DIMS[dims])].remove(M)
            print(f"!!! re-profile: {dims} at M={M} slower than vLLM through the file's lookup: no longer served",
                  flush=True)
        section["max_tokens"] = served_everywhere(served, tokens)
        save()
    return {"family": family, "dims": DIMS, "fp8": fp8, "tuning_file": doc, "rows": rows, "dropped": dropped,
            "swept": swept}


def main() -> int:
    parser = arguments(__doc__)
    parser.add_argument("--write", action="store_true", help="update the package's tuning/<family>.json")
    parser.add_argument("--tokens", default=",".join(map(str, TOKENS)), help="comma-separated token counts")
    parser.add_argument("--forms", default=None, help="comma-separated forms to tune (default: all, or with "
                                                      "--fp8 those that read FP8 weights)")
    parser.add_argument("--fp8", action="store_true", help="FP8 experts: the file's fp8 section")
    parser.add_argument("--baseline", default=None, help="a tuning file whose launch per M is one more candidate")
    parser.add_argument("--reuse", default=None,
                        help="an earlier run's tune_moe_decode.json: its candidates' times instead of a sweep")
    args = parser.parse_args()
    machine = describe_machine()
    out = args.out or results_dir(machine)
    from infera_ops.moe_decode.launch import SCALED_FORMS

    allowed = SCALED_FORMS if args.fp8 else FORMS
    forms = tuple(args.forms.split(",")) if args.forms else allowed
    if not set(forms) <= set(allowed):
        parser.error(f"--forms: expected some of {', '.join(allowed)}")
    reuse = None
    if args.reuse:
        with open(args.reuse) as f:
            reuse = json.load(f)["swept"]
    result = tune(tuple(int(t) for t in args.tokens.split(",")), args.write, out, forms, args.baseline, reuse,
                  args.fp8)
    name = "tune_moe_decode_fp8" if args.fp8 else "tune_moe_decode"
    path = write_json(out, name, {"benchmark": name, "machine": machine, **result})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
