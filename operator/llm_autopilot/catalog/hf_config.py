"""Turn a Hugging Face ``config.json`` (a plain mapping) into a :class:`ModelArchitecture`.

Pure: the Hub client and the catalog hand it parsed JSON. Field names follow transformers'
conventions, including the per-family aliases (``n_routed_experts``, ``num_local_experts``...),
multimodal wrappers (``text_config``) and family defaults for fields a config may omit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from llm_autopilot.domain.architecture import (
    MLA,
    CheckpointQuantization,
    InvalidArchitecture,
    ModelArchitecture,
    MoE,
)
from llm_autopilot.domain.precision import WeightFormat


class ModelConfigError(ValueError):
    """The config cannot describe a model we can plan for; the message says which field and why."""


# transformers defaults for fields that real configs of these families leave out
_FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3_text": {
        "vocab_size": 262208,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": True,
        "sliding_window": 4096,
        "sliding_window_pattern": 6,
        "head_dim": 256,
    },
    "gemma2": {"tie_word_embeddings": True, "head_dim": 256, "sliding_window": 4096},
    "gemma": {"tie_word_embeddings": True},
}
_TEXT_MODEL_TYPES = {"gemma3": "gemma3_text"}


def _merged_text_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """Multimodal configs keep the language model under ``text_config``; it wins over the wrapper."""
    merged = dict(config)
    text = config.get("text_config")
    if isinstance(text, Mapping):
        merged.update(text)
        wrapper_type = str(config.get("model_type", ""))
        merged["model_type"] = text.get("model_type") or _TEXT_MODEL_TYPES.get(wrapper_type, wrapper_type)
    model_type = str(merged.get("model_type", ""))
    for key, value in _FAMILY_DEFAULTS.get(model_type, {}).items():
        if merged.get(key) is None:
            merged[key] = value
    return merged


#: The largest size a config field may give (2^40): the planner multiplies a few of them in float64, which a
#: corrupted config.json (hidden_size 1e153) would overflow; real models stay below 2^30.
CONFIG_INT_MAX = 2**40


def _whole(name: str, value: Any, minimum: int = 1) -> int:
    """A finite, integral JSON number >= minimum, at most 2^40 (4096.0 counts as 4096; 0.5, 1e400, "8", true do
    not)."""
    if (isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value)
            or value != int(value) or value < minimum):
        raise ModelConfigError(f"config field {name!r} must be a whole number >= {minimum}, got {value!r}")
    if value > CONFIG_INT_MAX:
        raise ModelConfigError(f"config field {name!r} must be a whole number >= {minimum}, at most 2^40, "
                               f"got {value!r:.40}")
    return int(value)


def _require_int(config: Mapping[str, Any], *names: str) -> int:
    for name in names:
        value = config.get(name)
        if value is not None:
            return _whole(name, value)
    raise ModelConfigError(f"config.json has no {' or '.join(repr(n) for n in names)}")


def _optional_int(config: Mapping[str, Any], *names: str, minimum: int = 1) -> int | None:
    """The first of ``names`` that is set (null counts as unset); a set value must be valid, never skipped."""
    for name in names:
        value = config.get(name)
        if value is not None:
            return _whole(name, value, minimum)
    return None


def _group_size(config: Mapping[str, Any], *names: str, default: int) -> int:
    """A quantization group size: a whole number >= 1, or -1 for one group per output channel."""
    for name in names:
        value = config.get(name)
        if value is not None:
            return -1 if value == -1 and not isinstance(value, bool) else _whole(name, value)
    return default


def _text(config: Mapping[str, Any], name: str, default: str) -> str:
    value = config.get(name)
    if value is None or value == "":
        return default
    if not isinstance(value, str):
        raise ModelConfigError(f"config field {name!r} must be a non-empty string, got {value!r}")
    return value


def _architecture_name(config: Mapping[str, Any]) -> str:
    names = config.get("architectures")
    if names is None or names == []:
        return "unknown"
    if isinstance(names, str):
        names = [names]
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise ModelConfigError(f"config field 'architectures' must be a list of class names, got {names!r}")
    return str(names[0])


def _flag(config: Mapping[str, Any], name: str) -> bool:
    value = config.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ModelConfigError(f"config field {name!r} must be true or false, got {value!r}")
    return value


def _sliding_layers(config: Mapping[str, Any], num_layers: int) -> tuple[int | None, int]:
    """(window, number of sliding-window layers) as vLLM would build the model (read in vLLM 0.32.0 and 0.33.0).

    - ``layer_types`` names each layer (vLLM's gemma2.py/llama.py read ``config.layer_types[layer_idx]``).
    - Gemma2 without ``layer_types`` (the Hub's configs): transformers' ``Gemma2Config.__init__`` fills it with
      ``"sliding_attention" if (i + 1) % 2 else "full_attention"``, so the even indices slide: ceil(n/2) layers.
    - Otherwise a model-level window applies to every layer, however long: ``EngineArgs.create_engine_config``
      (engine/arg_utils.py) sets ``CacheConfig.sliding_window`` from the config when there are no layer types,
      and ``Attention.__init__`` (model_executor/layers/attention/attention.py) gives it to each layer, so
      Phi-3-mini-128k's window of 262,144 over 131,072 positions still makes every layer a sliding-window
      layer (one block more per request than full attention: ``SlidingWindowSpec.max_admission_blocks_per_request``).
    """
    window = _optional_int(config, "sliding_window")
    layer_types = config.get("layer_types")
    if isinstance(layer_types, list) and layer_types:
        count = sum(1 for t in layer_types if t == "sliding_attention")
        return (window, count) if window and count else (None, 0)
    if window is None or config.get("use_sliding_window") is False:
        return None, 0
    model_type = str(config.get("model_type", ""))
    if model_type == "gemma2":
        return window, (num_layers + 1) // 2  # layers 0, 2, 4, ... slide
    pattern = _optional_int(config, "sliding_window_pattern")
    if pattern:
        return window, num_layers - num_layers // pattern  # every pattern-th layer is global
    return window, num_layers


def _moe(config: Mapping[str, Any]) -> MoE | None:
    experts = _optional_int(config, "num_experts", "num_local_experts", "n_routed_experts", minimum=0)
    if not experts or experts <= 1:
        return None  # 0 or 1 expert: a dense MLP
    shared = _optional_int(config, "n_shared_experts", minimum=0) or 0
    expert_inter = _require_int(config, "moe_intermediate_size", "intermediate_size")
    shared_inter = _optional_int(config, "shared_expert_intermediate_size", minimum=0) or shared * expert_inter
    return MoE(
        num_experts=experts,
        experts_per_token=_require_int(config, "num_experts_per_tok", "num_experts_per_token"),
        expert_intermediate_size=expert_inter,
        num_shared_experts=shared or (1 if shared_inter else 0),
        shared_expert_intermediate_size=shared_inter,
        first_dense_layers=_optional_int(config, "first_k_dense_replace", minimum=0) or 0,
    )


def _mla(config: Mapping[str, Any]) -> MLA | None:
    rank = _optional_int(config, "kv_lora_rank")
    if rank is None:
        return None
    return MLA(
        kv_lora_rank=rank,
        qk_rope_head_dim=_require_int(config, "qk_rope_head_dim"),
        qk_nope_head_dim=_require_int(config, "qk_nope_head_dim"),
        v_head_dim=_require_int(config, "v_head_dim"),
        q_lora_rank=_optional_int(config, "q_lora_rank"),
    )


def parse_quantization_config(qc: Mapping[str, Any]) -> CheckpointQuantization:
    """Read a checkpoint's ``quantization_config`` (or ``hf_quant_config.json``'s ``quantization``)."""
    method = str(qc.get("quant_method") or qc.get("quant_algo") or "").lower()
    bits = _optional_int(qc, "bits", "w_bit") or 4
    group = _group_size(qc, "group_size", "q_group_size", default=128)
    if method in ("awq", "awq_marlin"):
        return CheckpointQuantization(method, WeightFormat.AWQ, bits, group)
    if method in ("gptq", "gptq_marlin"):
        fmt = WeightFormat.GPTQ if bits == 4 else WeightFormat.INT8
        return CheckpointQuantization(method, fmt, bits, group)
    if method in ("fp8", "fbgemm_fp8"):
        return CheckpointQuantization(method, WeightFormat.FP8, 8, 0)
    if method in ("mxfp4", "gpt_oss_mxfp4"):
        return CheckpointQuantization(method, WeightFormat.MXFP4, 4, 32, experts_only=True)
    if method in ("modelopt", "modelopt_fp4", "nvfp4"):
        algo = str(qc.get("quant_algo", method)).upper()
        if "FP4" in algo:
            return CheckpointQuantization("modelopt_fp4", WeightFormat.NVFP4, 4, 16)
        return CheckpointQuantization("modelopt", WeightFormat.FP8, 8, 0)
    if method == "compressed-tensors":
        return _compressed_tensors(qc)
    raise ModelConfigError(
        f"checkpoint quantization {method or '(none given)'!r} is not supported; "
        "supported: awq, gptq, fp8, mxfp4, modelopt, compressed-tensors"
    )


def _compressed_tensors(qc: Mapping[str, Any]) -> CheckpointQuantization:
    groups = qc.get("config_groups") or {}
    for group in groups.values() if isinstance(groups, Mapping) else []:
        weights = group.get("weights") if isinstance(group, Mapping) else None
        if not isinstance(weights, Mapping):
            continue
        bits = _optional_int(weights, "num_bits") or 8
        if weights.get("type") == "float":
            return CheckpointQuantization("compressed-tensors", WeightFormat.FP8 if bits == 8 else WeightFormat.NVFP4,
                                          bits, _group_size(weights, "group_size", default=16))
        group_size = _group_size(weights, "group_size", default=-1)
        fmt = WeightFormat.GPTQ if bits == 4 else WeightFormat.INT8
        return CheckpointQuantization("compressed-tensors", fmt, bits, group_size)
    raise ModelConfigError("compressed-tensors quantization_config has no config_groups with weights")


def parse_hf_config(
    config: Mapping[str, Any],
    model_id: str,
    *,
    checkpoint_bytes: int | None = None,
    variants: Mapping[WeightFormat, str] | None = None,
) -> ModelArchitecture:
    """Build the architecture vLLM would instantiate from this config."""
    if not isinstance(config, Mapping):
        raise ModelConfigError("config.json must be a JSON object")
    cfg = _merged_text_config(config)
    hidden = _require_int(cfg, "hidden_size", "d_model", "n_embd")
    layers = _require_int(cfg, "num_hidden_layers", "n_layer", "num_layers")
    heads = _require_int(cfg, "num_attention_heads", "n_head")
    kv_heads = _optional_int(cfg, "num_key_value_heads", "num_kv_heads") or heads  # absent: multi-head attention
    window, sliding = _sliding_layers(cfg, layers)
    qc = cfg.get("quantization_config")
    if qc is not None and not isinstance(qc, Mapping):
        raise ModelConfigError(f"config field 'quantization_config' must be an object, got {qc!r}")
    max_len = _optional_int(cfg, "max_position_embeddings", "max_seq_len", "seq_length", "n_positions")
    dtype = cfg.get("torch_dtype") if cfg.get("torch_dtype") is not None else cfg.get("dtype")
    if dtype is not None and not isinstance(dtype, str):
        raise ModelConfigError(f"config field 'torch_dtype' must be a dtype name such as \"bfloat16\", got {dtype!r}")
    try:
        return ModelArchitecture(
            model_id=model_id,
            architecture=_architecture_name(cfg),
            model_type=_text(cfg, "model_type", "unknown"),
            hidden_size=hidden,
            num_layers=layers,
            num_attention_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=_optional_int(cfg, "head_dim") or hidden // heads,
            intermediate_size=_require_int(cfg, "intermediate_size", "ffn_dim", "n_inner"),
            vocab_size=_require_int(cfg, "vocab_size"),
            max_position_embeddings=max_len or 4096,
            torch_dtype=dtype or "bfloat16",
            tie_word_embeddings=_flag(cfg, "tie_word_embeddings"),
            sliding_window=window,
            num_sliding_window_layers=sliding,
            moe=_moe(cfg),
            mla=_mla(cfg),
            quantization=parse_quantization_config(qc) if qc is not None else None,
            checkpoint_bytes=checkpoint_bytes,
            variants=dict(variants or {}),
        )
    except InvalidArchitecture as exc:
        raise ModelConfigError(f"config.json does not describe a model: {'; '.join(exc.problems)}") from exc


#: every config.json field parse_hf_config reads (top level and under ``text_config``)
PLANNER_FIELDS = frozenset({
    "architectures", "model_type", "hidden_size", "d_model", "n_embd", "num_hidden_layers", "n_layer",
    "num_layers", "num_attention_heads", "n_head", "num_key_value_heads", "num_kv_heads", "head_dim",
    "intermediate_size", "ffn_dim", "n_inner", "vocab_size", "max_position_embeddings", "max_seq_len",
    "seq_length", "n_positions", "torch_dtype", "dtype", "tie_word_embeddings", "sliding_window",
    "sliding_window_pattern", "use_sliding_window", "layer_types", "num_experts", "num_local_experts",
    "n_routed_experts", "n_shared_experts", "moe_intermediate_size", "shared_expert_intermediate_size",
    "num_experts_per_tok", "num_experts_per_token", "first_k_dense_replace", "kv_lora_rank", "qk_rope_head_dim",
    "qk_nope_head_dim", "v_head_dim", "q_lora_rank", "quantization_config", "text_config"})
#: the quantization_config fields parse_quantization_config reads (config_groups: each group's ``weights``)
QUANTIZATION_FIELDS = frozenset({"quant_method", "quant_algo", "bits", "w_bit", "group_size", "q_group_size",
                                 "config_groups"})
_WEIGHTS_FIELDS = frozenset({"num_bits", "type", "group_size"})


def _only(config: Mapping[str, Any], fields: frozenset[str]) -> dict[str, Any]:
    return {k: v for k, v in config.items() if k in fields}


def planner_view(config: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a config.json the planner reads (parse_hf_config gives the same architecture for both): small
    enough to carry in a termination message, with nothing else of the file (no tokens, no paths)."""
    view = _only(config, PLANNER_FIELDS - {"text_config", "quantization_config"})
    text = config.get("text_config")
    if isinstance(text, Mapping):
        view["text_config"] = planner_view({k: v for k, v in text.items() if k != "text_config"})
    elif text is not None:
        view["text_config"] = text
    qc = config.get("quantization_config")
    if isinstance(qc, Mapping):
        quant = _only(qc, QUANTIZATION_FIELDS)
        groups = qc.get("config_groups")
        if isinstance(groups, Mapping):
            quant["config_groups"] = {
                str(name): ({"weights": _only(g["weights"], _WEIGHTS_FIELDS)}
                            if isinstance(g, Mapping) and isinstance(g.get("weights"), Mapping) else {})
                for name, g in groups.items()}
        view["quantization_config"] = quant
    elif qc is not None:
        view["quantization_config"] = qc
    return view
