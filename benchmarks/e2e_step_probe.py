"""Where a short generation's wall time goes, per attention backend: one engine per backend, in this process's
children (by default ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, so the engine core runs in the timed process and a
profile sees the model runner), each timing prefill-only and full generations the way ``infera-vllm validate``
does (random prompts, ``max_tokens=1`` and ``1 + decode`` greedy tokens) and then profiling a few prefill-only
generations with cProfile (the functions with the most own time, and the attention forwards' cumulative time).

Why: with 256-token prompts on a dummy-weight Llama-3-8B (the validation matrix), ``--attention-backend CUSTOM``
measured a batch-1 prefill of 36-44 ms against FLASH_ATTN's 27-38 ms in the same matrix run, and decode at
batch 16 0.94x, where the decode kernel alone is 0.99x FA3 at those lengths. A 256-token prompt was beyond
those runs' CUDA-graph sizes (``max_num_seqs`` 64: graphs up to 128 tokens), so its forward ran eagerly and
host time per layer counted; decode steps replay CUDA graphs, so there only GPU time counts (``--kernels``).
The probe names where each difference is spent. It captures the graphs validate captures
(``validate.graph_sizes``: a default vLLM's graph for each decode step and each prefill of at most 512
tokens, so the 256-token prefill replays a piecewise graph and only attention runs eagerly between its
pieces); ``--eager-prefill`` captures vLLM's list for ``--max-num-seqs`` alone, as those runs did.

    python3 benchmarks/e2e_step_probe.py --model DIR --backends FLASH_ATTN,TRITON_ATTN,CUSTOM --out $OUT

``CUSTOM`` is attn-paged as ``infera-vllm validate`` runs it alone (``INFERA_VLLM_OPS=attn-paged`` and its
default switch: vLLM's automatic choice); ``CUSTOM-kernel`` the same with ``INFERA_ATTN_PAGED_PREFILL=kernel``
(the ragged kernel instead of FA3 for prefill); ``CUSTOM-selected`` selected by name
(``--attention-backend CUSTOM``); ``FLASH_ATTN-plugin`` FLASH_ATTN with the plugin loaded (its default op
set; on Llama-3-8B none takes a call): what the loaded plugin itself costs. ``--engine-process`` runs the
engine core in its own process as validate does (its timings then compare with validate's directly; the
profile sees only the front end). Writes
``e2e_step_probe.json`` (every time, the profile's top lines; with ``--kernels`` each kernel's GPU time over
one full generation, decode steps included) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import Column, kernel_times_us, table, write_json  # noqa: E402

# label: (vLLM attention backend, None: vLLM's automatic choice; extra environment). CUSTOM runs as
# `infera-vllm validate` runs attn-paged alone: the op's default switch makes it vLLM's automatic choice
_AS_DEFAULT = {"INFERA_VLLM_OPS": "attn-paged", "INFERA_ATTN_PAGED_DEFAULT": "1"}
VARIANTS = {
    "FLASH_ATTN": ("FLASH_ATTN", {"INFERA_VLLM_OPS_DISABLE": "1"}),
    "TRITON_ATTN": ("TRITON_ATTN", {"INFERA_VLLM_OPS_DISABLE": "1"}),
    # the plugin loaded with its default op set, FLASH_ATTN selected: on a model none of whose layers the
    # default set takes (Llama-3-8B), plugin off's work in a process with the plugin in it (its own cost)
    "FLASH_ATTN-plugin": ("FLASH_ATTN", {}),
    "CUSTOM": (None, _AS_DEFAULT),
    "CUSTOM-kernel": (None, {**_AS_DEFAULT, "INFERA_ATTN_PAGED_PREFILL": "kernel"}),
    "CUSTOM-selected": ("CUSTOM", {"INFERA_VLLM_OPS": "attn-paged"}),  # --attention-backend CUSTOM
}


def child(args) -> dict:
    """One backend in this process: engine, timings, then a profile of prefill-only generations."""
    import cProfile
    import pstats
    import random

    from vllm import LLM, SamplingParams

    from infera_vllm.validate import WholeBatches, graph_sizes, time_generations, timed_steps

    backend = VARIANTS[args.variant][0]
    kwargs = dict(max_model_len=args.prompt + args.decode + 17, max_num_seqs=args.max_num_seqs,
                  enable_prefix_caching=False, gpu_memory_utilization=args.gpu_memory_utilization)
    if not args.eager_prefill:  # the graphs validate captures: a default vLLM's for these steps
        sizes = graph_sizes(timed_steps({"batches": args.batches, "prompt_tokens": args.prompt}, real=False))
        kwargs["compilation_config"] = {"cudagraph_capture_sizes": sizes}
    if backend is not None:
        kwargs["attention_config"] = {"backend": backend}
    if not args.real_weights:
        kwargs.update(load_format="dummy", skip_tokenizer_init=True)
    start = time.perf_counter()
    llm = LLM(model=args.model, seed=0, disable_log_stats=False, **kwargs)  # per-request engine timestamps
    startup = time.perf_counter() - start
    vocab = llm.llm_engine.model_config.get_vocab_size()
    rng = random.Random(0)
    prefill = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, detokenize=False)
    full = SamplingParams(max_tokens=1 + args.decode, temperature=0.0, ignore_eos=True, detokenize=False)
    batches = WholeBatches.of(llm)  # each batch's requests reach the scheduler together, as validate adds them
    out = {"variant": args.variant, "backend": backend, "startup_s": startup, "batches": {},
           "whole_batches": batches is not llm}
    for batch in args.batches:
        prompts = [{"prompt_token_ids": [rng.randrange(1, vocab) for _ in range(args.prompt)]} for _ in range(batch)]
        timed = time_generations(batches, prompts, prefill, full, args.repeats)  # as validate times them
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.profiled):
            batches.generate(prompts, prefill, use_tqdm=False)
        prof.disable()
        stats = pstats.Stats(prof)
        rows = sorted(((fn, st[2], st[3], st[1]) for fn, st in stats.stats.items()), key=lambda r: -r[1])
        top = [{"function": f"{Path(f[0]).name}:{f[1]}({f[2]})", "own_s": own / args.profiled,
                "cumulative_s": cum / args.profiled, "calls": calls / args.profiled}
               for f, own, cum, calls in rows[:args.top]]
        forwards = [{"function": f"{Path(f[0]).name}:{f[1]}({f[2]})", "cumulative_s": st[3] / args.profiled,
                     "calls": st[1] / args.profiled}
                    for f, st in stats.stats.items() if f[2] in ("forward", "do_kv_cache_update")
                    and ("attn" in f[0] or "attention" in f[0])]
        kernels = None
        if args.kernels and not args.engine_process:  # GPU time per kernel over one full generation
            import torch

            if torch.cuda.is_available():
                times = kernel_times_us(lambda: llm.generate(prompts, full, use_tqdm=False), reps=1)
                kernels = dict(sorted((times or {}).items(), key=lambda kv: -kv[1])[:args.top])
        out["batches"][str(batch)] = {"prefill_s": timed.pre_wall, "full_s": timed.full_wall,
                                      "prefill_engine_s": timed.pre_engine, "decode_engine_s": timed.decode_engine,
                                      "profile_top": top, "attention_forwards": forwards, "kernels_us": kernels}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a model directory")
    parser.add_argument("--real-weights", action="store_true",
                        help="load the directory's weights (default: vLLM's dummy weights, config.json only)")
    parser.add_argument("--backends", default="FLASH_ATTN,TRITON_ATTN,CUSTOM,CUSTOM-kernel")
    parser.add_argument("--batches", type=lambda v: [int(b) for b in v.split(",")], default=[1, 16])
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--decode", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--profiled", type=int, default=5, help="prefill-only generations under cProfile")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--kernels", action="store_true",
                        help="also each kernel's GPU time over one full generation (torch.profiler; a GPU only)")
    parser.add_argument("--engine-process", action="store_true",
                        help="the engine core in its own process, as vLLM and validate run it (timings as validate's; "
                             "the profile then sees the front end only, and --kernels nothing)")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--eager-prefill", action="store_true",
                        help="vLLM's graphs for --max-num-seqs only (a 256-token prefill then runs eagerly), not "
                             "validate's, which add each prefill's graph up to 512 tokens")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    parser.add_argument("--timeout", type=float, default=240)
    parser.add_argument("--out", default=".")
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:  # a child
        Path(args.result).write_text(json.dumps(child(args)))
        return 0
    labels = args.backends.split(",")
    unknown = [v for v in labels if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown backends {unknown}: one of {list(VARIANTS)}")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = {"model": args.model, "options": {k: v for k, v in vars(args).items() if k not in ("variant", "result")},
           "commit": os.environ.get("INFERA_COMMIT", "unknown"), "results": []}
    for label in labels:
        result = out_dir / f"e2e_step_probe_{label}.json"
        env = dict(os.environ, **VARIANTS[label][1])
        if not args.engine_process:
            env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        cmd = [sys.executable, __file__, *sys.argv[1:], "--variant", label, "--result", str(result)]
        with open(out_dir / f"e2e_step_probe_{label}.log", "w") as log:
            try:
                done = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=args.timeout)
                ok = done.returncode == 0
            except subprocess.TimeoutExpired:
                ok = False
        if not ok or not result.exists():
            print(f"{label}: failed (log {log.name})", flush=True)
            continue
        r = json.loads(result.read_text())
        doc["results"].append(r)
        for b, v in r["batches"].items():
            print(f"{label} B={b}: prefill ms {[round(t * 1e3, 1) for t in v['prefill_s']]} "
                  f"full ms {[round(t * 1e3, 1) for t in v['full_s']]}", flush=True)
            print(table(v["profile_top"][:12], [Column("function", "function", align="<"),
                                                Column("own ms", lambda r: r["own_s"] * 1e3, ".2f"),
                                                Column("cum ms", lambda r: r["cumulative_s"] * 1e3, ".2f"),
                                                Column("calls", "calls", ".0f")]), flush=True)
            for f in v["attention_forwards"]:
                print(f"  {f['function']}: {f['cumulative_s'] * 1e3:.2f} ms over {f['calls']:.0f} calls", flush=True)
            for name, us in (v.get("kernels_us") or {}).items():
                print(f"  GPU {us / 1e3:8.2f} ms  {name[:100]}", flush=True)
        write_json(str(out_dir), "e2e_step_probe", doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
