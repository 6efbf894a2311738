"""``infera-vllm tune linear --model CONFIG``: write this GPU family's tuning table (policy.py).

For every linear shape of the model (from its ``config.json``; qkv / gate-up split N and o / down split K
across ``--tp`` ranks; the LM head is not served) and every token count in ``--tokens``: time vLLM's GEMM
(``F.linear``) and the skinny-M Triton kernel over a grid of blocks, both replayed from CUDA graphs (as vLLM
decodes), discard any candidate that spills or needs more shared memory than the family has (compiled ahead
of time first, ``fitting``) or whose result differs from an fp32 reference, and keep the kernel only where
it is at least ``--margin`` faster (so noise cannot put a slower kernel in the table: the op must never be
slower than ``F.linear`` at a tuned shape). Runs offline, never inside serving.

    infera-vllm tune linear --model /path/to/model [--tp 2] [--out tuning.json] [--dry-run]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

TOKENS = (1, 2, 4, 8, 16, 32, 64)
GRID = {"block_n": (16, 32, 64), "block_k": (128, 256), "split_k": (1, 2, 4), "num_stages": (3, 4)}


def tp_problem(config: str, tp: int) -> str | None:
    """Why vLLM would refuse to shard the model over ``tp`` ranks, with the sizes it would take, or None: the
    attention heads and the (dense or expert) intermediate size split evenly, the KV heads split evenly or
    are replicated (``tp`` a multiple of them), as vLLM's parallel linears require."""
    from infera_vllm.model_sites import load_config, sites

    cfg = load_config(config)
    attn = next(s.attrs for s in sites(cfg) if s.kind == "attention")
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    split = {"attention heads": attn["num_heads"]}
    for key in ("intermediate_size", "moe_intermediate_size"):
        if isinstance(text.get(key), int):
            split[key.replace("_", " ")] = text[key]

    def fits(n: int) -> bool:
        kv = attn["num_kv_heads"]
        return all(size % n == 0 for size in split.values()) and (kv % n == 0 or n % kv == 0)

    if tp >= 1 and fits(tp):
        return None
    limit = max(split.values())
    works = [n for n in range(1, min(limit, 64) + 1) if fits(n)]
    return (f"--tp {tp}: vLLM shards {', '.join(f'{v} {k}' for k, v in split.items())} and "
            f"{attn['num_kv_heads']} KV heads evenly (KV heads may be replicated); sizes that work: "
            + ", ".join(map(str, works)))


def linear_shapes(config: str, tp: int) -> list[dict]:
    """The distinct (n, k, dtype) of the model's linear layers on one of ``tp`` ranks, with the layers'
    names; the LM head left out (vLLM calls its GEMM through another reference). qkv holds each rank's
    query heads and its KV heads (one replica each where ``tp`` exceeds them, as vLLM's QKVParallelLinear);
    gate-up splits N, o and down split K. ``tp`` must be one vLLM accepts (:func:`tp_problem`)."""
    from infera_vllm.model_sites import load_config, sites

    all_sites = sites(load_config(config))
    attn = next(s.attrs for s in all_sites if s.kind == "attention")
    heads, kv, head_dim = attn["num_heads"], attn["num_kv_heads"], attn["head_size"]
    qkv_n = (heads // tp + 2 * max(1, kv // tp)) * head_dim
    shapes: dict[tuple, dict] = {}
    for site in all_sites:
        if site.kind != "linear" or site.attrs.get("lm_head"):
            continue
        n, k = site.attrs["n"], site.attrs["k"]
        if site.name.endswith("qkv_proj"):
            n = qkv_n
        elif site.name.endswith("gate_up_proj"):
            n //= tp
        else:
            k //= tp
        entry = shapes.setdefault((n, k, site.attrs["dtype"]),
                                  {"n": n, "k": k, "dtype": site.attrs["dtype"], "layers": 0, "example": site.name})
        entry["layers"] += 1
    return list(shapes.values())


def _token_counts(text: str) -> tuple[int, ...]:
    """--tokens: comma-separated token counts >= 1."""
    try:
        counts = tuple(int(part) for part in text.split(","))
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated token counts >= 1, e.g. 1,2,4")
    return counts


def _margin(text: str) -> float:
    """--margin: a speedup >= 1 (below 1 the table could choose a slower kernel)."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value >= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a speedup >= 1, e.g. 1.03")
    return value


def _candidates(m: int):
    from infera_ops.linear_hipblaslt.launch import LaunchConfig

    block_m = max(16, min(64, 1 << (m - 1).bit_length()))
    for values in itertools.product(*GRID.values()):
        yield LaunchConfig(block_m=block_m, **dict(zip(GRID, values)))


def compile_args(cfg, dtype: str = "bfloat16", bias: bool = False) -> dict:
    """``infera_vllm.aot.compile_kernel``'s keywords for the skinny-M kernel at ``cfg``, as launch.skinny_linear
    launches it (K, N and the K slice multiples of 16, as the tuned model shapes are; with SPLIT_K > 1 the
    kernel writes fp32 partials)."""
    elem = {"bfloat16": "*bf16", "float16": "*fp16"}[dtype]
    pointers = {"x_ptr": elem, "w_ptr": elem, "bias_ptr": elem, "y_ptr": elem if cfg.split_k == 1 else "*fp32"}
    consts = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=cfg.split_k, HAS_BIAS=bias,
                  FP32_DOT=False)
    return dict(pointers=pointers, constexprs=consts, divisible=("N", "K", "K_PER_SPLIT"),
                num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def fitting(configs, family: str, dtype: str = "bfloat16", log=lambda line: None) -> list:
    """The configs that compile for ``family`` without spilling and within its shared memory (compiled ahead
    of time, infera_vllm.aot): on AMD the larger tiles of GRID need more LDS than a workgroup has, or spill
    on RDNA, and a spilling candidate must not reach the table because it happened to win a timing."""
    from infera_ops.linear_hipblaslt.kernels import _skinny_linear_kernel
    from infera_vllm import aot

    kept = []
    for cfg in configs:
        problems = aot.compile_resources(_skinny_linear_kernel, family, **compile_args(cfg, dtype)).problems()
        if problems:
            log(f"  drop {cfg.as_dict()} on {family}: {'; '.join(problems)}")
        else:
            kept.append(cfg)
    return kept


def tune_shape(shape: dict, tokens: tuple[int, ...], margin: float, log, family: str | None = None) -> dict:
    """The table entry of one shape. ``family``: the GPU family being tuned; where infera_vllm.aot knows it,
    only the candidates that fit it (``fitting``) are timed."""
    import torch
    import torch.nn.functional as F
    from triton.runtime.errors import OutOfResources
    from triton.testing import do_bench_cudagraph

    from infera_ops.linear_hipblaslt import launch
    from infera_ops.linear_hipblaslt.reference import linear_reference
    from infera_vllm import aot

    dtype = getattr(torch, shape["dtype"])
    n, k = shape["n"], shape["k"]
    w = torch.randn(n, k, dtype=dtype, device="cuda") / k**0.5
    buckets, rows = [], []
    for m in tokens:
        x = torch.randn(m, k, dtype=dtype, device="cuda")
        ref = linear_reference(x, w, None)
        scale = ref.abs().max().item()
        default_us = do_bench_cudagraph(lambda: F.linear(x, w), rep=20) * 1e3
        best, best_us = None, float("inf")
        candidates = list(_candidates(m))
        if family in aot.FAMILIES:
            candidates = fitting(candidates, family, shape["dtype"], log)
        for cfg in candidates:
            try:
                got = launch.skinny_linear(x, w, None, cfg)
            except OutOfResources as exc:  # e.g. 64-row tiles with 4 stages exceed shared memory: not a candidate
                log(f"  skip {cfg.as_dict()}: {type(exc).__name__}")
                continue
            if not (got.float() - ref).abs().max().item() <= 2e-2 * scale:
                continue
            us = do_bench_cudagraph(lambda: launch.skinny_linear(x, w, None, cfg), rep=20) * 1e3
            if us < best_us:
                best, best_us = cfg, us
        speedup = default_us / best_us if best else 0.0
        use = best is not None and speedup >= margin
        buckets.append({"max_m": m, "choice": "triton" if use else "default",
                        "speedup": round(speedup if use else 1.0, 3),
                        **({"config": best.as_dict()} if use else {})})
        rows.append({"m": m, "default_us": default_us, "triton_us": best_us, "speedup": speedup,
                     "config": best.as_dict() if best else None})
        log(f"N={n:<6} K={k:<6} M={m:<4} F.linear {default_us:8.1f} us | triton {best_us:8.1f} us x{speedup:.2f} "
            f"-> {'triton' if use else 'default'}")
    return {"entry": {"n": n, "k": k, "dtype": shape["dtype"], "bias": False, "buckets": buckets}, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="infera-vllm tune linear", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="model directory or config.json")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel size the model will be served with")
    parser.add_argument("--tokens", type=_token_counts, default=TOKENS, help="token counts to measure (buckets)")
    parser.add_argument("--margin", type=_margin, default=1.03, help="the kernel's minimum speedup to be chosen")
    parser.add_argument("--out",
                        help="table to write (default: ./<family>.json); existing entries of other shapes are kept")
    parser.add_argument("--dry-run", action="store_true", help="print the shapes that would be tuned, measure nothing")
    args = parser.parse_args(argv)
    try:
        problem = tp_problem(args.model, args.tp)
        shapes = [] if problem else linear_shapes(args.model, args.tp)
    except (FileNotFoundError, ValueError, KeyError) as exc:
        print(f"infera-vllm tune linear: {exc}", file=sys.stderr)
        return 2
    if problem:
        print(f"infera-vllm tune linear: {problem}", file=sys.stderr)
        return 2
    for s in shapes:
        print(f"N={s['n']:<6} K={s['k']:<6} {s['dtype']:<9} x{s['layers']} layers (e.g. {s['example']})")
    if args.dry_run:
        return 0
    import torch

    if not torch.cuda.is_available():
        print("infera-vllm tune linear: needs a GPU (the table holds measurements of this GPU family); "
              "--dry-run lists the shapes", file=sys.stderr)
        return 2
    from infera_vllm.platform import detect_gpu_family

    family = detect_gpu_family()[0] or "unknown"
    out = args.out or f"{family}.json"
    doc = {"entries": []}
    if os.path.exists(out):
        with open(out) as f:
            doc = json.load(f)
    measured = [tune_shape(s, args.tokens, args.margin, lambda line: print(line, flush=True), family) for s in shapes]
    new = {(r["entry"]["n"], r["entry"]["k"], r["entry"]["dtype"], False): r["entry"] for r in measured}
    kept = [e for e in doc["entries"] if (e["n"], e["k"], e["dtype"], e["bias"]) not in new]
    doc = {"comment": f"written by `infera-vllm tune linear` on {torch.cuda.get_device_name()} "
                      f"(torch {torch.__version__}); kernel chosen where >= {args.margin}x F.linear",
           "entries": kept + list(new.values()),
           "measurements": {f"{n}x{k}": r["rows"] for (n, k, _, _), r in zip(new, measured)}}
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {out} ({len(doc['entries'])} shapes)")
    return 0
