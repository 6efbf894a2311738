"""`infera-vllm doctor` as a user runs it, against the installed vLLM and op wheels."""

import json

import pytest

from conftest import run_python
from infera_vllm import model_sites

LLAMA = {"model_type": "llama", "hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9,
         "num_key_value_heads": 3, "intermediate_size": 1536, "vocab_size": 49152, "torch_dtype": "bfloat16"}
QWEN3_MOE = {"model_type": "qwen3_moe", "hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 32,
             "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 6144, "moe_intermediate_size": 768,
             "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],
             "vocab_size": 151936, "torch_dtype": "bfloat16"}


def doctor(*args, env=None, check=False):
    return run_python("", args=("-m", "infera_vllm", "doctor", *args), env=env, fixture_ops=False, check=check)


def test_sites_of_a_dense_model():
    sites = model_sites.sites(LLAMA)
    kinds = [s.kind for s in sites]
    assert kinds.count("rms_norm") == 2 * 30 + 1
    assert kinds.count("attention") == 30 and kinds.count("moe") == 0
    assert kinds.count("linear") == 4 * 30 + 1
    attn = next(s for s in sites if s.kind == "attention")
    assert (attn.attrs["num_heads"], attn.attrs["num_kv_heads"], attn.attrs["head_size"]) == (9, 3, 64)


def test_sites_of_a_moe_model():
    sites = model_sites.sites(QWEN3_MOE)
    moe = [s for s in sites if s.kind == "moe"]
    assert len(moe) == 48 and moe[0].attrs["num_experts"] == 128 and moe[0].attrs["intermediate_size"] == 768
    assert sum(s.kind == "rms_norm" for s in sites) == 4 * 48 + 1  # + q_norm/k_norm per layer


def test_sites_of_gemma2_and_gpt_oss():
    gemma2 = {**LLAMA, "model_type": "gemma2", "num_hidden_layers": 4}
    assert sum(s.kind == "rms_norm" for s in model_sites.sites(gemma2)) == 4 * 4 + 1  # pre/post MLP norms too
    gpt_oss = {**QWEN3_MOE, "model_type": "gpt_oss", "num_hidden_layers": 2, "num_experts": None,
               "num_local_experts": 32, "hidden_act": "silu"}
    moe = [s.attrs for s in model_sites.sites(gpt_oss) if s.kind == "moe"]
    assert len(moe) == 2 and moe[0]["activation"] == "swigluoai" and moe[0]["bias"] is True
    assert [s.attrs["bias"] for s in model_sites.sites(QWEN3_MOE) if s.kind == "moe"][0] is False


@pytest.mark.cpu_build  # asserts the CPU build's verdicts (Triton ops decline there)
def test_doctor_reports_every_op_and_fails_when_a_requested_op_cannot_activate(tmp_path):
    proc = doctor("--json")
    assert proc.returncode == 0  # nothing named in INFERA_VLLM_OPS: the verdicts are information
    assert doctor("--json", env={"INFERA_VLLM_OPS": "norm"}).returncode == 1  # asked for, and it would decline
    assert doctor("--json", env={"INFERA_VLLM_OPS": "norm", "INFERA_VLLM_OPS_EXCLUDE": "norm"}).returncode == 0
    doc = json.loads(proc.stdout)
    assert doc["environment"]["vllm"] and doc["environment"]["gpu_family"]
    verdicts = {o["op"]: (o["verdict"], o["reason"]) for o in doc["ops"]}
    assert verdicts == {"norm": ("declined", "triton-interpreter-off"),
                        "attn-paged": ("declined", "triton-interpreter-off"),
                        "moe-decode": ("declined", "triton-interpreter-off"),
                        "linear-hipblaslt": ("declined", "not-requested")}
    assert doc["switches"]["INFERA_VLLM_OPS_DISABLE"] is False


def test_doctor_exit_zero_when_nothing_is_requested():
    proc = doctor(env={"INFERA_VLLM_OPS_DISABLE": "1"})
    assert proc.returncode == 0, proc.stderr
    assert "INFERA_VLLM_OPS_DISABLE=True" in proc.stdout and "[disabled]" in proc.stdout


@pytest.mark.cpu_build  # asserts the CPU build's verdicts (Triton ops decline there)
def test_doctor_model_plan(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_MOE))
    proc = doctor("--model", str(tmp_path), env={"INFERA_VLLM_OPS": "moe-decode,norm,ghost"})
    assert proc.returncode == 1
    assert "moe-decode         would take 0/48 moe layers" in proc.stdout
    assert "declines 48 (triton-interpreter-off" in proc.stdout
    assert "norm               would take 0/193 rms_norm layers" in proc.stdout
    assert "ghost" in proc.stdout and "not-installed" in proc.stdout


@pytest.mark.parametrize("path", ["/nonexistent/model"])
def test_doctor_bad_model_path_is_a_clear_error(path):
    proc = doctor("--model", path)
    assert proc.returncode == 2 and "no config.json" in proc.stderr


@pytest.mark.parametrize("content, message", [
    ('{"hidden_size": 64, "num_hidden_layers": 2', "not valid JSON"),
    ("[1, 2]", "a JSON list, not a config object"),
    ('{"num_hidden_layers": 2, "num_attention_heads": 2}', "missing hidden_size"),
])
def test_doctor_bad_config_names_the_file_and_what_is_wrong(tmp_path, content, message):
    (tmp_path / "config.json").write_text(content)
    proc = doctor("--model", str(tmp_path))
    assert proc.returncode == 2 and message in proc.stderr and str(tmp_path / "config.json") in proc.stderr
    assert "Traceback" not in proc.stderr


def test_doctor_says_an_architecture_is_unknown(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(dict(LLAMA, architectures=["BrandNewForCausalLM"])))
    proc = doctor("--model", str(tmp_path))
    assert "unknown architecture (BrandNewForCausalLM)" in proc.stdout, proc.stdout + proc.stderr
    (tmp_path / "config.json").write_text(json.dumps(dict(LLAMA, architectures=["LlamaForCausalLM"])))
    assert "unknown architecture" not in doctor("--model", str(tmp_path)).stdout
