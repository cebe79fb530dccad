"""Tiny random-weight models of many mlx-lm architectures, from mlx-lm's own model classes: a
test matrix over every kind of cache (full, sliding-window, linear/SSM, MLA) that builds in seconds.
"""

from __future__ import annotations

import copy
import os
import shutil
import tempfile
from pathlib import Path

from .tiny_model import CODER_SPECIAL_TOKENS, _build, _train_byte_level_tokenizer

VOCAB_SIZE = 1024
CONTEXT = 32768
WINDOW = 64  # sliding layers' window: prompts of a few hundred tokens wrap it
EOS = [CODER_SPECIAL_TOKENS.index("<|endoftext|>"), CODER_SPECIAL_TOKENS.index("<|im_end|>")]

_COMMON = {
    "vocab_size": VOCAB_SIZE,
    "bos_token_id": None,
    "eos_token_id": EOS,
    "torch_dtype": "float32",
}
_DENSE = _COMMON | {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": CONTEXT,
    "rms_norm_eps": 1e-6,
}
_YARN = {
    "factor": 8.0,
    "original_max_position_embeddings": CONTEXT // 8,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
}


# DeepSeek-style routing (GLM-4 MoE, Nemotron-H): 4 experts, 2 a token, one shared
_ROUTED_EXPERTS = {
    "n_routed_experts": 4,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "n_group": 1,
    "topk_group": 1,
    "norm_topk_prob": True,
}
# Qwen3.5's and Qwen3-Next's gated-delta (linear attention) layers, every other one full attention
_GATED_DELTA = {
    "head_dim": 32,
    "linear_num_value_heads": 4,
    "linear_num_key_heads": 2,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "full_attention_interval": 2,
}


def _alternate(first: str, second: str, layers: int = 4) -> list[str]:
    return [first if i % 2 == 0 else second for i in range(layers)]


def _qwen3_5_text(model_type: str, moe: bool) -> dict:
    text = _DENSE | {
        "model_type": model_type,
        "num_hidden_layers": 4,
        **_GATED_DELTA,
        "layer_types": _alternate("linear_attention", "full_attention"),
        "rope_parameters": {
            "type": "default",
            "mrope_interleaved": True,
            "mrope_section": [2, 1, 1],
            "rope_theta": 10000000.0,
            "partial_rotary_factor": 0.25,
        },
        "tie_word_embeddings": not moe,
    }
    if moe:
        text |= {
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "decoder_sparse_step": 1,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 32,
            "norm_topk_prob": True,
        }
    return text


def _qwen3_5(model_type: str, architecture: str, moe: bool) -> dict:
    text = _qwen3_5_text(f"{model_type}_text", moe)
    return _COMMON | {
        "model_type": model_type,
        "architectures": [architecture],
        "tie_word_embeddings": text["tie_word_embeddings"],
        "text_config": text,
    }


_MINISTRAL3_TEXT = _DENSE | {
    "model_type": "ministral3",
    "num_hidden_layers": 4,
    "rms_norm_eps": 1e-5,
    "rope_parameters": _YARN
    | {
        "rope_type": "yarn",
        "rope_theta": 1000000.0,
        "llama_4_scaling_beta": 0.1,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    },
    "tie_word_embeddings": True,
}

FAMILIES: dict[str, dict] = {
    "llama": _DENSE
    | {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": 2,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
    },
    "qwen3": _DENSE
    | {
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
        "num_hidden_layers": 2,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
    },
    "qwen3_moe": _DENSE
    | {
        "model_type": "qwen3_moe",
        "architectures": ["Qwen3MoeForCausalLM"],
        "num_hidden_layers": 2,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "moe_intermediate_size": 32,
        "norm_topk_prob": True,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": False,
    },
    "qwen3_5": _qwen3_5("qwen3_5", "Qwen3_5ForConditionalGeneration", moe=False),
    "qwen3_5_moe": _qwen3_5("qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration", moe=True),
    "qwen3_next": _DENSE
    | {
        "model_type": "qwen3_next",
        "architectures": ["Qwen3NextForCausalLM"],
        "num_hidden_layers": 4,
        **_GATED_DELTA,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32,
        "norm_topk_prob": True,
        "rope_theta": 10000000.0,
        "partial_rotary_factor": 0.25,
        "tie_word_embeddings": False,
    },
    "gemma3_text": _DENSE
    | {
        "model_type": "gemma3_text",
        "architectures": ["Gemma3ForCausalLM"],
        "num_hidden_layers": 4,
        "query_pre_attn_scalar": 16,
        "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0,
        "sliding_window": WINDOW,
        "sliding_window_pattern": 2,
        "layer_types": _alternate("sliding_attention", "full_attention"),
    },
    # Gemma 3n-style per-layer inputs and KV sharing (E2B, E4B): the last two layers reuse
    # the first two's keys and values, so the model has fewer caches than layers.
    "gemma4_text": _DENSE
    | {
        "model_type": "gemma4_text",
        "architectures": ["Gemma4ForCausalLM"],
        "num_hidden_layers": 4,
        "global_head_dim": 32,
        "num_kv_shared_layers": 2,
        "hidden_size_per_layer_input": 16,
        "vocab_size_per_layer_input": VOCAB_SIZE,
        "pad_token_id": CODER_SPECIAL_TOKENS.index("<|endoftext|>"),
        "sliding_window": WINDOW,
        "layer_types": _alternate("sliding_attention", "full_attention"),
        "rope_parameters": {
            "full_attention": {
                "partial_rotary_factor": 0.25,
                "rope_theta": 1000000.0,
                "rope_type": "proportional",
            },
            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
        },
        "final_logit_softcapping": 30.0,
        "tie_word_embeddings": True,
    },
    "gpt_oss": _DENSE
    | {
        "model_type": "gpt_oss",
        "architectures": ["GptOssForCausalLM"],
        "num_hidden_layers": 4,
        "intermediate_size": 64,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "rms_norm_eps": 1e-5,
        "sliding_window": WINDOW,
        "layer_types": _alternate("sliding_attention", "full_attention"),
        "rope_theta": 150000.0,
        "rope_scaling": _YARN | {"rope_type": "yarn", "truncate": False},
        "tie_word_embeddings": False,
    },
    "deepseek_v3": _DENSE
    | {
        "model_type": "deepseek_v3",
        "architectures": ["DeepseekV3ForCausalLM"],
        "num_hidden_layers": 3,
        "num_key_value_heads": 4,
        "moe_intermediate_size": 32,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "n_routed_experts": 4,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "n_group": 2,
        "topk_group": 1,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.5,
        "q_lora_rank": 48,
        "kv_lora_rank": 32,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8,
        "v_head_dim": 16,
        "rope_theta": 10000.0,
        "rope_scaling": _YARN | {"type": "yarn", "mscale": 1.0, "mscale_all_dim": 1.0},
        "tie_word_embeddings": False,
    },
    "glm4_moe": _DENSE
    | {
        "model_type": "glm4_moe",
        "architectures": ["Glm4MoeForCausalLM"],
        "num_hidden_layers": 3,
        "moe_intermediate_size": 32,
        "first_k_dense_replace": 1,
        **_ROUTED_EXPERTS,
        "routed_scaling_factor": 1.0,
        "rms_norm_eps": 1e-5,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "partial_rotary_factor": 0.5,
        "use_qk_norm": True,
        "attention_bias": True,
        "tie_word_embeddings": False,
    },
    "ministral3": _MINISTRAL3_TEXT
    | {
        "architectures": ["Ministral3ForCausalLM"],
        "sliding_window": WINDOW,
        "layer_types": _alternate("sliding_attention", "full_attention"),
    },
    # Ministral 3's checkpoints as published: the text model inside Mistral 3's wrapper.
    "mistral3": _COMMON
    | {
        "model_type": "mistral3",
        "architectures": ["Mistral3ForConditionalGeneration"],
        "text_config": _MINISTRAL3_TEXT,
    },
    "lfm2": _COMMON
    | {
        "model_type": "lfm2",
        "architectures": ["Lfm2ForCausalLM"],
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": CONTEXT,
        "norm_eps": 1e-5,
        "conv_bias": False,
        "conv_L_cache": 3,
        "block_dim": 64,
        "block_ff_dim": 192,
        "block_multiple_of": 32,
        "block_ffn_dim_multiplier": 1.0,
        "block_auto_adjust_ff_dim": True,
        "full_attn_idxs": [1, 3],
        "layer_types": _alternate("conv", "full_attention"),
        "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
    },
    # Mamba, MoE, attention, Mamba, MLP: every block kind, and caches for M and * only.
    "nemotron_h": _DENSE
    | {
        "model_type": "nemotron_h",
        "architectures": ["NemotronHForCausalLM"],
        "hybrid_override_pattern": "ME*M-",
        "num_hidden_layers": 5,
        "attention_bias": False,
        "mlp_bias": False,
        "use_bias": False,
        "use_conv_bias": True,
        "mamba_num_heads": 4,
        "mamba_head_dim": 16,
        "mamba_proj_bias": False,
        "ssm_state_size": 16,
        "conv_kernel": 4,
        "n_groups": 2,
        "layer_norm_epsilon": 1e-5,
        "moe_intermediate_size": 32,
        "moe_shared_expert_intermediate_size": 32,
        **_ROUTED_EXPERTS,
        "routed_scaling_factor": 2.5,
        "tie_word_embeddings": False,
    },
    "granitemoehybrid": _DENSE
    | {
        "model_type": "granitemoehybrid",
        "architectures": ["GraniteMoeHybridForCausalLM"],
        "num_hidden_layers": 4,
        "layer_types": ["mamba", "mamba", "attention", "mamba"],
        "intermediate_size": 32,
        "shared_intermediate_size": 64,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "attention_bias": False,
        "embedding_multiplier": 12.0,
        "attention_multiplier": 0.25,
        "logits_scaling": 4.0,
        "residual_multiplier": 0.22,
        "rms_norm_eps": 1e-5,
        "mamba_n_heads": 8,
        "mamba_d_head": 16,
        "mamba_expand": 2,
        "mamba_proj_bias": False,
        "mamba_d_state": 16,
        "mamba_d_conv": 4,
        "mamba_n_groups": 1,
        "mamba_conv_bias": True,
        "position_embedding_type": "nope",
        "tie_word_embeddings": True,
    },
    # Kimi Linear names its context model_max_length, not max_position_embeddings.
    "kimi_linear": _COMMON
    | {
        "model_type": "kimi_linear",
        "architectures": ["KimiLinearForCausalLM"],
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "head_dim": 16,
        "model_max_length": CONTEXT,
        "pad_token_id": CODER_SPECIAL_TOKENS.index("<|endoftext|>"),
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "linear_attn_config": {
            "kda_layers": [1, 2, 3],
            "full_attn_layers": [4],
            "num_heads": 4,
            "head_dim": 16,
            "short_conv_kernel_size": 4,
        },
        "kv_lora_rank": 32,
        "q_lora_rank": None,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8,
        "v_head_dim": 16,
        "mla_use_nope": True,
        "num_experts": 4,
        "num_experts_per_token": 2,
        "num_shared_experts": 1,
        "moe_intermediate_size": 32,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "moe_router_activation_func": "sigmoid",
        "moe_renormalize": True,
        "use_grouped_topk": True,
        "num_expert_group": 1,
        "topk_group": 1,
        "routed_scaling_factor": 2.5,
        "tie_word_embeddings": False,
    },
}


def _shared_tokenizer(parent: Path) -> Path:
    """The families' one tokenizer, trained once into `parent/.tokenizer` (staged, then renamed
    into place, so concurrent builders never see half of it)."""
    from .chat.templates import CHATML

    shared = parent / ".tokenizer"
    if (shared / ".complete").exists():
        return shared
    parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".tokenizer-", dir=parent))
    try:
        _train_byte_level_tokenizer(staging, VOCAB_SIZE, CONTEXT, CHATML)
        (staging / ".complete").write_text("")
        if shared.exists() and not (shared / ".complete").exists():
            shutil.rmtree(shared, ignore_errors=True)
        try:
            os.replace(staging, shared)
        except OSError:
            if not (shared / ".complete").exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return shared


def _randomize_zero_routers(seed: int):
    """Routers mlx-lm initializes to zeros would send every token to the same experts."""

    def reshape(weights: dict) -> None:
        import mlx.core as mx

        key = mx.random.key(seed + 1)
        for name in sorted(weights):
            array = weights[name]
            if name.endswith("gate.weight") and array.ndim == 2 and not mx.any(array).item():
                key, sub = mx.random.split(key)
                weights[name] = mx.random.normal(array.shape, array.dtype, key=sub) * 0.1

    return reshape


def build_tiny_family(family: str, out: Path, seed: int = 0, force: bool = False) -> Path:
    """Build `family`'s tiny model (a key of FAMILIES) into `out`, idempotently; its tokenizer
    is trained once into `out`'s parent folder, then copied."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}: one of {', '.join(sorted(FAMILIES))}")
    out = Path(out)

    def copy_tokenizer(folder: Path, vocab_size: int) -> None:
        shared = _shared_tokenizer(out.parent)
        for file in shared.iterdir():
            if file.is_file() and file.name != ".complete":
                shutil.copyfile(file, folder / file.name)

    config = copy.deepcopy(FAMILIES[family])
    return _build(out, seed, force, copy_tokenizer, config, _randomize_zero_routers(seed))
