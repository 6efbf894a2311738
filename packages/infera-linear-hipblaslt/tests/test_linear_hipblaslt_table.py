"""The tuning table: parsing, errors, lookup; the tuner's shape list; the CLI's tune dispatch."""

import json
import subprocess
import sys

import pytest

from infera_ops.linear_hipblaslt import policy
from infera_ops.linear_hipblaslt.tune import linear_shapes

GOOD = {"entries": [{"n": 64, "k": 32, "dtype": "bfloat16", "bias": False,
                     "buckets": [{"max_m": 16, "choice": "default"},
                                 {"max_m": 4, "choice": "triton", "config": {"block_n": 32, "block_k": 64}}]}]}


def test_lookup_by_shape_and_bucket():
    t = policy.parse(json.dumps(GOOD), "test")
    buckets = t.buckets(64, 32, "bfloat16", False)
    assert [b.max_m for b in buckets] == [4, 16]  # sorted by bound
    assert policy.Table.choose(buckets, 1).choice == "triton" and policy.Table.choose(buckets, 4).config.block_k == 64
    assert policy.Table.choose(buckets, 5).choice == "default"
    assert policy.Table.choose(buckets, 17) is None  # past the last bucket: vLLM's GEMM ("above-table")
    assert t.buckets(64, 32, "bfloat16", True) is None and t.buckets(64, 32, "float16", False) is None  # untuned


def test_digest_follows_the_entries_not_the_source():
    a, b = policy.parse(json.dumps(GOOD), "a.json"), policy.parse(json.dumps(GOOD), "b.json")
    assert a.digest() == b.digest()  # same decisions: the same compiled graph may be reused
    changed = json.loads(json.dumps(GOOD))
    changed["entries"][0]["buckets"][1]["max_m"] = 8
    assert policy.parse(json.dumps(changed), "a.json").digest() != a.digest()  # another table, another graph


@pytest.mark.parametrize("doc, message", [
    ("not json", "not JSON"),
    ({"shapes": []}, "'entries' list"),
    ({"entries": [{"n": 1, "k": 2, "dtype": "bfloat16", "bias": False, "buckets": []}]}, "at least one bucket"),
    ({"entries": [{"n": 1, "k": 2, "dtype": "float32", "bias": False,
                   "buckets": [{"max_m": 1, "choice": "default"}]}]}, "dtype"),
    ({"entries": [{"n": 1, "k": 2, "dtype": "bfloat16", "bias": False,
                   "buckets": [{"max_m": 1, "choice": "cutlass"}]}]}, "choices"),
    ({"entries": [{"n": 1, "k": 2, "dtype": "bfloat16", "bias": False,
                   "buckets": [{"max_m": 1, "choice": "triton", "config": {"block_n": 8}}]}]}, ">= 16"),
    ({"entries": [GOOD["entries"][0], GOOD["entries"][0]]}, "listed twice"),
])
def test_bad_tables_say_what_is_wrong(doc, message):
    with pytest.raises(policy.TableError, match=message):
        policy.parse(doc if isinstance(doc, str) else json.dumps(doc), "bad.json")


def test_override_and_missing_family(monkeypatch, tmp_path):
    monkeypatch.delenv("INFERA_LINEAR_TUNING", raising=False)
    assert policy.load("gfx1151") is None  # no file: not tuned
    assert len(policy.load("cpu")) >= 1
    path = tmp_path / "t.json"
    path.write_text(json.dumps(GOOD))
    monkeypatch.setenv("INFERA_LINEAR_TUNING", str(path))
    assert policy.load("gfx1151").source == str(path)
    monkeypatch.setenv("INFERA_LINEAR_TUNING", str(tmp_path / "missing.json"))
    with pytest.raises(policy.TableError, match="INFERA_LINEAR_TUNING"):
        policy.load("sm90")


def test_tuner_shapes_split_for_tensor_parallel(tmp_path):
    cfg = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
           "num_hidden_layers": 2, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 1000,
           "torch_dtype": "bfloat16"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    one = {(s["n"], s["k"]): s["layers"] for s in linear_shapes(str(tmp_path), 1)}
    # Llama-3-8B's qkv, o, gate-up and down shapes; no LM head
    assert one == {(6144, 4096): 2, (4096, 4096): 2, (28672, 4096): 2, (4096, 14336): 2}
    two = {(s["n"], s["k"]) for s in linear_shapes(str(tmp_path), 2)}
    assert two == {(3072, 4096), (4096, 2048), (14336, 4096), (4096, 7168)}  # column parallel split N, row parallel K


def test_cli_runs_the_ops_tuner(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 256, "intermediate_size": 512,
                                                      "num_hidden_layers": 1, "num_attention_heads": 4,
                                                      "num_key_value_heads": 2, "vocab_size": 100}))
    run = subprocess.run([sys.executable, "-m", "infera_vllm", "tune", "linear-hipblaslt", "--model", str(tmp_path),
                          "--dry-run"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "N=512    K=256" in run.stdout and "x1 layers" in run.stdout  # qkv: (4 + 2·2) heads x 64
    short = subprocess.run([sys.executable, "-m", "infera_vllm", "tune", "linear", "--model", str(tmp_path),
                            "--dry-run"], capture_output=True, text=True)
    assert short.returncode == 0 and short.stdout == run.stdout, short.stderr  # the short `tune linear` form
    nomodel = subprocess.run([sys.executable, "-m", "infera_vllm", "tune", "linear-hipblaslt", "--model",
                              str(tmp_path / "x")], capture_output=True, text=True)
    assert nomodel.returncode == 2 and "no config.json" in nomodel.stderr
    bad = subprocess.run([sys.executable, "-m", "infera_vllm", "tune", "norm"], capture_output=True, text=True)
    assert bad.returncode == 2 and "has no tuner" in bad.stderr and "linear-hipblaslt" in bad.stderr
    missing = subprocess.run([sys.executable, "-m", "infera_vllm", "tune", "nope"], capture_output=True, text=True)
    assert missing.returncode == 2 and "no installed wheel provides it" in missing.stderr


def test_doctor_plan_per_layer(monkeypatch, tmp_path):
    """``doctor --model``'s per-layer answer: a tuned shape is taken, an untuned one and the LM head are not."""
    from infera_ops.linear_hipblaslt.seam import plan
    from infera_vllm.model_sites import Site

    path = tmp_path / "t.json"
    path.write_text(json.dumps(GOOD))
    monkeypatch.setenv("INFERA_LINEAR_TUNING", str(path))
    assert plan(Site("linear", "model.layers.0.mlp.down_proj", {"n": 64, "k": 32, "dtype": "bfloat16"})) is None
    o_proj = Site("linear", "model.layers.0.self_attn.o_proj", {"n": 64, "k": 64, "dtype": "bfloat16"})
    assert plan(o_proj).code == "untuned"
    assert plan(Site("linear", "lm_head", {"n": 64, "k": 32, "dtype": "bfloat16", "lm_head": True})).code == "lm-head"
    monkeypatch.setenv("INFERA_LINEAR_TUNING", str(tmp_path / "missing.json"))
    assert plan(Site("linear", "x", {"n": 64, "k": 32, "dtype": "bfloat16"})).code == "bad-tuning"
