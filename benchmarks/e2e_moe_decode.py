"""End to end: a Qwen3-30B-A3B-shaped MoE model (config only, ``load_format="dummy"``) served by vLLM with
infera-moe-decode on and off; decode throughput at batch 1, 4 and 16, greedy-token agreement, and what the
op's coverage report counted.

    python benchmarks/e2e_moe_decode.py --preset h200 [--rounds 2]   # full 48 layers, compiled + CUDA graphs
    python benchmarks/e2e_moe_decode.py --preset tiny                 # CPU check of this script (interpreter)

Each configuration runs in its own process (the plugin registers once per process). Throughput = generated
tokens / wall time of ``generate`` for B prompts of 32 tokens and 128 greedy tokens each (``ignore_eos``):
127 of the 128 steps are decode steps of B tokens. Drawn beside it: the weight-traffic ceiling at that
batch (bytes of the weights one decode step must read, at the copy bandwidth). Dummy weights are vLLM's
seeded uniform(-1e-3, 1e-3) init, identical in every run, so on and off serve the same model; with such
weights the logits are nearly tied, so token agreement measures flips on ties, not model quality (the CPU
test on a random-normal checkpoint covers that).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _results import describe_machine, results_dir, write_json  # noqa: E402

QWEN3_30B_A3B = dict(  # Qwen/Qwen3-30B-A3B config.json, the fields vLLM reads
    architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", hidden_size=2048, intermediate_size=6144,
    moe_intermediate_size=768, num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
    num_experts=128, num_experts_per_tok=8, decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True,
    vocab_size=151936, max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6,
    tie_word_embeddings=False, hidden_act="silu", attention_bias=False, torch_dtype="bfloat16",
    use_sliding_window=False, sliding_window=None, max_window_layers=48, bos_token_id=151643, eos_token_id=151645)
PRESETS = {
    "h200": dict(config={}, batches=(1, 4, 16), max_tokens=128, repeats=5,
                 llm=dict(gpu_memory_utilization=0.85, max_model_len=1024, max_num_seqs=16)),
    # CPU: the same script on a 2-layer toy of the same family, eager, kernels under Triton's interpreter
    "tiny": dict(config=dict(hidden_size=128, intermediate_size=256, moe_intermediate_size=32, num_hidden_layers=2,
                             num_attention_heads=2, num_key_value_heads=1, head_dim=64, num_experts=8,
                             num_experts_per_tok=2, vocab_size=512, max_window_layers=2),
                 batches=(1, 4), max_tokens=8, repeats=1,
                 llm=dict(gpu_memory_utilization=0.2, max_model_len=256, max_num_seqs=4, enforce_eager=True)),
}
PROMPT_TOKENS = 32
RUNS = {"off": {"INFERA_VLLM_OPS_DISABLE": "1"}, "on": {"INFERA_VLLM_OPS": "moe-decode"}}


def weight_bytes_per_step(cfg: dict, batch: int) -> float:
    """Bytes of weights one decode step of ``batch`` tokens reads (bf16): attention per layer, the MLP (for
    MoE: the router and the expected number of distinct experts under uniform routing), the LM head."""
    h, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    head_dim = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * head_dim, cfg["num_key_value_heads"] * head_dim
    if "num_experts" in cfg:
        experts, k = cfg["num_experts"], cfg["num_experts_per_tok"]
        distinct = experts * (1 - (1 - k / experts) ** batch)
        mlp = h * experts + distinct * 3 * cfg["moe_intermediate_size"] * h
    else:
        mlp = 3 * cfg["intermediate_size"] * h
    return 2.0 * (layers * (h * (q + 2 * kv) + q * h + mlp) + cfg["vocab_size"] * h)


def run_one(model: str, preset: dict) -> dict:
    """In this process: build the engine, then time generation at each batch size."""
    import random

    from vllm import LLM, SamplingParams

    llm = LLM(model=model, load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16", seed=0, **preset["llm"])
    params = SamplingParams(max_tokens=preset["max_tokens"], temperature=0.0, ignore_eos=True, detokenize=False)
    rng = random.Random(0)
    vocab = preset["vocab"]
    out = {}
    for batch in preset["batches"]:
        prompts = [{"prompt_token_ids": [rng.randrange(1, vocab) for _ in range(PROMPT_TOKENS)]} for _ in range(batch)]
        for _ in range(2):  # warm-up outside the timing: on the H200 the first 1-2 generations of a new batch
            llm.generate(prompts, params, use_tqdm=False)  # size ran up to 2x slow (results/h200/moe-decode/)
        rates, tokens = [], None
        for _ in range(preset["repeats"]):
            start = time.perf_counter()
            gen = llm.generate(prompts, params, use_tqdm=False)
            seconds = time.perf_counter() - start
            rates.append(sum(len(o.outputs[0].token_ids) for o in gen) / seconds)
            tokens = tokens or [list(o.outputs[0].token_ids) for o in gen]
        out[str(batch)] = {"tokens_per_s_all": rates, "tokens": tokens}
    return out


def _spawn(label: str, model: str, preset_name: str, report_dir: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("INFERA_VLLM_OPS_DISABLE", "INFERA_VLLM_OPS")}
    env.update(RUNS[label], INFERA_VLLM_REPORT_DIR=report_dir)
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out_path = f.name
    cmd = [sys.executable, os.path.abspath(__file__), "--one", model, "--preset", preset_name, "--result", out_path]
    if subprocess.run(cmd, env=env).returncode != 0:
        raise RuntimeError(f"run {label!r} failed")
    with open(out_path) as f:
        return json.load(f)


def _median(values):
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _agreement(a: list[list[int]], b: list[list[int]]) -> dict:
    same = sum(x == y for ra, rb in zip(a, b) for x, y in zip(ra, rb))
    total = sum(len(r) for r in a)
    first = [next((i for i, (x, y) in enumerate(zip(ra, rb)) if x != y), None) for ra, rb in zip(a, b)]
    return {"agreement": same / total, "first_divergence": first}


def _coverage(report_dir: str) -> dict:
    from infera_vllm import report

    merged = report.merge(report.load(report_dir))
    ops = [o for o in merged["ops"] if o["op"] == "moe-decode"]
    counts = {f"{c['route']}:{c['reason'] or '-'}:{c['bucket']}:{c['at']}": c["count"]
              for c in merged["counts"] if c["op"] == "moe-decode"}
    return {"verdicts": [f"{o['status']} {o['reason']} x{o['processes']}".strip() for o in ops], "counts": counts}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="h200")
    parser.add_argument("--rounds", type=int, default=1, help="alternate off/on this many times (drift lands on both)")
    parser.add_argument("--out", help="results directory (default benchmarks/results/<gpu>/)")
    parser.add_argument("--one", metavar="MODEL", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    preset = dict(PRESETS[args.preset])
    cfg = {**QWEN3_30B_A3B, **preset["config"]}
    preset["vocab"] = cfg["vocab_size"]
    if args.one:
        with open(args.result, "w") as f:
            json.dump(run_one(args.one, preset), f)
        return 0

    machine = describe_machine()
    out_dir = args.out or results_dir(machine)
    work = tempfile.mkdtemp(prefix="e2e-moe-")
    model = os.path.join(work, "qwen3-30b-a3b-shaped")
    os.makedirs(model)
    with open(os.path.join(model, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    runs = {label: [] for label in RUNS}
    for r in range(args.rounds):  # the JSON is rewritten after every round: a cut-off run keeps what it measured
        for label in RUNS:
            report_dir = os.path.join(work, f"report-{label}-r{r}")
            runs[label].append((_spawn(label, model, args.preset, report_dir), report_dir))
        path = summarize(runs, cfg, preset, args, machine, out_dir)
    print(f"wrote {path} and the plot beside it")
    return 0


def summarize(runs: dict, cfg: dict, preset: dict, args, machine: dict, out_dir: str) -> str:
    """Median tokens/s per label and batch over every repeat of every round; ``off_vs_off`` = the ratio of
    the plugin-off medians of the first two rounds (the run-to-run noise a difference must exceed)."""
    ceiling_bw = float(os.environ.get("COPY_CEILING_TB_S", "4.27")) * 1e12  # H200 copy ceiling (bench_moe_decode)
    rows = []
    print(f"{'batch':>5} {'off tok/s':>10} {'on tok/s':>10} {'on/off':>7} {'off/off':>7} {'ceiling':>8} "
          f"{'agreement':>9}")
    for batch in map(str, preset["batches"]):
        samples = {label: [x for res, _ in runs[label] for x in res[batch]["tokens_per_s_all"]] for label in RUNS}
        rate = {label: _median(samples[label]) for label in RUNS}
        rounds_off = [_median(res[batch]["tokens_per_s_all"]) for res, _ in runs["off"]]
        off_vs_off = rounds_off[1] / rounds_off[0] if len(rounds_off) > 1 else None
        agree = _agreement(runs["off"][0][0][batch]["tokens"], runs["on"][0][0][batch]["tokens"])
        ceiling = int(batch) / (weight_bytes_per_step(cfg, int(batch)) / ceiling_bw)
        rows.append({"batch": int(batch), "off_tokens_per_s": rate["off"], "on_tokens_per_s": rate["on"],
                     "ratio": rate["on"] / rate["off"], "off_vs_off": off_vs_off,
                     "spread": {label: (max(v) - min(v)) / rate[label] for label, v in samples.items()},
                     "weight_traffic_ceiling_tokens_per_s": ceiling, "all": samples, **agree})
        print(f"{batch:>5} {rate['off']:>10.1f} {rate['on']:>10.1f} {rate['on'] / rate['off']:>7.3f} "
              f"{off_vs_off if off_vs_off is not None else float('nan'):>7.3f} {ceiling:>8.0f} "
              f"{agree['agreement']:>9.3f}")
    coverage = _coverage(runs["on"][0][1])  # plugin off writes no report
    print("moe-decode coverage (plugin on, first round):", json.dumps(coverage))
    doc = {"benchmark": "e2e_moe_decode", "machine": machine, "preset": args.preset,
           "rounds": len(runs["off"]), "model_config": cfg, "prompt_tokens": PROMPT_TOKENS,
           "max_tokens": preset["max_tokens"], "llm_kwargs": preset["llm"],
           "tuning": os.environ.get("INFERA_MOE_DECODE_TUNING"), "rows": rows, "coverage": coverage}
    path = write_json(out_dir, "e2e_moe_decode" + ("" if args.preset == "h200" else f"_{args.preset}"), doc)
    plot(rows, path.replace(".json", ".png"))
    return path


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["off_tokens_per_s"] for r in rows], 0.4, label="plugin off (vLLM fused_experts)")
    ax.bar([x + 0.2 for x in xs], [r["on_tokens_per_s"] for r in rows], 0.4, label="infera-moe-decode on")
    ax.plot(list(xs), [r["weight_traffic_ceiling_tokens_per_s"] for r in rows], "k_", ms=30, mew=2,
            label="weight-traffic ceiling")
    for x, r in zip(xs, rows):
        ax.annotate(f"x{r['ratio']:.2f}", (x + 0.2, r["on_tokens_per_s"]), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(xs), [f"batch {r['batch']}" for r in rows])
    ax.set_ylabel("generated tokens / s")
    ax.set_yscale("log")
    ax.set_title("Qwen3-30B-A3B-shaped, dummy weights: decode throughput")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
