"""End to end: dummy-weight models served by vLLM with FLASH_ATTN and with infera-attn-paged
(``--attention-backend CUSTOM``), side by side in one process (two engines, each with its own engine-core
process and half the GPU), alternating rounds: decode tok/s and prefill time per (batch, prompt length).

    python benchmarks/e2e_attn_paged.py --preset h200 [--models llama-3-8b] [--rounds 2]
    python benchmarks/e2e_attn_paged.py --preset tiny        # CPU check of this script (both engines alike)

Per row and backend and round: t1 = wall time of ``generate`` of B prompts of P random tokens with one
output token (the prefill, plus one step), t129 = the same with 129 greedy tokens (``ignore_eos``);
prefill time = t1, decode tok/s = B·128 / (t129 - t1). Prefix caching is off, so each call prefills.
Ratios are CUSTOM over FLASH_ATTN: ``decode_ratio`` (tok/s), ``prefill_ratio`` (FLASH_ATTN's time / ours,
so > 1 is faster as well), medians over rounds; ``decode_spread`` is FLASH_ATTN's own relative spread over
its rounds (max/min - 1), the noise floor a difference must exceed. Both engines load the plugin with only
attn-paged enabled (``INFERA_VLLM_OPS=attn-paged``); FLASH_ATTN's engine simply does not select it. Writes
``e2e_attn_paged.json`` (rows ``{model, batch, prompt_tokens, decode_ratio, prefill_ratio, ...}``) and a
plot into --out (default results/<gpu>/attn-paged/).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _results import describe_machine, results_dir, write_json  # noqa: E402

# the dense models' config.json (the fields vLLM reads), as the validation matrix has them
_MATRIX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "validation", "matrix.json")
MODELS = {m["name"]: m["config"] for m in json.load(open(_MATRIX))["models"] if m["name"] in ("llama-3-8b", "qwen3-8b")}

GPT_OSS_20B = dict(  # openai/gpt-oss-20b config.json, the fields vLLM reads; bf16 (no MXFP4 quantization)
    architectures=["GptOssForCausalLM"], model_type="gpt_oss", hidden_size=2880, intermediate_size=2880,
    num_hidden_layers=24, num_attention_heads=64, num_key_value_heads=8, head_dim=64, num_local_experts=32,
    num_experts_per_tok=4, experts_per_token=4, vocab_size=201088, sliding_window=128,
    layer_types=["sliding_attention", "full_attention"] * 12, rope_theta=150000.0, rms_norm_eps=1e-5,
    max_position_embeddings=131072, swiglu_limit=7.0, attention_bias=True, tie_word_embeddings=False,
    rope_scaling={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                  "original_max_position_embeddings": 4096, "truncate": False},
    initial_context_length=4096, hidden_act="silu", torch_dtype="bfloat16", eos_token_id=200002)
ALL_MODELS = {**MODELS, "gpt-oss-20b": GPT_OSS_20B}
ROWS = ((1, 16384), (16, 8192), (64, 2048), (256, 512))  # (batch, prompt tokens)
PRESETS = {
    # gpt-oss-20b with 8 of its 32 experts (its attention exact), so that two engines fit one GPU
    "h200": dict(models=("llama-3-8b",), rows=ROWS, decode_tokens=128, shrink={"gpt-oss-20b": {"num_local_experts": 8}},
                 llm=dict(gpu_memory_utilization=0.43, max_model_len=16384 + 160, max_num_seqs=256,
                          enable_prefix_caching=False)),
    "tiny": dict(models=("llama-3-8b",), rows=((1, 64), (4, 32)), decode_tokens=4,
                 shrink={"llama-3-8b": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                            num_attention_heads=4, num_key_value_heads=2, vocab_size=512)},
                 llm=dict(gpu_memory_utilization=0.1, max_model_len=256, max_num_seqs=4, enforce_eager=True,
                          enable_prefix_caching=False)),
}
BACKENDS = ("FLASH_ATTN", "CUSTOM")


def _timed(llm, prompts, max_tokens: int) -> float:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, detokenize=False)
    start = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    return time.perf_counter() - start


def run_model(name: str, preset: dict, rounds: int, work: str) -> list[dict]:
    import json

    from vllm import LLM

    cfg = dict(ALL_MODELS[name], **preset["shrink"].get(name, {}))
    cfg["max_position_embeddings"] = max(cfg.get("max_position_embeddings", 0), preset["llm"]["max_model_len"])
    on_gpu = preset["llm"].get("enforce_eager") is not True  # the CPU platform has one attention backend
    path = os.path.join(work, name)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)
    engines = {b: LLM(model=path, load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16", seed=0,
                      **({"attention_config": {"backend": b}} if on_gpu else {}), **preset["llm"]) for b in BACKENDS}
    rng = random.Random(0)
    n = preset["decode_tokens"]
    rows = []
    for batch, prompt_tokens in preset["rows"]:
        prompts = [{"prompt_token_ids": [rng.randrange(1, cfg["vocab_size"]) for _ in range(prompt_tokens)]}
                   for _ in range(batch)]
        for llm in engines.values():  # warm-up outside the timing (first calls at a new size run slow)
            _timed(llm, prompts, 2)
        times = {b: {"prefill_s": [], "decode_tok_s": []} for b in BACKENDS}
        for r in range(rounds):
            for b in (BACKENDS if r % 2 == 0 else BACKENDS[::-1]):  # alternate which one goes first
                t1 = _timed(engines[b], prompts, 1)
                tn = _timed(engines[b], prompts, n + 1)
                times[b]["prefill_s"].append(t1)
                times[b]["decode_tok_s"].append(batch * n / max(tn - t1, 1e-9))
        fa, ours = times["FLASH_ATTN"], times["CUSTOM"]
        row = {"model": name, "batch": batch, "prompt_tokens": prompt_tokens, "rounds": rounds,
               "decode_ratio": statistics.median(ours["decode_tok_s"]) / statistics.median(fa["decode_tok_s"]),
               "prefill_ratio": statistics.median(fa["prefill_s"]) / statistics.median(ours["prefill_s"]),
               "decode_spread": max(fa["decode_tok_s"]) / min(fa["decode_tok_s"]) - 1,
               "prefill_spread": max(fa["prefill_s"]) / min(fa["prefill_s"]) - 1, "times": times}
        rows.append(row)
        print(f"{name:<12} B={batch:<4} P={prompt_tokens:<6} decode x{row['decode_ratio']:.3f} "
              f"(FA {statistics.median(fa['decode_tok_s']):.0f} vs ours {statistics.median(ours['decode_tok_s']):.0f}"
              f" tok/s, FA spread {row['decode_spread']:.1%}) prefill x{row['prefill_ratio']:.3f} "
              f"(FA {statistics.median(fa['prefill_s']):.3f} s, spread {row['prefill_spread']:.1%})", flush=True)
    for llm in engines.values():
        del llm
    return rows


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1.6 * len(rows) + 3, 4))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["decode_ratio"] for r in rows], 0.4, label="decode tok/s, CUSTOM / FLASH_ATTN")
    ax.bar([x + 0.2 for x in xs], [r["prefill_ratio"] for r in rows], 0.4, label="prefill speed, CUSTOM / FLASH_ATTN")
    ax.errorbar([x - 0.2 for x in xs], [1.0] * len(rows), yerr=[r["decode_spread"] for r in rows], fmt="none",
                ecolor="k", capsize=4, label="FLASH_ATTN's own spread over rounds")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(list(xs))
    ax.set_xticklabels([f"{r['model']}\nB{r['batch']} x {r['prompt_tokens']}" for r in rows], fontsize=7)
    ax.set_ylabel("ratio (> 1: infera-attn-paged faster)")
    ax.legend(fontsize=7)
    ax.set_title("vLLM end to end, dummy weights, compiled + CUDA graphs: --attention-backend CUSTOM vs FLASH_ATTN",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="h200")
    parser.add_argument("--models", help="comma-separated subset of " + ", ".join(ALL_MODELS))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out")
    args = parser.parse_args()
    preset = PRESETS[args.preset]
    os.environ.setdefault("INFERA_VLLM_OPS", "attn-paged")
    machine = describe_machine()
    out_dir = args.out or os.path.join(results_dir(machine), "attn-paged")
    models = args.models.split(",") if args.models else preset["models"]
    doc = {"benchmark": "e2e_attn_paged", "preset": args.preset, "machine": machine, "rounds": args.rounds,
           "tuning": os.environ.get("INFERA_ATTN_PAGED_TUNING", "packaged"), "rows": []}
    with tempfile.TemporaryDirectory() as work:
        for name in models:
            doc["rows"] += run_model(name, preset, args.rounds, work)
            path = write_json(out_dir, "e2e_attn_paged", doc)  # each model's rows survive a later timeout
    plot(doc["rows"], path.replace(".json", ".png"))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
