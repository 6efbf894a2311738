"""The out-of-tree MoE method in the real vLLM 0.32 (CPU build), kernels under Triton's interpreter: a tiny
random-weight Qwen3-MoE checkpoint written here, served with the plugin on and off; the method is chosen,
decode steps reach the kernel, prefill chunks above the threshold are handed over, and the plugin-on outputs
are as close to the fp32 model as vLLM's own (``infera_vllm.testing.assert_no_worse_than_vllm``: on random
weights the logits hold near-ties, so token-by-token equality with plugin off would pass or fail by machine).
A block-FP8 checkpoint of the same family reaches the kernel through vLLM's FP8 MoE method."""

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

# random, not zeros: a routing or numerics bug must show in the outputs. The attention's output projection
# small, so that the experts' output dominates the residual stream and so the logits: in fp32 (transformers) a
# SiLU dropped, router weights ignored or one expert skipped then moves the log-probs 11-15x as far as the
# whole model's bf16 rounding does (0.07), against 1-5x with all at 0.2
MODEL = r"""
import json, os, sys, torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
torch.manual_seed(0)
cfg = Qwen3MoeConfig(vocab_size=512, hidden_size=HIDDEN, intermediate_size=256, moe_intermediate_size=MOE_INTER,
                     num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                     num_experts=8, num_experts_per_tok=2, decoder_sparse_step=1, max_position_embeddings=512,
                     norm_topk_prob=True, tie_word_embeddings=False)
model = Qwen3MoeForCausalLM(cfg).to(torch.bfloat16)
with torch.no_grad():
    for name, p in model.named_parameters():
        p.normal_(0, 0.02 if "o_proj" in name else 0.2)
"""
MAKE = MODEL.replace("HIDDEN", "128").replace("MOE_INTER", "32") + "model.save_pretrained(sys.argv[1])\n"

RUN = r"""
import json, sys
from vllm import LLM, SamplingParams

def main():
    llm = LLM(model=sys.argv[1], skip_tokenizer_init=True, enforce_eager=True, dtype="bfloat16", max_model_len=256,
              seed=0, gpu_memory_utilization=0.2,  # on the CPU build: the fraction of RAM reserved
              tensor_parallel_size=int(sys.argv[2]), enable_expert_parallel=sys.argv[3:] == ["ep"])
    # 4 sequences: prefill chunks of > 16 tokens (handed over), then decode steps of 4 tokens (kernel)
    prompts = [{"prompt_token_ids": [(7 * i + 3 * j) % 500 + 1 for j in range(20 + 3 * i)]} for i in range(4)]
    outs = llm.generate(prompts, SamplingParams(max_tokens=8, temperature=0.0, logprobs=8, detokenize=False),
                        use_tqdm=False)
    # per step: the chosen token, its log-prob, and the log-probs of the 8 most likely tokens
    res = [[(tok, lps[tok].logprob, [[c, lp.logprob] for c, lp in lps.items()])
            for tok, lps in zip(o.outputs[0].token_ids, o.outputs[0].logprobs)] for o in outs]
    print("RESULT" + json.dumps({"prompts": [p["prompt_token_ids"] for p in prompts], "steps": res}))

if __name__ == "__main__":
    main()
"""

# The same model family as FP8: 128 x 128 weight blocks (H 256, I 128: two blocks along each reduction of
# W13 and along W2's rows), the experts' weights quantized block-wise with a different magnitude per row band
# (scales != 1); every linear but the experts in ignored_layers, as the CPU build has no FP8 linear kernels
# (vllm-seams.md). Beside it the reference checkpoint: the same weights with the experts dequantized, in fp32.
MAKE_FP8 = MODEL.replace("HIDDEN", "256").replace("MOE_INTER", "128") + r"""
from safetensors.torch import load_file, save_file
fp8_dir, ref_dir = sys.argv[1], sys.argv[2]
BLOCK = 128
model.save_pretrained(fp8_dir)
model.save_pretrained(ref_dir)
tensors = load_file(os.path.join(fp8_dir, "model.safetensors"))
fp8, ref = {}, {}
for key, t in tensors.items():
    if ".mlp.experts." not in key:
        fp8[key], ref[key] = t, t.float()
        continue
    n, k = t.shape  # scales per 128 x 128 block, with a different magnitude per block (scales != 1)
    w = t.float() * torch.linspace(0.5, 2.0, n)[:, None]
    blocks = w.reshape(n // BLOCK, BLOCK, k // BLOCK, BLOCK)
    scale = blocks.abs().amax(dim=(1, 3)) / 448.0
    q = (blocks / scale[:, None, :, None]).reshape(n, k).to(torch.float8_e4m3fn)
    fp8[key], fp8[key + "_scale_inv"] = q, scale.contiguous()
    ref[key] = (q.float().reshape(n // BLOCK, BLOCK, k // BLOCK, BLOCK) * scale[:, None, :, None]).reshape(n, k)
save_file(fp8, os.path.join(fp8_dir, "model.safetensors"), metadata={"format": "pt"})
save_file(ref, os.path.join(ref_dir, "model.safetensors"), metadata={"format": "pt"})
conf = json.load(open(os.path.join(fp8_dir, "config.json")))
linears = [f"model.layers.{i}.{m}" for i in range(cfg.num_hidden_layers)
           for m in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate")]
conf["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                               "weight_block_size": [BLOCK, BLOCK], "ignored_layers": linears + ["lm_head"]}
json.dump(conf, open(os.path.join(fp8_dir, "config.json"), "w"))
conf = json.load(open(os.path.join(ref_dir, "config.json")))
conf["dtype"] = "float32"
json.dump(conf, open(os.path.join(ref_dir, "config.json"), "w"))
"""


def _report(report_dir):
    proc = subprocess.run([sys.executable, "-m", "infera_vllm", "report", str(report_dir), "--json"],
                          capture_output=True, text=True, check=True)
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def checkpoint_and_baseline(tmp_path_factory):
    """The tiny checkpoint and its plugin-off, one-worker outputs (the reference for both tests)."""
    tmp = tmp_path_factory.mktemp("qwen3-moe")
    ckpt = tmp / "qwen3-moe-tiny"
    run_script(MAKE, str(ckpt), env={})
    off = run_script(RUN, str(ckpt), "1",
                     env={"INFERA_VLLM_OPS_DISABLE": "1", "INFERA_VLLM_REPORT_DIR": str(tmp / "off")})
    return ckpt, result_json(off)


def test_tiny_qwen3_moe_on_vs_off(tmp_path, checkpoint_and_baseline):
    ckpt, baseline = checkpoint_and_baseline
    on_dir = tmp_path / "report-on"
    on = result_json(run_script(RUN, str(ckpt), "1", env={"INFERA_VLLM_OPS": "moe-decode",
                                                         "INFERA_VLLM_REPORT_DIR": str(on_dir)}))
    print(assert_no_worse_than_vllm(str(ckpt), on, baseline))

    report = _report(on_dir)
    assert any(o["op"] == "moe-decode" and o["status"] == "active" for o in report["ops"]), report["ops"]
    routes = {(c["route"], c["reason"]): c["count"] for c in report["counts"] if c["op"] == "moe-decode"}
    kernel, handed = routes.get(("kernel", ""), 0), routes.get(("handover", "tokens-above-threshold"), 0)
    # how the scheduler batches prefill and decode varies; every step passes both MoE layers over at least 8
    # steps (8 tokens each); pure decode steps (4 tokens) reach the kernel, prefill chunks are handed over. A
    # worker vLLM kills at shutdown keeps the counts of its last report rewrite (every 5 s while they change),
    # so under the interpreter's seconds-long steps the last step or two may be missing from the report
    assert kernel >= 2 and handed >= 2 and kernel + handed >= 2 * 5, routes
    assert set(routes) == {("kernel", ""), ("handover", "tokens-above-threshold")}, routes
    # the self-check ran the first kernel call of each bucket against vLLM's experts, and every one agreed
    checks = report["self_check"]
    assert checks and all(c["failed"] == 0 and c["passed"] >= 1 for c in checks), checks


@pytest.mark.parametrize("reference", ["vllm", "fp32"])
def test_self_check_catches_a_wrong_kernel(tmp_path, checkpoint_and_baseline, reference):
    """A deliberately wrong kernel (INFERA_VLLM_SELF_CHECK_PERTURB scales its outputs by 1.25, on every
    call): the self-check catches it at the first call of each bucket, that call returns vLLM's result and
    vLLM's experts serve the bucket from then on, so the greedy tokens equal plugin-off's exactly (vLLM's
    kernel served every call), and the report names the mismatch. With either reference: vLLM's experts
    (the CPU build's default) or the fp32 one (the GPUs' default), which hands a mismatched call to vLLM's
    experts after the comparison."""
    ckpt, baseline = checkpoint_and_baseline
    report_dir = tmp_path / "report-perturbed"
    on = result_json(run_script(RUN, str(ckpt), "1", env={
        "INFERA_VLLM_OPS": "moe-decode", "INFERA_VLLM_SELF_CHECK_PERTURB": "moe-decode",
        "INFERA_MOE_DECODE_CHECK_REFERENCE": reference, "INFERA_VLLM_REPORT_DIR": str(report_dir)}))
    assert ([[step[0] for step in seq] for seq in on["steps"]]
            == [[step[0] for step in seq] for seq in baseline["steps"]])

    report = _report(report_dir)
    checks = report["self_check"]
    assert checks and all(c["failed"] >= 1 and c["passed"] == 0 for c in checks), checks
    assert all(c["max_error"] > 0.1 for c in checks), checks  # ~0.25: the perturbation, far above the bound
    routes = {(c["route"], c["reason"]) for c in report["counts"] if c["op"] == "moe-decode"}
    assert ("fallback", "self-check-mismatch") in routes and ("kernel", "") not in routes, report["counts"]


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="two CPU workers need two cores")
def test_tensor_parallel_two_workers(tmp_path, checkpoint_and_baseline):
    """Tensor parallel 2 with the real vLLM CPU build spawns two worker processes; each loads the plugin on
    its own, serves its shard of the experts (I split in two) through the kernel and writes its own report;
    the merged report lists both ranks. Outputs: as close to the fp32 model as tensor parallel 2 with the
    plugin off (the split reduction changes roundings, so neither equals one worker's tokens)."""
    ckpt, baseline = checkpoint_and_baseline
    report_dir = tmp_path / "report-tp2"
    bind = {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}  # one core per rank
    tp2 = result_json(run_script(RUN, str(ckpt), "2", env={"INFERA_VLLM_OPS": "moe-decode",
                                                          "INFERA_VLLM_REPORT_DIR": str(report_dir), **bind}))
    tp2_off = result_json(run_script(RUN, str(ckpt), "2", env={"INFERA_VLLM_OPS_DISABLE": "1", **bind,
                                                              "INFERA_VLLM_REPORT_DIR": str(tmp_path / "off-tp2")}))
    print(assert_no_worse_than_vllm(str(ckpt), tp2, tp2_off))

    report = _report(report_dir)
    workers = [p for p in report["processes"] if "moe-decode" in p["active"] and "Worker" in p["name"]]
    assert len(workers) == 2, report["processes"]
    kernel = [c for c in report["counts"] if c["op"] == "moe-decode" and c["route"] == "kernel"]
    assert kernel and all(c["processes"] == 2 for c in kernel), report["counts"]  # both ranks ran the kernel


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="two CPU workers need two cores")
def test_expert_parallel_two_workers(tmp_path, checkpoint_and_baseline):
    """Expert parallel over two CPU workers: each rank holds 4 of the 8 experts and vLLM passes an expert map
    (global id -> local index, -1 elsewhere) to the experts; the kernel serves every call on each rank with
    its local experts (the others contribute zeros, vLLM sums the ranks) and none is declined for the map.
    vLLM 0.32's own CPU experts crash a worker (SIGSEGV) under expert parallel, with the plugin off too, so
    the threshold here sends every call, prefill included, to the kernel, the self-check (which would run
    vLLM's experts beside it) is off, and the outputs are judged against the one-worker plugin-off run: as
    close to the fp32 model as it."""
    ckpt, baseline = checkpoint_and_baseline
    report_dir = tmp_path / "report-ep2"
    ep = result_json(run_script(RUN, str(ckpt), "2", "ep", env={
        "INFERA_VLLM_OPS": "moe-decode", "INFERA_MOE_DECODE_MAX_TOKENS": "256", "INFERA_VLLM_SELF_CHECK": "off",
        "INFERA_VLLM_REPORT_DIR": str(report_dir), "VLLM_CPU_OMP_THREADS_BIND": "0|1"}))
    print(assert_no_worse_than_vllm(str(ckpt), ep, baseline))

    report = _report(report_dir)
    routes = {(c["route"], c["reason"]) for c in report["counts"] if c["op"] == "moe-decode"}
    assert routes == {("kernel", "")}, report["counts"]  # no expert-map fallback, nothing handed over
    kernel = [c for c in report["counts"] if c["op"] == "moe-decode"]
    assert all(c["processes"] == 2 for c in kernel), report["counts"]  # both ranks ran the kernel


# vLLM's CPU build has FP8 experts of its own for block FP8 (CPUExpertsFp8, first in its oracle's order) on x86
# CPUs with AMX tiles only. Told the CPU has none, in every process of the run (vLLM's engine core and worker
# are spawned: a sitecustomize on their path), the oracle reaches its TRITON backend, whose experts class is
# ours, on any machine
NO_AMX = "import torch\ntorch.cpu._is_amx_tile_supported = lambda: False\n"


def without_cpu_fp8_experts(tmp_path) -> dict:
    """The environment that keeps vLLM's CPU FP8 experts out of a run (NO_AMX in each of its processes)."""
    site = tmp_path / "no-amx"
    site.mkdir()
    (site / "sitecustomize.py").write_text(NO_AMX)
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}


def test_tiny_qwen3_moe_fp8_block(tmp_path):
    """A block-FP8 checkpoint (vLLM's ``Fp8MoEMethod``, 128 x 128 weight blocks, dynamic activations): vLLM
    picks its TRITON FP8 backend, whose experts class is ours (its CPU FP8 experts, which need AMX, kept out:
    ``without_cpu_fp8_experts``), so every call (the threshold covers prefill) runs the kernel on the FP8
    weights and their block scales with bf16 activations. Outputs: as close to the fp32 model of the
    dequantized weights as vLLM's own bf16 experts on those weights (plugin off); the self-check (fp32
    reference over the dequantized experts) passes."""
    fp8, ref = tmp_path / "fp8", tmp_path / "ref"
    run_script(MAKE_FP8, str(fp8), str(ref), env={})
    off = result_json(run_script(RUN, str(ref), "1", env={"INFERA_VLLM_OPS_DISABLE": "1",
                                                         "INFERA_VLLM_REPORT_DIR": str(tmp_path / "off")}))
    report_dir = tmp_path / "report-fp8"
    out = run_script(RUN, str(fp8), "1", env={
        **without_cpu_fp8_experts(tmp_path), "INFERA_VLLM_OPS": "moe-decode", "INFERA_MOE_DECODE_MAX_TOKENS": "256",
        "INFERA_VLLM_REPORT_DIR": str(report_dir)})
    print(assert_no_worse_than_vllm(str(ref), result_json(out), off))

    report = _report(report_dir)
    counts = [c for c in report["counts"] if c["op"] == "moe-decode"]
    assert {(c["route"], c["reason"]) for c in counts} == {("kernel", "")}, counts
    assert sum(c["count"] for c in counts) >= 2 * 5, counts  # both layers, every step (see the bf16 test)
    checks = report["self_check"]
    assert checks and all(c["failed"] == 0 and c["passed"] >= 1 for c in checks), checks
