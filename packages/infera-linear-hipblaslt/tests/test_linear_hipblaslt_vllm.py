"""The wrapped GEMM dispatch in the real vLLM 0.32 (CPU build): a tiny random-weight Llama checkpoint
written here, served with the op named and not, with a tuning table written for its shapes. Each linear
call is routed by the table (kernel under Triton's interpreter, ``default-faster``, ``above-table``), the LM
head is counted ``lm-head``, and the outputs are as close to the fp32 model as plugin-off's
(``infera_vllm.testing.assert_no_worse_than_vllm``). Where vLLM's CPU build moves a
linear weight into its own packed GEMM after loading (``dispatch_cpu_unquantized_gemm(remove_weight=True)``,
depending on the CPU's instruction set), those calls must be declined ``weight-replaced`` instead."""

import json
import os
import subprocess
import sys

import pytest
import torch

from infera_vllm.testing import assert_no_worse_than_vllm, result_json, run_script

pytestmark = [pytest.mark.interpret, pytest.mark.cpu_build, pytest.mark.e2e]
if torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("CPU integration test under TRITON_INTERPRET=1 (nox sets it)", allow_module_level=True)

MAKE = r"""
import sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, max_position_embeddings=512, tie_word_embeddings=False)
model = LlamaForCausalLM(cfg).to(torch.bfloat16)
with torch.no_grad():
    for p in model.parameters():
        p.normal_(0, 0.2)
model.save_pretrained(sys.argv[1])
"""

RUN = r"""
import json, os, sys, time
from vllm import LLM, SamplingParams
from infera_vllm.coverage import FLUSH_EVERY_S

def main():
    llm = LLM(model=sys.argv[1], skip_tokenizer_init=True, enforce_eager=sys.argv[2] == "eager", dtype="bfloat16",
              max_model_len=256, seed=0, gpu_memory_utilization=0.2)
    prompts = [{"prompt_token_ids": [(5 * i + 3 * j) % 500 + 1 for j in range(12 + i)]} for i in range(2)]
    params = SamplingParams(max_tokens=6, temperature=0.0, logprobs=0, prompt_logprobs=0, detokenize=False)
    outs = llm.generate(prompts, params, use_tqdm=False)
    res = {"prompts": [p["prompt_token_ids"] for p in prompts],
           "prompt_logprobs": [[pos[tok].logprob for pos, tok in zip(o.prompt_logprobs[1:], o.prompt_token_ids[1:])]
                               for o in outs],
           "steps": [[(t, lp[t].logprob) for lp, t in zip(o.outputs[0].logprobs, o.outputs[0].token_ids)]
                     for o in outs]}
    print("RESULT" + json.dumps(res))
    if os.environ.get("INFERA_VLLM_REPORT_DIR"):  # the engine core rewrites its report while its counts change;
        time.sleep(FLUSH_EVERY_S + 2)  # vLLM may kill it at shutdown, so the last steps' counts are written first

if __name__ == "__main__":
    main()
"""


SMALL = {"block_m": 16, "block_n": 32, "block_k": 32}
TABLE = {"entries": [  # the tiny Llama's shapes: qkv (2 + 2·1 heads x 64), o, gate_up, down
    {"n": 256, "k": 128, "dtype": "bfloat16", "bias": False,
     "buckets": [{"max_m": 64, "choice": "triton", "config": SMALL}]},
    {"n": 128, "k": 128, "dtype": "bfloat16", "bias": False, "buckets": [{"max_m": 64, "choice": "default"}]},
    {"n": 512, "k": 128, "dtype": "bfloat16", "bias": False,
     "buckets": [{"max_m": 64, "choice": "triton", "config": {**SMALL, "split_k": 2}}]},
    {"n": 128, "k": 256, "dtype": "bfloat16", "bias": False,
     "buckets": [{"max_m": 4, "choice": "triton", "config": SMALL}]},  # prefill (25 tokens): above the table
]}


def test_tiny_llama_linear_calls_follow_the_table(tmp_path):
    ckpt = tmp_path / "llama-tiny"
    run_script(MAKE, str(ckpt), env={})
    (tmp_path / "table.json").write_text(json.dumps(TABLE))
    off = run_script(RUN, str(ckpt), "eager", env={"INFERA_VLLM_OPS_DISABLE": "1"})
    report_dir = tmp_path / "report"
    on_env = {"INFERA_VLLM_OPS": "linear-hipblaslt", "INFERA_LINEAR_TUNING": str(tmp_path / "table.json"),
              "INFERA_LINEAR_EAGER": "1"}
    on = run_script(RUN, str(ckpt), "eager", env={**on_env, "INFERA_VLLM_REPORT_DIR": str(report_dir)})
    # compiled (vLLM's Dynamo trace + Inductor on the CPU): the wrapper's Python is traced, the token count is
    # read only inside infera::linear; the engine must start (no specialised graph) and give the same answers
    compiled_dir = tmp_path / "report-compiled"
    compiled = run_script(RUN, str(ckpt), "compiled", env={**on_env, "INFERA_VLLM_REPORT_DIR": str(compiled_dir)})
    # teacher-forced prompt log-probs and greedy steps, each run against the fp32 model (Inductor rounds vLLM's
    # other ops differently, and on random weights near-ties flip tokens: plugin off is no bit-exact reference)
    print(assert_no_worse_than_vllm(str(ckpt), result_json(compiled), result_json(off)))
    print(assert_no_worse_than_vllm(str(ckpt), result_json(on), result_json(off)))

    proc = subprocess.run([sys.executable, "-m", "infera_vllm", "report", str(report_dir), "--json"],
                          capture_output=True, text=True, check=True)
    report = json.loads(proc.stdout)
    assert any(o["op"] == "linear-hipblaslt" and o["status"] == "active" for o in report["ops"]), report["ops"]
    routes = {}
    for c in report["counts"]:
        if c["op"] == "linear-hipblaslt":
            routes[(c["route"], c["reason"])] = routes.get((c["route"], c["reason"]), 0) + c["count"]
    assert routes[("handover", "lm-head")] >= 6, routes  # at least once per generated token
    if ("fallback", "weight-replaced") in routes:  # this CPU's vLLM packs the weights: nothing else may be served
        assert set(routes) == {("fallback", "weight-replaced"), ("handover", "lm-head")}, routes
        return
    # per forward and layer: qkv and gate_up on the kernel, o "default-faster", down on the kernel for the
    # decode steps (2 tokens) and "above-table" for the prefill (25 tokens)
    assert set(routes) == {("kernel", ""), ("handover", "default-faster"), ("handover", "above-table"),
                           ("handover", "lm-head")}, routes
    o_proj = routes[("handover", "default-faster")]  # one o_proj call per layer and forward
    assert o_proj >= 2 * 6 and o_proj % 2 == 0, routes
    assert routes[("kernel", "")] + routes[("handover", "above-table")] == 3 * o_proj, routes
    assert routes[("handover", "above-table")] >= 2, routes
    compiled_report = json.loads(subprocess.run([sys.executable, "-m", "infera_vllm", "report", str(compiled_dir),
                                                 "--json"], capture_output=True, text=True, check=True).stdout)
    assert any(c["op"] == "linear-hipblaslt" and c["route"] == "kernel" for c in compiled_report["counts"])
    # the self-check ran the first kernel call of each shape and bucket against vLLM's GEMM; every one agreed
    checks = [c for c in report["self_check"] if c["op"] == "linear-hipblaslt"]
    assert checks and all(c["failed"] == 0 and c["passed"] >= 1 for c in checks), checks


DIRECT = r"""
import json, torch
from vllm.plugins import load_general_plugins
load_general_plugins()
from infera_vllm import coverage
torch.manual_seed(0)
x = torch.randn(3, 128, dtype=torch.bfloat16)
w = (torch.randn(256, 128) * 0.1).to(torch.bfloat16)
ref = torch.nn.functional.linear(x, w)
diffs = [float((torch.ops.infera.linear(x, w, None).float() - ref.float()).abs().max()) for _ in range(2)]
snap = coverage.snapshot()
print("RESULT" + json.dumps({"diffs": diffs, "self_check": snap["self_check"],
                             "counts": sorted((c["route"], c["reason"], c["count"]) for c in snap["counts"]
                                              if c["op"] == "linear-hipblaslt")}))
"""


@pytest.mark.parametrize("eager", [False, True])
def test_self_check_catches_a_wrong_kernel(tmp_path, eager):
    """A deliberately wrong kernel (INFERA_VLLM_SELF_CHECK_PERTURB scales its outputs by 1.25) behind
    ``infera::linear``: the first call of the shape's bucket is checked and fails, returns vLLM's result,
    and vLLM's GEMM serves the bucket from then on; both calls count as ``self-check-mismatch``. Also when
    eager calls are handed over for launch cost (``eager=False``): the kernel a CUDA graph would bake in is
    checked at vLLM's eager warm-up. Without the perturbation the check passes and the kernel serves."""
    (tmp_path / "table.json").write_text(json.dumps(TABLE))
    env = {"INFERA_VLLM_OPS": "linear-hipblaslt", "INFERA_LINEAR_TUNING": str(tmp_path / "table.json"),
           "INFERA_LINEAR_EAGER": "1" if eager else "0"}
    wrong = result_json(run_script(DIRECT, env={**env, "INFERA_VLLM_SELF_CHECK_PERTURB": "linear-hipblaslt"}))
    assert wrong["diffs"] == [0.0, 0.0], wrong  # vLLM's GEMM (F.linear on the CPU build's layerless path)
    assert wrong["counts"] == [["fallback", "self-check-mismatch", 2]], wrong
    [check] = wrong["self_check"]
    assert (check["bucket"], check["checked"], check["failed"]) == ("256x128 3-4", 1, 1) and check["max_error"] > 0.1

    right = result_json(run_script(DIRECT, env=env))
    [check] = right["self_check"]
    assert (check["checked"], check["passed"]) == (1, 1) and check["max_error"] < 1.6e-2, check
    served = ["kernel", "", 2] if eager else ["handover", "eager-launch-cost", 2]
    assert right["counts"] == [served], right
    assert max(right["diffs"]) < 3e-2 if eager else right["diffs"] == [0.0, 0.0], right
