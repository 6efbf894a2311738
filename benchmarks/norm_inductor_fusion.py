"""What Inductor fuses around the norms of a Qwen3 model (per-head q/k norms before RoPE), plugin off vs
infera-norm first, from the code vLLM's compiled graph generates (``TORCH_LOGS=output_code``).

Runs a 2-layer random-weight Qwen3 written here through vLLM compiled (no CUDA graphs on the CPU build), in
three processes: plugin off, ``INFERA_VLLM_OPS=norm`` (per-head norms left to Inductor, the default), and
the same with ``INFERA_NORM_PER_HEAD_KERNEL=1``. Prints and writes (JSON, ``benchmarks/results/<gpu>/``) the
generated kernels and how many opaque ``infera`` norm calls the graph makes. On the CPU it needs
``TRITON_INTERPRET=1`` for the plugin runs; on a GPU the kernel names are Triton's (``triton_*``).

    TRITON_INTERPRET=1 python benchmarks/norm_inductor_fusion.py
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _results import describe_machine, results_dir, write_json  # noqa: E402

MAKE = r"""
import sys, torch
from transformers import Qwen3Config, Qwen3ForCausalLM
torch.manual_seed(0)
cfg = Qwen3Config(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=64, max_position_embeddings=512, tie_word_embeddings=False)
Qwen3ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(sys.argv[1])
"""

RUN = r"""
import sys
from vllm import LLM, SamplingParams

if __name__ == "__main__":
    llm = LLM(model=sys.argv[1], skip_tokenizer_init=True, dtype="bfloat16", max_model_len=256, seed=0,
              gpu_memory_utilization=0.2)
    llm.generate([{"prompt_token_ids": list(range(1, 30))}], SamplingParams(max_tokens=2, detokenize=False),
                 use_tqdm=False)
"""

RUNS = {"off": {"INFERA_VLLM_OPS_DISABLE": "1"},
        "norm": {"INFERA_VLLM_OPS": "norm"},
        "norm-heads-kernel": {"INFERA_VLLM_OPS": "norm", "INFERA_NORM_PER_HEAD_KERNEL": "1"}}
KERNEL = re.compile(r"\b((?:cpp|triton)_[a-z]+_fused_[A-Za-z0-9_]+|cpp_fused_[A-Za-z0-9_]+)\b")


def generated(log: str) -> dict:
    """The first compiled graph's kernels and the opaque norm calls in its generated code."""
    return {"kernels": sorted(set(KERNEL.findall(log))),
            "infera_rms_norm_calls": log.count("torch.ops.infera.rms_norm.default("),
            "infera_fused_add_calls": log.count("torch.ops.infera.fused_add_rms_norm_.default(")}


def main() -> int:
    work = tempfile.mkdtemp(prefix="norm-fusion-")
    model = os.path.join(work, "qwen3-tiny")
    subprocess.run([sys.executable, "-c", MAKE, model], check=True, capture_output=True)
    results = {}
    for label, env in RUNS.items():
        full = {**os.environ, **env, "TORCH_LOGS": "output_code", "VLLM_DISABLE_COMPILE_CACHE": "1"}
        proc = subprocess.run([sys.executable, "-c", RUN, model], env=full, capture_output=True, text=True,
                              timeout=900)
        if proc.returncode != 0:
            raise SystemExit(f"{label} failed:\n{proc.stderr[-3000:]}")
        results[label] = generated(proc.stdout + proc.stderr)
        print(f"{label:<18} kernels {len(results[label]['kernels'])}, infera rms_norm calls "
              f"{results[label]['infera_rms_norm_calls']}, fused-add calls {results[label]['infera_fused_add_calls']}")
        for k in results[label]["kernels"]:
            print(f"    {k}")
    machine = describe_machine()
    path = write_json(results_dir(machine), "norm_inductor_fusion", {"benchmark": "norm_inductor_fusion",
                                                                      "machine": machine, "model": "qwen3 2 layers",
                                                                      "runs": results})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
