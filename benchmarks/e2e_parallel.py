"""Every op under vLLM's tensor and expert parallelism. Dummy-weight models (config only) served
with tensor parallel 1 and 2, plugin off and on, and for MoE models with expert parallel on; each run in its
own process (each engine's workers load the plugin on their own).

    python benchmarks/e2e_parallel.py --preset h200x2 [--models qwen3-30b-a3b,llama-3-8b,qwen3-8b]
    python benchmarks/e2e_parallel.py --preset h200x2-random   # Qwen3-8B-shaped, one random checkpoint, TP=1 and 2
    python benchmarks/e2e_parallel.py --preset h200-linear     # one GPU: Llama-3-8B-shaped, linear-hipblaslt on/off
    python benchmarks/e2e_parallel.py --preset tiny     # CPU check of this script (2 CPU workers, interpreter)

Per model and run: teacher-forced top-1 on the same random-token prompts (``prompt_logprobs``), compared with
the plugin-off TP=2 run (and the plugin-off TP=1 run where the preset has one); decode throughput at batch 1
and 16 (median of repeats, ratio plugin on/off at the same parallelism); the merged coverage report (every
process, each op's verdict per process, the ops' call counts).

Dummy weights are vLLM's seeded uniform init applied to each rank's own shard: the same model for plugin on
and off at one TP size, but a different model at another TP size (measured on the CPU build: TP=1 vs TP=2
plugin-off agree on 33% of positions). So dummy-weight presets compare on vs off at the same TP size; the
``weights="random"`` presets first write one random-normal safetensors checkpoint (transformers' own init,
seed 0) that every run loads, so TP=1 and TP=2 serve the same model and can be compared.
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

from infera_vllm.harness import compare as _agreement  # noqa: E402
from infera_vllm.harness import median as _median  # noqa: E402
from infera_vllm.validate import preset_path  # noqa: E402

# Qwen3-30B-A3B's config.json (the fields vLLM reads), as the plugin's moe-decode-h200 preset has it
QWEN3_30B_A3B = json.loads(open(preset_path("moe-decode-h200")).read())["models"][0]["config"]


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

DENSE = dict(tie_word_embeddings=False, hidden_act="silu", torch_dtype="bfloat16", rms_norm_eps=1e-5,
             max_position_embeddings=8192, bos_token_id=1, eos_token_id=2)
MODELS = {
    "qwen3-30b-a3b": QWEN3_30B_A3B,
    "llama-3-8b": dict(DENSE, architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=4096,
                       intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                       vocab_size=128256, rope_theta=500000.0),
    "qwen3-8b": dict(DENSE, architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_size=4096,
                     intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=128, vocab_size=151936, rope_theta=1000000.0, rms_norm_eps=1e-6, attention_bias=False),
}
TINY_MOE = dict(hidden_size=128, intermediate_size=256, moe_intermediate_size=32, num_hidden_layers=2,
                num_attention_heads=2, num_key_value_heads=2, head_dim=64, num_experts=8, num_experts_per_tok=2,
                vocab_size=512, max_window_layers=2)
# label: (tensor parallel size, INFERA_VLLM_OPS or None for the plugin off ("": the default ops), expert parallel)
RUNS = {"tp1-off": (1, None, False), "tp2-off": (2, None, False), "tp2-on": (2, "", False),
        "ep2-on": (2, "", True), "tp1-linear": (1, "linear-hipblaslt", False), "tp1-norm": (1, "norm", False),
        "tp1-norm-heads-kernel": (1, "norm", False)}
# per-run switches beyond INFERA_VLLM_OPS (each is in the compile key, so every run compiles its own graph)
RUN_ENV = {"tp1-norm-heads-kernel": {"INFERA_NORM_PER_HEAD_KERNEL": "1"}}
H200 = dict(prompts=8, prompt_tokens=256, batches=(1, 16), max_tokens=128, repeats=3, weights="dummy", shrink={},
            llm=dict(gpu_memory_utilization=0.85, max_model_len=1024, max_num_seqs=16))
PRESETS = {
    # TP=1 left out: with dummy weights it is another model (docstring); MoE first (both ops), then dense
    "h200x2": dict(H200, models=("qwen3-30b-a3b", "llama-3-8b", "qwen3-8b"), runs=("tp2-off", "tp2-on", "ep2-on")),
    "h200x2-random": dict(H200, models=("qwen3-8b",), weights="random", runs=("tp1-off", "tp2-off", "tp2-on")),
    # one GPU: the opt-in linear op alone against the plugin off (its table from `infera-vllm tune linear`)
    "h200-linear": dict(H200, models=("llama-3-8b",), batches=(1, 8), repeats=5, runs=("tp1-off", "tp1-linear")),
    # one GPU: infera-norm alone on Qwen3 (whose per-head q/k norms are RMSNorm layers too), with the q/k
    # norms left to Inductor (default, per-head-fusion) and on the kernel
    "h200-norm-qwen3": dict(H200, models=("qwen3-8b",), weights="random",
                            runs=("tp1-off", "tp1-norm", "tp1-norm-heads-kernel")),
    "tiny": dict(models=("qwen3-30b-a3b",), shrink={"qwen3-30b-a3b": TINY_MOE}, prompts=2, prompt_tokens=24,
                 batches=(1, 4), max_tokens=4, repeats=1, runs=("tp1-off", "tp2-off", "tp2-on"), weights="random",
                 llm=dict(gpu_memory_utilization=0.2, max_model_len=256, max_num_seqs=4, enforce_eager=True)),
}


def run_one(model: str, tp: int, ep: bool, preset: dict, vocab: int) -> dict:
    import random

    from vllm import LLM, SamplingParams

    llm = LLM(model=model, load_format="dummy" if preset["weights"] == "dummy" else "auto", skip_tokenizer_init=True,
              dtype="bfloat16", seed=0, tensor_parallel_size=tp, enable_expert_parallel=ep, **preset["llm"])
    rng = random.Random(0)
    prompts = [[rng.randrange(1, vocab) for _ in range(preset["prompt_tokens"])] for _ in range(preset["prompts"])]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(max_tokens=1, prompt_logprobs=1, temperature=0.0, detokenize=False),
                        use_tqdm=False)
    top1 = [[next(t for t, lp in pos.items() if lp.rank == 1) for pos in o.prompt_logprobs[1:]] for o in outs]
    params = SamplingParams(max_tokens=preset["max_tokens"], temperature=0.0, ignore_eos=True, detokenize=False)
    rates = {}
    for batch in preset["batches"]:
        batch_prompts = [{"prompt_token_ids": prompts[i % len(prompts)][:32]} for i in range(batch)]
        for _ in range(2):  # warm-up outside the timing (first generations of a batch size ran slow)
            llm.generate(batch_prompts, params, use_tqdm=False)
        rates[str(batch)] = []
        for _ in range(preset["repeats"]):
            start = time.perf_counter()
            gen = llm.generate(batch_prompts, params, use_tqdm=False)
            rates[str(batch)].append(sum(len(o.outputs[0].token_ids) for o in gen) / (time.perf_counter() - start))
    return {"top1": top1, "tokens_per_s_all": rates}


def write_random_checkpoint(model: str) -> None:
    """The model directory's config as a bf16 safetensors checkpoint with transformers' random init (seed 0),
    built on the GPU where there is one; run in its own process so the orchestrator holds no GPU memory."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with open(os.path.join(model, "config.json")) as f:
        cfg = json.load(f)
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        net = AutoModelForCausalLM.from_config(config, torch_dtype=torch.bfloat16)
    net.save_pretrained(model, safe_serialization=True)


def _spawn(args: list[str], env_update: dict, report_dir: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("INFERA_VLLM_OPS_DISABLE",)}
    env.update(env_update, INFERA_VLLM_REPORT_DIR=report_dir)
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out_path = f.name
    cmd = [sys.executable, os.path.abspath(__file__), *args, "--result", out_path]
    proc = subprocess.run(cmd, env=env)
    if proc.returncode != 0:
        return {"error": f"exit {proc.returncode}"}
    with open(out_path) as f:
        return json.load(f)


def _coverage(report_dir: str) -> dict | None:
    from infera_vllm import report

    try:
        merged = report.merge(report.load(report_dir))
    except FileNotFoundError:
        return None  # plugin off writes no report
    return {"processes": [f"{p['name']} pid {p['pid']}: {', '.join(p['active']) or '-'}" for p in merged["processes"]],
            "verdicts": [f"{o['op']}: {o['status']} {o['reason']} (x{o['processes']} processes)"
                         for o in merged["ops"]],
            "counts": [f"{c['op']} {c['route']} {c['reason'] or '-'} [{c['bucket']}] at {c['at']}: {c['count']} "
                       f"(x{c['processes']} processes)" for c in merged["counts"]]}


def run_model(name: str, preset_name: str, preset: dict, work: str, save) -> dict:
    cfg = {**MODELS[name], **preset["shrink"].get(name, {})}
    model = os.path.join(work, name)
    os.makedirs(model, exist_ok=True)
    with open(os.path.join(model, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    result = {"model": name, "config": cfg, "weights": preset["weights"], "rows": []}
    if preset["weights"] == "random":
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--write-checkpoint", model])
        if proc.returncode != 0:
            result["rows"].append({"run": "write-checkpoint", "error": f"exit {proc.returncode}"})
            return result
        print(f"[{name}] random checkpoint written in {time.perf_counter() - start:.0f} s", flush=True)
    is_moe = "num_experts" in cfg
    labels = [lb for lb in preset.get("runs", RUNS) if is_moe or not RUNS[lb][2]]
    runs = {}
    for label in labels:
        tp, ops, ep = RUNS[label]
        report_dir = os.path.join(work, f"report-{name}-{label}")
        env = {"INFERA_VLLM_OPS_DISABLE": "1"} if ops is None else {"INFERA_VLLM_OPS": ops} if ops else {}
        env.update(RUN_ENV.get(label, {}))
        if tp > 1 and os.environ.get("INFERA_PARALLEL_CPU_BIND"):  # CPU build: one core per rank
            env["VLLM_CPU_OMP_THREADS_BIND"] = os.environ["INFERA_PARALLEL_CPU_BIND"]
        res = _spawn(["--one", model, "--preset", preset_name, "--tp", str(tp)] + (["--ep"] if ep else []),
                     env, report_dir)
        res["coverage"] = _coverage(report_dir)
        runs[label] = res
        print(f"[{name}] {label}: {res.get('error') or 'ok'}", flush=True)
        result["rows"] = _rows(runs)
        save(result)  # after each run: a time-out keeps what finished
    return result


def _rows(runs: dict) -> list[dict]:
    rows = []
    for label, res in runs.items():
        tp, ops, ep = RUNS[label]
        row = {"run": label, "tp": tp, "plugin": ops is not None, "ops": ops, "expert_parallel": ep,
               "error": res.get("error"), "coverage": res["coverage"]}
        if "top1" in res:
            for ref in ("tp2-off", "tp1-off"):
                if ref != label and "top1" in runs.get(ref, {}):
                    row[f"agreement_vs_{ref}"] = _agreement(runs[ref]["top1"], res["top1"])["agreement"]
            row["tokens_per_s"] = {b: _median(v) for b, v in res["tokens_per_s_all"].items()}
            row["tokens_per_s_all"] = res["tokens_per_s_all"]
            # plugin off at the same TP size and expert-parallel setting (none for ep2-on: no ep2-off run)
            base = next((runs[lb] for lb, (tp_b, ops_b, ep_b) in RUNS.items() if lb in runs and ops_b is None
                         and (tp_b, ep_b) == (tp, ep)), {})
            if ops is not None and "tokens_per_s_all" in base:
                row["ratio_vs_off_same_tp"] = {b: row["tokens_per_s"][b] / _median(base["tokens_per_s_all"][b])
                                               for b in row["tokens_per_s"]}
        rows.append(row)
    return rows


def render(result: dict) -> str:
    lines = [f"== {result['model']}",
             f"{'run':<10} {'agree/tp2-off':>13} {'agree/tp1-off':>13} {'tok/s b=1':>10} {'tok/s b=max':>11} "
             f"{'on/off':>12}"]
    for r in result["rows"]:
        if r["error"]:
            lines.append(f"{r['run']:<10} FAILED ({r['error']})")
            continue
        tps = list(r["tokens_per_s"].values())
        ratio = " ".join(f"{v:.3f}" for v in r.get("ratio_vs_off_same_tp", {}).values())
        a2, a1 = r.get("agreement_vs_tp2-off"), r.get("agreement_vs_tp1-off")
        lines.append(f"{r['run']:<10} {'' if a2 is None else f'{a2:.4f}':>13} {'' if a1 is None else f'{a1:.4f}':>13} "
                     f"{tps[0]:>10.1f} {tps[-1]:>11.1f} {ratio:>12}")
        for line in (r["coverage"] or {}).get("verdicts", []) + (r["coverage"] or {}).get("counts", []):
            if any(op in line for op in ("moe-decode", "norm", "linear-hipblaslt")):
                lines.append(f"           {line}")
    return "\n".join(lines)


def plot(results: list[dict], path: str) -> None:
    """Tokens/s per run and batch, with each batch's weight-traffic ceiling for the run's GPU count (the
    weights split over the ranks, each GPU at the copy ceiling)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    copy_bw = float(os.environ.get("COPY_CEILING_TB_S", "4.27")) * 1e12  # H200 (bench_moe_decode.py)
    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 3.8), squeeze=False)
    for ax, res in zip(axes[0], results):
        ok = [r for r in res["rows"] if not r["error"] and "tokens_per_s" in r]
        batches = list(ok[0]["tokens_per_s"]) if ok else []
        for i, b in enumerate(batches):
            xs = [j + 0.4 * i for j in range(len(ok))]
            ax.bar(xs, [r["tokens_per_s"][b] for r in ok], 0.4, label=f"batch {b}", color=f"C{i}")
            ceiling = [int(b) * r["tp"] / (weight_bytes_per_step(res["config"], int(b)) / copy_bw) for r in ok]
            ax.plot(xs, ceiling, "_", color=f"C{i}", ms=22, mew=2,
                    label=f"batch {b}: weight-traffic ceiling")
        ax.set_xticks([j + 0.2 for j in range(len(ok))], [r["run"] for r in ok])
        ax.set_yscale("log")
        ax.set_ylabel("generated tokens / s")
        gpus = max((r["tp"] for r in ok), default=1)
        ax.set_title(f"{res['model']} ({res.get('weights', 'dummy')} weights), {gpus} x H200", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="h200x2")
    parser.add_argument("--models", help="comma-separated subset of the preset's models")
    parser.add_argument("--out", help="results directory (default benchmarks/results/<gpu>x<count>/)")
    parser.add_argument("--one", metavar="MODEL", help=argparse.SUPPRESS)
    parser.add_argument("--tp", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--ep", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--write-checkpoint", metavar="MODEL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    preset = PRESETS[args.preset]
    if args.write_checkpoint:
        write_random_checkpoint(args.write_checkpoint)
        return 0
    if args.one:
        with open(os.path.join(args.one, "config.json")) as f:
            vocab = json.load(f)["vocab_size"]
        with open(args.result, "w") as f:
            json.dump(run_one(args.one, args.tp, args.ep, preset, vocab), f)
        return 0

    machine = describe_machine()
    out_dir = args.out or results_dir(machine) + "x2"
    work = tempfile.mkdtemp(prefix="e2e-parallel-")
    results = []
    name_of_file = "e2e_parallel" + ("" if args.preset == "h200x2" else f"_{args.preset}")

    def save(current: dict) -> str:
        doc = {"benchmark": "e2e_parallel", "machine": machine, "preset": args.preset, "runs": RUNS,
               "preset_settings": {k: v for k, v in preset.items() if k != "shrink"}, "results": results + [current]}
        path = write_json(out_dir, name_of_file, doc)
        plot(results + [current], path.replace(".json", ".png"))
        return path

    for name in (args.models.split(",") if args.models else preset["models"]):
        results.append(run_model(name, args.preset, preset, work, save))
        print(render(results[-1]), flush=True)
    path = save(results.pop())
    print(f"wrote {path} and the plot beside it")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
