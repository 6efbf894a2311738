"""Tune infera-moe-decode on this GPU and write its family's tuning file: profile -> tune -> write -> re-profile.

1. profile: the default blocks against vLLM's ``fused_experts`` (Triton) at M in TOKENS, for every dims in
   bench_moe_decode.DIMS (Qwen3-30B-A3B, DeepSeek-V3, Mixtral routed experts), CUDA-graph replays;
2. tune, per M: the gate/up blocks and pipelining (BLOCK_I, BLOCK_H, warps, stages) with the down blocks
   fixed, then the down form and blocks (expert-grouped + top-k sum, or column-major with the sum fused;
   BLOCK_N, BLOCK_K) with the best gate/up; "best" = the highest geometric mean
   of the speedup over vLLM across the dims (one file serves every model on the family);
3. write ``tuning/<family>.json``: ``by_tokens`` = each M's best blocks, ``max_tokens`` = the largest M up to
   which the tuned kernel is at least as fast as vLLM for every dims at every measured M (0 if it never is:
   the op then hands every call to vLLM, never slower by construction);
4. re-profile through the written file's own lookup; table + JSON under results/<gpu>/ (or $BENCH_OUT).

    python benchmarks/tune_moe_decode.py [--write]   # --write updates the package file

The file also goes to $BENCH_OUT/<family>.json (or /tmp) for runs that use it through INFERA_MOE_DECODE_TUNING.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from _results import describe_machine, results_dir, write_json  # noqa: E402
from bench_moe_decode import DIMS  # noqa: E402

TOKENS = (1, 2, 4, 8, 16)
# one compiled kernel per (warps, stages, blocks): 54 gate/up candidates, then 12 expert-grouped down + 9
# column-major fused-sum down candidates (kernels.py)
GATE_UP = {"block_i": (16, 32, 64), "block_h": (64, 128, 256), "num_warps": (4, 8), "num_stages": (2, 3, 4)}
DOWN = {"block_n": (16, 32, 64, 128), "block_k": (64, 128, 256), "fused_sum": (False,)}
DOWN_FUSED_SUM = {"block_n": (16, 32, 64), "block_k": (64, 128, 256), "fused_sum": (True,)}


def _time(fn) -> float:
    from triton.testing import do_bench_cudagraph

    return do_bench_cudagraph(fn, rep=20) * 1e3


def _grid(space: dict):
    keys = list(space)
    return [dict(zip(keys, values)) for values in itertools.product(*(space[k] for k in keys))]


class Case:
    """One dims at one M: inputs, vLLM's output and time."""

    def __init__(self, dims: str, weights: tuple, M: int):
        from vllm.model_executor.layers.fused_moe.fused_moe import fused_experts

        E, H, I, K = DIMS[dims]
        self.dims, self.M, (self.w13, self.w2) = dims, M, weights
        self.x = torch.randn(M, H, dtype=torch.bfloat16, device="cuda")
        self.weights, ids = torch.randn(M, E, device="cuda").softmax(-1).topk(K)
        self.ids = ids.to(torch.int32)
        self.ref = fused_experts(self.x, self.w13, self.w2, self.weights, self.ids).float()
        self.vllm_us = _time(lambda: fused_experts(self.x, self.w13, self.w2, self.weights, self.ids))

    def time(self, cfg) -> float:
        from infera_ops.moe_decode import ops

        def call():
            return ops.moe_experts(self.x, self.w13, self.w2, self.weights, self.ids, config=cfg)

        err = ((call().float() - self.ref).abs().max() / self.ref.abs().max()).item()
        if not err <= 2e-2:  # a wrong answer (or NaN) is never a candidate
            return float("inf")
        return _time(call)


def _geomean_speedup(cases, cfg) -> tuple[float, list[float]]:
    times = [c.time(cfg) for c in cases]
    speedups = [c.vllm_us / t for c, t in zip(cases, times)]
    return math.exp(sum(math.log(s) for s in speedups) / len(speedups)), times


def tune(write: bool) -> dict:
    from infera_ops.moe_decode import tuning
    from infera_ops.moe_decode.kernels import LaunchConfig
    from infera_vllm.platform import detect_gpu_family

    family, _ = detect_gpu_family()
    torch.manual_seed(0)
    weights = {}
    for dims, (E, H, I, K) in DIMS.items():
        weights[dims] = (torch.randn(E, 2 * I, H, dtype=torch.bfloat16, device="cuda") / H**0.5,
                         torch.randn(E, H, I, dtype=torch.bfloat16, device="cuda") / I**0.5)
    rows, by_tokens = [], {}
    for M in TOKENS:
        cases = [Case(dims, weights[dims], M) for dims in DIMS]
        _, before = _geomean_speedup(cases, LaunchConfig())
        best_gu = max(_grid(GATE_UP), key=lambda g: _geomean_speedup(cases, LaunchConfig(**g))[0])
        best_dn = max(_grid(DOWN) + _grid(DOWN_FUSED_SUM), key=lambda d: _geomean_speedup(cases, LaunchConfig(**best_gu, **d))[0])
        cfg = LaunchConfig(**best_gu, **best_dn)
        gm, tuned = _geomean_speedup(cases, cfg)
        by_tokens[str(M)] = cfg.as_dict()
        for c, t0, t in zip(cases, before, tuned):
            rows.append({"dims": c.dims, "M": M, "vllm_us": c.vllm_us, "default_us": t0, "tuned_us": t,
                         "speedup": c.vllm_us / t, "config": cfg.as_dict()})
            print(f"M={M:<3} {c.dims:<14} vLLM {c.vllm_us:7.1f} us | default blocks {t0:7.1f} us | tuned {t:7.1f} us "
                  f"x{c.vllm_us / t:.2f}", flush=True)
        print(f"M={M:<3} geomean x{gm:.2f} {cfg.as_dict()}", flush=True)
    max_tokens = 0
    for M in TOKENS:  # the largest M up to which every measured (M, dims) is at least vLLM's speed
        if min(r["speedup"] for r in rows if r["M"] == M) < 1.0:
            break
        max_tokens = M
    doc = {"comment": f"written by benchmarks/tune_moe_decode.py on {torch.cuda.get_device_name()} over "
                      f"{', '.join(DIMS)} dims; max_tokens = largest M with the kernel >= vLLM for all of them",
           "max_tokens": max_tokens, "config": by_tokens[str(TOKENS[-1])], "by_tokens": by_tokens}
    if write:
        path = os.path.join(os.path.dirname(tuning.__file__), "tuning", f"{family}.json")
        with open(path, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"wrote {path}")
    # re-profile through the file's own lookup, on fresh inputs
    os.environ["INFERA_MOE_DECODE_TUNING"] = os.path.join(os.environ.get("BENCH_OUT", "/tmp"), f"{family}.json")
    with open(os.environ["INFERA_MOE_DECODE_TUNING"], "w") as f:
        json.dump(doc, f, indent=1)
    loaded = tuning.load(family)
    for M in TOKENS:
        for dims in DIMS:
            case = Case(dims, weights[dims], M)
            t = case.time(loaded.config_for(M))
            row = next(r for r in rows if r["M"] == M and r["dims"] == dims)
            row["reprofile_us"], row["reprofile_vllm_us"] = t, case.vllm_us
            print(f"re-profile M={M:<3} {dims:<14} tuned {t:7.1f} us vs vLLM {case.vllm_us:7.1f} us x{case.vllm_us / t:.2f} "
                  f"(served: {'yes' if M <= loaded.max_tokens else 'no, handed over'})", flush=True)
    return {"family": family, "dims": list(DIMS), "tuning_file": doc, "rows": rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="update the package's tuning/<family>.json")
    args = parser.parse_args()
    machine = describe_machine()
    result = tune(args.write)
    path = write_json(os.environ.get("BENCH_OUT") or results_dir(machine), "tune_moe_decode",
                      {"benchmark": "tune_moe_decode", "machine": machine, **result})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
