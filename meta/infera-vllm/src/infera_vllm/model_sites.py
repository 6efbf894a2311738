"""The layers of a decoder model that an op could take, read from its Hugging Face ``config.json``.

Used by ``infera-vllm doctor --model`` before serving, so it works without vLLM building the model. It
covers the Llama / Mistral / Qwen / Mixtral / DeepSeek-style decoder layout (norms, attention, MLP or MoE,
projections), with Gemma-2's norms around the MLP and gpt-oss's experts (biases, vLLM's ``swigluoai``
activation); a field it does not know is simply not used, and ``dtype`` is the config's ``torch_dtype``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Site:
    kind: str  # "rms_norm" | "attention" | "moe" | "linear"
    name: str  # vLLM module path, e.g. "model.layers.3.self_attn.attn"
    attrs: dict[str, object] = field(default_factory=dict, hash=False, compare=False)


# Architectures whose decoder layout sites() reads (the Llama / Mistral / Qwen / Mixtral / DeepSeek family and
# gpt-oss); another one is planned the same way, and said to be unknown.
KNOWN_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "MixtralForCausalLM", "Qwen2ForCausalLM",
                       "Qwen2MoeForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "DeepseekV2ForCausalLM",
                       "DeepseekV3ForCausalLM", "GptOssForCausalLM", "Gemma2ForCausalLM", "Phi3ForCausalLM")
REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads")
# the integer keys sites() reads, each with its least sensible value (a config is refused on any other)
SIZES = {**{key: 1 for key in ("hidden_size", "d_model", "num_hidden_layers", "n_layer", "num_attention_heads",
                               "n_head", "num_key_value_heads", "head_dim", "intermediate_size",
                               "moe_intermediate_size", "decoder_sparse_step")},
         **{key: 0 for key in ("num_experts", "num_local_experts", "n_routed_experts", "num_experts_per_tok",
                               "moe_topk", "vocab_size", "first_k_dense_replace")}}


def load_config(path_or_config: str) -> dict[str, object]:
    """The config as a dict; FileNotFoundError / ValueError naming the file and what is wrong with it (not
    JSON, not an object, a required key missing)."""
    path = os.path.join(path_or_config, "config.json") if os.path.isdir(path_or_config) else path_or_config
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no config.json at {path_or_config!r} (give a model directory or a config file)")
    try:
        with open(path) as f:
            cfg = json.load(f)
    except ValueError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(cfg, dict):
        raise ValueError(f"{path}: a JSON {type(cfg).__name__}, not a config object")
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    aliases = {"hidden_size": ("hidden_size", "d_model"), "num_hidden_layers": ("num_hidden_layers", "n_layer"),
               "num_attention_heads": ("num_attention_heads", "n_head")}
    missing = [key for key in REQUIRED if _first(text, *aliases[key]) is None]
    if missing:
        raise ValueError(f"{path}: missing {', '.join(missing)} (needed to plan the model's layers)")
    for key, least in SIZES.items():
        value = text.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
            raise ValueError(f"{path}: {key} is {value!r}, not an integer >= {least}")
    return cfg


def unknown_architecture(cfg: dict[str, object]) -> str | None:
    """None for a layout sites() knows, else a sentence saying which architecture is planned as a guess."""
    names = [str(a) for a in (cfg.get("architectures") or [])]
    if any(a in KNOWN_ARCHITECTURES for a in names):
        return None
    what = ", ".join(names) if names else "no 'architectures' entry"
    return (f"unknown architecture ({what}): planned as a Llama-style decoder; the layer counts may not match "
            f"what vLLM builds")


def _first(cfg: dict[str, object], *keys: str, default=None):
    for key in keys:
        if cfg.get(key) is not None:
            return cfg[key]
    return default


def _is_moe_layer(cfg: dict[str, object], i: int, experts: int) -> bool:
    if not experts:
        return False
    if i in (cfg.get("mlp_only_layers") or []):
        return False
    if i < int(cfg.get("first_k_dense_replace") or 0):
        return False
    step = int(cfg.get("decoder_sparse_step") or 1)
    return (i + 1) % step == 0


def sites(cfg: dict[str, object]) -> list[Site]:
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    hidden = int(_first(text, "hidden_size", "d_model"))
    layers = int(_first(text, "num_hidden_layers", "n_layer"))
    heads = int(_first(text, "num_attention_heads", "n_head"))
    kv_heads = int(_first(text, "num_key_value_heads", default=heads))
    head_dim = int(_first(text, "head_dim", default=hidden // heads))
    inter = int(_first(text, "intermediate_size", default=4 * hidden))
    experts = int(_first(text, "num_experts", "num_local_experts", "n_routed_experts", default=0) or 0)
    moe_inter = int(_first(text, "moe_intermediate_size", default=inter))
    topk = int(_first(text, "num_experts_per_tok", "moe_topk", default=0) or 0)
    dtype = str(_first(text, "torch_dtype", "dtype", default=cfg.get("torch_dtype", "bfloat16")))
    window = _first(text, "sliding_window")
    model_type = str(text.get("model_type", ""))
    qk_norm = model_type.startswith("qwen3")
    sandwich = model_type.startswith(("gemma2", "gemma3"))  # a norm before and after the MLP as well
    gpt_oss = model_type == "gpt_oss"  # experts with biases and a clamped SwiGLU (vLLM's "swigluoai")
    norm = {"hidden_size": hidden, "dtype": dtype}
    out: list[Site] = []
    for i in range(layers):
        p = f"model.layers.{i}"
        out.append(Site("rms_norm", f"{p}.input_layernorm", norm))
        out.append(Site("linear", f"{p}.self_attn.qkv_proj",
                        {"n": (heads + 2 * kv_heads) * head_dim, "k": hidden, "dtype": dtype}))
        if qk_norm:
            out.append(Site("rms_norm", f"{p}.self_attn.q_norm", {"hidden_size": head_dim, "dtype": dtype}))
            out.append(Site("rms_norm", f"{p}.self_attn.k_norm", {"hidden_size": head_dim, "dtype": dtype}))
        out.append(Site("attention", f"{p}.self_attn.attn", {
            "num_heads": heads, "num_kv_heads": kv_heads, "head_size": head_dim, "dtype": dtype,
            "sliding_window": window,
            "sinks": bool(text.get("attention_sinks") or str(text.get("model_type")) == "gpt_oss"),
        }))
        out.append(Site("linear", f"{p}.self_attn.o_proj", {"n": hidden, "k": heads * head_dim, "dtype": dtype}))
        out.append(Site("rms_norm", f"{p}.post_attention_layernorm", norm))
        if sandwich:
            out.append(Site("rms_norm", f"{p}.pre_feedforward_layernorm", norm))
            out.append(Site("rms_norm", f"{p}.post_feedforward_layernorm", norm))
        if _is_moe_layer(text, i, experts):
            out.append(Site("moe", f"{p}.mlp.experts", {
                "num_experts": experts, "hidden_size": hidden, "intermediate_size": moe_inter, "top_k": topk,
                "dtype": dtype, "activation": "swigluoai" if gpt_oss else str(text.get("hidden_act", "silu")),
                "bias": gpt_oss,
            }))
        else:
            out.append(Site("linear", f"{p}.mlp.gate_up_proj", {"n": 2 * inter, "k": hidden, "dtype": dtype}))
            out.append(Site("linear", f"{p}.mlp.down_proj", {"n": hidden, "k": inter, "dtype": dtype}))
    out.append(Site("rms_norm", "model.norm", norm))
    vocab = int(_first(text, "vocab_size", default=0) or 0)
    out.append(Site("linear", "lm_head", {"n": vocab, "k": hidden, "dtype": dtype, "lm_head": True}))
    return out
