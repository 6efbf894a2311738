"""Tune infera-moe-decode on this GPU and write its family's tuning file: profile -> tune -> write -> re-profile.

1. profile: the current blocks against vLLM's ``fused_experts`` (Triton) at M in TOKENS, CUDA-graph replays;
2. tune, per M: the gate/up blocks (BLOCK_I, BLOCK_H, warps) with the down blocks fixed, then the down blocks
   (BLOCK_N, BLOCK_K) with the best gate/up;
3. write ``tuning/<family>.json``: ``by_tokens`` = each M's best blocks, ``max_tokens`` = the largest M up to
   which the tuned kernel is at least as fast as vLLM at every measured M (0 if it never is: the op then
   hands every call to vLLM, never slower by construction);
4. re-profile with the written file; table + JSON under results/<gpu>/ (or $BENCH_OUT).

    python benchmarks/tune_moe_decode.py [--dims qwen3-30b-a3b] [--write]   # --write updates the package file

Default dims: the issue's Qwen3-30B-A3B routed experts (E=128, H=2048, I=768, top-8), random routing.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from _results import describe_machine, results_dir, write_json  # noqa: E402
from bench_moe_decode import DIMS  # noqa: E402

TOKENS = (1, 2, 4, 8, 16)
GATE_UP = {"block_i": (16, 32, 64), "block_h": (64, 128, 256), "num_warps": (2, 4, 8)}
DOWN = {"block_n": (32, 64, 128), "block_k": (64, 128, 256)}


def _time(fn) -> float:
    from triton.testing import do_bench_cudagraph

    return do_bench_cudagraph(fn, rep=20) * 1e3


def _grid(space: dict):
    keys = list(space)
    return [dict(zip(keys, values)) for values in itertools.product(*(space[k] for k in keys))]


def tune(dims: str, write: bool) -> dict:
    from vllm.model_executor.layers.fused_moe.fused_moe import fused_experts

    from infera_ops.moe_decode import ops, tuning
    from infera_ops.moe_decode.kernels import LaunchConfig
    from infera_vllm.platform import detect_gpu_family

    family, _ = detect_gpu_family()
    E, H, I, K = DIMS[dims]
    torch.manual_seed(0)
    w13 = torch.randn(E, 2 * I, H, dtype=torch.bfloat16, device="cuda") / H**0.5
    w2 = torch.randn(E, H, I, dtype=torch.bfloat16, device="cuda") / I**0.5
    rows, by_tokens = [], {}
    for M in TOKENS:
        x = torch.randn(M, H, dtype=torch.bfloat16, device="cuda")
        weights, ids = torch.randn(M, E, device="cuda").softmax(-1).topk(K)
        ids = ids.to(torch.int32)
        ref = fused_experts(x, w13, w2, weights, ids).float()
        vllm_us = _time(lambda: fused_experts(x, w13, w2, weights, ids))

        def run(cfg):
            out = ops.moe_experts(x, w13, w2, weights, ids, config=cfg)
            err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
            if err > 2e-2:  # a wrong answer is never a candidate
                return float("inf")
            return _time(lambda: ops.moe_experts(x, w13, w2, weights, ids, config=cfg))

        before = run(LaunchConfig())
        best_gu = min(_grid(GATE_UP), key=lambda g: run(LaunchConfig(**g)))
        best = min(_grid(DOWN), key=lambda d: run(LaunchConfig(**best_gu, **d)))
        cfg = LaunchConfig(**best_gu, **best)
        tuned_us = run(cfg)
        by_tokens[str(M)] = cfg.as_dict()
        rows.append({"M": M, "vllm_us": vllm_us, "default_us": before, "tuned_us": tuned_us,
                     "speedup": vllm_us / tuned_us, "config": cfg.as_dict()})
        print(f"M={M:<3} vLLM {vllm_us:7.1f} us | default blocks {before:7.1f} us | tuned {tuned_us:7.1f} us "
              f"x{vllm_us / tuned_us:.2f} {cfg.as_dict()}", flush=True)
    max_tokens = 0
    for row in rows:  # the largest M up to which every measured M is at least vLLM's speed
        if row["speedup"] < 1.0:
            break
        max_tokens = row["M"]
    doc = {"comment": f"written by benchmarks/tune_moe_decode.py on {torch.cuda.get_device_name()} for {dims} "
                      f"dims (E={E}, H={H}, I={I}, top-{K}); max_tokens = largest M with the kernel >= vLLM",
           "max_tokens": max_tokens, "config": by_tokens[str(TOKENS[-1])], "by_tokens": by_tokens}
    if write:
        path = os.path.join(os.path.dirname(tuning.__file__), "tuning", f"{family}.json")
        with open(path, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"wrote {path}")
    # re-profile through the file's own lookup
    os.environ["INFERA_MOE_DECODE_TUNING"] = os.path.join(os.environ.get("BENCH_OUT", "/tmp"), f"{family}.json")
    with open(os.environ["INFERA_MOE_DECODE_TUNING"], "w") as f:
        json.dump(doc, f, indent=1)
    loaded = tuning.load(family)
    for row in rows:
        M = row["M"]
        x = torch.randn(M, H, dtype=torch.bfloat16, device="cuda")
        weights, ids = torch.randn(M, E, device="cuda").softmax(-1).topk(K)
        ids = ids.to(torch.int32)
        row["reprofile_us"] = _time(lambda: ops.moe_experts(x, w13, w2, weights, ids, config=loaded.config_for(M)))
        row["reprofile_vllm_us"] = _time(lambda: fused_experts(x, w13, w2, weights, ids))
        print(f"re-profile M={M:<3} tuned {row['reprofile_us']:7.1f} us vs vLLM {row['reprofile_vllm_us']:7.1f} us "
              f"(served: {'yes' if M <= loaded.max_tokens else 'no, handed over'})", flush=True)
    return {"family": family, "dims": dims, "tuning_file": doc, "rows": rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dims", choices=sorted(DIMS), default="qwen3-30b-a3b")
    parser.add_argument("--write", action="store_true", help="update the package's tuning/<family>.json")
    args = parser.parse_args()
    machine = describe_machine()
    result = tune(args.dims, args.write)
    path = write_json(os.environ.get("BENCH_OUT") or results_dir(machine), "tune_moe_decode",
                      {"benchmark": "tune_moe_decode", "machine": machine, **result})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
