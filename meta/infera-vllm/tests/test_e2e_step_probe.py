"""benchmarks/e2e_step_probe.py on the CPU: a tiny dummy-weight Llama through vLLM's CPU build, so that the
probe's engine arguments, timing, profile and JSON are right before it runs on the GPU machine (there the
backends differ; here vLLM's CPU platform serves every label with its own attention)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.e2e
@pytest.mark.cpu_build
@pytest.mark.parametrize("engine_process", [False, True], ids=["in-process", "engine-process"])
def test_probe_times_and_profiles_a_tiny_model(tmp_path, engine_process):
    model = tmp_path / "tiny-llama"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128, "intermediate_size": 256,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
        "vocab_size": 512, "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "hidden_act": "silu", "tie_word_embeddings": True, "torch_dtype": "bfloat16", "bos_token_id": 1,
        "eos_token_id": 2}))
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "e2e_step_probe.py"), "--model", str(model),
                           "--backends", "FLASH_ATTN", "--batches", "1,2", "--prompt", "16", "--decode", "4",
                           "--repeats", "2", "--profiled", "1", "--gpu-memory-utilization", "0.2", "--out", str(out)]
                          + (["--engine-process"] if engine_process else []),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads((out / "e2e_step_probe.json").read_text())
    (result,) = doc["results"]
    assert result["variant"] == "FLASH_ATTN" and set(result["batches"]) == {"1", "2"}
    for batch in result["batches"].values():
        assert len(batch["prefill_s"]) >= len(batch["full_s"]) == 2  # prefill-only repeats may follow the pairs
        # positive times, never their order: a busy machine can make a prefill-only repeat the slower one
        assert all(t > 0 for t in batch["prefill_s"] + batch["full_s"])
        assert batch["profile_top"] and all(r["own_s"] >= 0 for r in batch["profile_top"])
    assert "FLASH_ATTN B=1: prefill ms" in done.stdout
