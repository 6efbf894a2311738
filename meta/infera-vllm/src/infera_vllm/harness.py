"""End-to-end validation: the same model served with the plugin on and off, compared on real text.

* Teacher-forced agreement: real prose (the standard library's own documentation) is fed as prompts with
  ``prompt_logprobs``; at each position the top-1 next-token prediction of one run is compared with
  another's. Two plugin-off runs give the noise floor; the model's own top-1 accuracy on the text says how
  much room there is to disagree.
* Throughput: chat prompts, greedy, ``ignore_eos``, generated tokens per second, ratio against the first
  plugin-off run of the same invocation.

Each configuration runs in its own Python process (``python -m infera_vllm.harness run-one``) because the
plugin registers once per process: that is also how users see it. ``compare_runs`` runs such a comparison
(the CPU end-to-end test with broken op wheels installed runs on it); ``infera-vllm validate`` uses this
module's agreement, corpus and median helpers.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

# Real text, the same on every machine that has a CPython: module documentation, human-written prose.
CORPUS_MODULES = ("argparse", "doctest", "decimal", "logging", "pickle", "unittest", "typing", "json",
                  "textwrap", "inspect", "collections", "functools", "subprocess", "threading", "email")

QUESTIONS = ("Explain how a hash table works.", "Write a short poem about the sea.",
             "What is the capital of France and why is it famous?", "Give three tips for learning Python.",
             "Describe the water cycle.", "Why is the sky blue?", "Summarise the plot of Hamlet.",
             "How do vaccines work?")


def corpus_text() -> str:
    import importlib
    import inspect

    parts = []
    for name in CORPUS_MODULES:
        mod = importlib.import_module(name)
        parts.append(inspect.getdoc(mod) or "")
        for attr in sorted(dir(mod)):
            obj = getattr(mod, attr, None)
            if not attr.startswith("_") and (inspect.isclass(obj) or inspect.isfunction(obj)):
                if getattr(obj, "__module__", None) == name:
                    parts.append(inspect.getdoc(obj) or "")
    return "\n\n".join(p for p in parts if p)


def corpus_prompts(tokenizer, count: int, length: int) -> list[list[int]]:
    ids = tokenizer(corpus_text(), add_special_tokens=False)["input_ids"]
    if len(ids) < count * length:
        raise ValueError(f"corpus has {len(ids)} tokens, {count} x {length} asked")
    return [ids[i * length:(i + 1) * length] for i in range(count)]


@dataclass
class RunConfig:
    label: str
    plugin: bool
    model: str
    llm_kwargs: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)
    agreement_prompts: int = 8
    agreement_tokens: int = 1500
    throughput_prompts: int = 256
    max_tokens: int = 256
    repeats: int = 1  # timed generations; the median is reported (one 256 x 256 batch is ~2 s on an H200)


def run_one(cfg: RunConfig) -> dict:
    """In this process: build an ``LLM``, take teacher-forced top-1s and time generation."""
    from vllm import LLM, SamplingParams

    llm = LLM(model=cfg.model, seed=0, **cfg.llm_kwargs)
    tokenizer = llm.get_tokenizer()
    prompts = corpus_prompts(tokenizer, cfg.agreement_prompts, cfg.agreement_tokens)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(max_tokens=1, prompt_logprobs=1, temperature=0.0), use_tqdm=False)
    top1 = []
    for out in outs:
        row = []
        for pos in out.prompt_logprobs[1:]:  # position 0 has no prediction
            row.append(next(tok for tok, lp in pos.items() if lp.rank == 1))
        top1.append(row)
    chats = [tokenizer.apply_chat_template([{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
                                           tokenize=False, add_generation_prompt=True)
             for i in range(cfg.throughput_prompts)]
    params = SamplingParams(max_tokens=cfg.max_tokens, temperature=0.0, ignore_eos=True)
    llm.generate(chats[: min(8, len(chats))], params, use_tqdm=False)  # warm-up outside the timing
    rates, seconds = [], []
    for _ in range(cfg.repeats):
        start = time.perf_counter()
        gen = llm.generate(chats, params, use_tqdm=True)
        seconds.append(time.perf_counter() - start)
        generated = sum(len(o.outputs[0].token_ids) for o in gen)
        rates.append(generated / seconds[-1])
    median = _median(rates)
    return {"label": cfg.label, "plugin": cfg.plugin, "prompts": prompts, "top1": top1,
            "sample": gen[0].outputs[0].text[:300], "generated_tokens": generated, "seconds": seconds,
            "tokens_per_s": median, "tokens_per_s_all": rates}


def compare(a: list[list[int]], b: list[list[int]]) -> dict:
    """Top-1 agreement over all positions, with where they differ (prompt index, position)."""
    positions, diffs = 0, []
    for i, (ra, rb) in enumerate(zip(a, b, strict=True)):
        for j, (x, y) in enumerate(zip(ra, rb, strict=True)):
            positions += 1
            if x != y:
                diffs.append((i, j + 1))
    return {"positions": positions, "agreement": 1 - len(diffs) / positions if positions else 1.0,
            "disagreements": diffs}


def accuracy(top1: list[list[int]], prompts: list[list[int]]) -> float:
    """How often the model's top-1 is the text's actual next token."""
    hits = total = 0
    for row, ids in zip(top1, prompts, strict=True):
        for pred, actual in zip(row, ids[1:], strict=True):
            hits += pred == actual
            total += 1
    return hits / total


def _spawn(cfg: RunConfig, report_dir: str) -> dict:
    env = {**os.environ, **cfg.env, "INFERA_VLLM_REPORT_DIR": report_dir}
    env.pop("INFERA_VLLM_OPS_DISABLE", None)
    if not cfg.plugin:
        env["INFERA_VLLM_OPS_DISABLE"] = "1"
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(asdict(cfg), f)
        cfg_path = f.name
    out_path = cfg_path + ".out"
    proc = subprocess.run([sys.executable, "-m", "infera_vllm.harness", "run-one", cfg_path, out_path], env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"run {cfg.label!r} exited {proc.returncode}")
    with open(out_path) as f:
        return json.load(f)


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


_median = median


def compare_runs(configs: list[RunConfig], work_dir: str, rounds: int = 1) -> dict:
    """Run each configuration in its own process, then compare every run with the first plugin-off run.

    With ``rounds`` > 1 the configurations run in turn (A B A B ...), so slow drift of the machine (clocks,
    host load) lands on every configuration alike; a run's throughput is then the median of its rounds'
    medians. Agreement uses the first round (greedy teacher forcing is deterministic per configuration).
    """
    by_label: dict[str, list[dict]] = {cfg.label: [] for cfg in configs}
    for round_index in range(rounds):
        for cfg in configs:
            suffix = f"-r{round_index}" if rounds > 1 else ""
            report_dir = os.path.join(work_dir, f"report-{cfg.label}{suffix}")
            os.makedirs(report_dir, exist_ok=True)
            res = _spawn(cfg, report_dir)
            res["report_dir"] = report_dir
            by_label[cfg.label].append(res)
    results = []
    for cfg in configs:
        runs = by_label[cfg.label]
        first = dict(runs[0])
        first["tokens_per_s"] = _median([r["tokens_per_s"] for r in runs])
        first["tokens_per_s_all"] = [x for r in runs for x in r["tokens_per_s_all"]]
        first["tokens_per_s_rounds"] = [r["tokens_per_s"] for r in runs]
        results.append(first)
    base = next(r for r in results if not r["plugin"])
    summary = {"runs": [], "rounds": rounds, "model_accuracy": accuracy(base["top1"], base["prompts"])}
    for r in results:
        row = {"label": r["label"], "plugin": r["plugin"], "tokens_per_s": r["tokens_per_s"],
               "throughput_ratio": r["tokens_per_s"] / base["tokens_per_s"], "sample": r["sample"],
               "report_dir": r["report_dir"], "generated_tokens": r["generated_tokens"], "seconds": r["seconds"],
               "tokens_per_s_all": r["tokens_per_s_all"], "tokens_per_s_rounds": r["tokens_per_s_rounds"]}
        if r is not base:
            row["vs_" + base["label"]] = compare(base["top1"], r["top1"])
        summary["runs"].append(row)
    return summary


def render(summary: dict) -> str:
    lines = [f"model top-1 accuracy on the text: {summary['model_accuracy']:.3f}",
             f"{'run':<12} {'plugin':<7} {'tok/s':>10} {'ratio':>7} {'agreement':>10} {'positions':>9} {'diffs':>6}"]
    for r in summary["runs"]:
        cmp = next((v for k, v in r.items() if k.startswith("vs_")), None)
        agree = f"{cmp['agreement']:.4f}" if cmp else "(base)"
        lines.append(f"{r['label']:<12} {str(r['plugin']):<7} {r['tokens_per_s']:>10.1f} {r['throughput_ratio']:>7.3f} "
                     f"{agree:>10} {cmp['positions'] if cmp else '':>9} {len(cmp['disagreements']) if cmp else '':>6}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infera_vllm.harness")
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("run-one", help="internal: one configuration in this process")
    one.add_argument("config")
    one.add_argument("out")
    args = parser.parse_args(argv)
    with open(args.config) as f:
        cfg = RunConfig(**json.load(f))
    result = run_one(cfg)
    with open(args.out, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
