"""Random-weight vision-language models built in seconds, for the tests and the benchmarks, as
mlx-vlm's own tests build theirs: a byte-level tokenizer trained here with the family's special
tokens, the family's config, mlx-vlm's model class's own random weights, and the family's image
processor config. Loaded by mlx-vlm (the image side) and mlx-lm (the language model)."""

from __future__ import annotations

import json
from pathlib import Path

QWEN2_VL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
# Qwen2-VL's own template, cut to what the tests send: text and image parts, ChatML turns
QWEN2_VL_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% elif part['type'] == 'text' %}"
    "{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Qwen3-VL's template cut likewise, with its tools: calls in <tool_call> tags, results (their
# images too) in <tool_response> inside a user turn
QWEN3_VL_TEMPLATE = (
    "{%- macro parts(content) -%}{% if content is string %}{{ content }}{% elif content %}"
    "{% for part in content %}{% if part['type'] == 'image' %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% elif part['type'] == 'text' %}"
    "{{ part['text'] }}{% endif %}{% endfor %}{% endif %}{%- endmacro -%}"
    "{% if tools %}<|im_start|>system\n# Tools\n<tools>{% for tool in tools %}\n"
    "{{ tool | tojson }}{% endfor %}\n</tools><|im_end|>\n{% endif %}"
    "{% for message in messages %}{% if message['role'] == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}<|im_start|>user{% endif %}"
    "\n<tool_response>\n{{ parts(message['content']) }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}<|im_end|>\n{% endif %}"
    "{% else %}<|im_start|>{{ message['role'] }}\n{{ parts(message['content']) }}"
    "{% for call in message['tool_calls'] or [] %}<tool_call>\n"
    '{"name": "{{ call[\'function\'][\'name\'] }}", "arguments": '
    "{{ call['function']['arguments'] | tojson }}}\n</tool_call>{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
IMAGE_MEAN = [0.48145466, 0.4578275, 0.40821073]
IMAGE_STD = [0.26862954, 0.26130258, 0.27577711]


# The tests' size: 2 text layers of 64, a 2-layer vision tower, images of up to 16 tokens
TINY_TEXT = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rope_scaling": {"type": "mrope", "mrope_section": [4, 2, 2]},
}
TINY_VISION = {"depth": 2, "embed_dim": 32, "num_heads": 2}
TINY_IMAGE_TOKENS = 16  # the most merged patches an image becomes


def build_tiny_qwen2_vl(
    out: Path,
    seed: int = 0,
    text: dict | None = None,
    vision_size: dict | None = None,
    image_tokens: int = TINY_IMAGE_TOKENS,
) -> Path:
    """Qwen2-VL (M-RoPE: an image's tokens placed by row and column), random weights, a
    tokenizer trained here with its special tokens: the tests' size by default, larger with
    `text` (the language model's config) and `vision_size` (the tower's depth, width, heads);
    an image becomes at most `image_tokens` tokens."""
    from mlx_vlm.models import qwen2_vl

    out = Path(out)
    if (out / "model.safetensors").exists():
        return out
    vocab_size = _write_qwen_tokenizer(out)
    ids = {token: QWEN2_VL_TOKENS.index(token) for token in QWEN2_VL_TOKENS}
    text = text or TINY_TEXT
    vision = {
        **(vision_size or TINY_VISION),
        "hidden_size": text["hidden_size"],
        "patch_size": 14,
        "spatial_patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "in_channels": 3,
        "mlp_ratio": 2,
    }
    config = {
        "model_type": "qwen2_vl",
        "architectures": ["Qwen2VLForConditionalGeneration"],
        **text,
        "rms_norm_eps": 1e-6,
        "vocab_size": vocab_size,
        "max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "eos_token_id": ids["<|im_end|>"],
        "bos_token_id": None,
        "vision_config": vision,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    _write_qwen_processor(out, patch=14, image_tokens=image_tokens)
    model_config = qwen2_vl.ModelConfig.from_dict(json.loads(json.dumps(config)))
    model_config.vision_config = qwen2_vl.VisionConfig.from_dict(vision)
    model_config.text_config = qwen2_vl.TextConfig.from_dict(model_config.text_config)
    _save_random(qwen2_vl.Model, model_config, seed, out)
    return out


# Qwen3-VL's tests' size: as Qwen2-VL's, its tower a block deeper (two of its three blocks feed
# the language model's first layers: deepstack), 16-pixel patches
TINY_QWEN3_TEXT = {
    "hidden_size": 64,
    "num_hidden_layers": 3,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
}


def build_tiny_qwen3_vl(out: Path, seed: int = 0, image_tokens: int = TINY_IMAGE_TOKENS) -> Path:
    """Qwen3-VL (interleaved M-RoPE, a tower with learned position embeddings whose early
    blocks' features are added to the language model's first layers at the image's tokens:
    deepstack), random weights, the same tokenizer as Qwen2-VL's with its template's tools (a
    tool's result may hold images); an image becomes at most `image_tokens` tokens."""
    from mlx_vlm.models import qwen3_vl

    out = Path(out)
    if (out / "model.safetensors").exists():
        return out
    vocab_size = _write_qwen_tokenizer(out, QWEN3_VL_TEMPLATE)
    ids = {token: QWEN2_VL_TOKENS.index(token) for token in QWEN2_VL_TOKENS}
    text = {
        "model_type": "qwen3_vl_text",
        **TINY_QWEN3_TEXT,
        "rms_norm_eps": 1e-6,
        "vocab_size": vocab_size,
        "max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "rope_scaling": {
            "rope_type": "default",
            "mrope_section": [4, 2, 2],
            "mrope_interleaved": True,
        },
        "tie_word_embeddings": True,
    }
    vision = {
        "model_type": "qwen3_vl",
        "depth": 3,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "out_hidden_size": text["hidden_size"],
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "in_channels": 3,
        "num_position_embeddings": 64,
        "deepstack_visual_indexes": [0, 1],
    }
    config = {
        "model_type": "qwen3_vl",
        "architectures": ["Qwen3VLForConditionalGeneration"],
        "text_config": text,
        "vision_config": vision,
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
        "eos_token_id": ids["<|im_end|>"],
        "vocab_size": vocab_size,
        "tie_word_embeddings": True,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    _write_qwen_processor(out, patch=16, image_tokens=image_tokens)
    model_config = qwen3_vl.ModelConfig.from_dict(json.loads(json.dumps(config)))
    _save_random(qwen3_vl.Model, model_config, seed, out)
    return out


def _write_qwen_tokenizer(out: Path, template: str = QWEN2_VL_TEMPLATE) -> int:
    """A byte-level BPE tokenizer trained here with Qwen's special tokens and a cut of Qwen's
    chat template, saved in `out`; its vocabulary's size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from .tiny_model import _stdlib_text

    out.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=QWEN2_VL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_stdlib_text(200_000).splitlines(keepends=True), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )
    fast.chat_template = template
    fast.save_pretrained(str(out))
    return tokenizer.get_vocab_size()


def _write_qwen_processor(out: Path, patch: int, image_tokens: int) -> None:
    """Qwen's image processor config: images resized to a grid of `patch`-pixel patches, merged
    2x2 into tokens, at most `image_tokens` of them."""
    side = patch * 2
    processor = {
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": "Qwen2VLProcessor",
        "min_pixels": side * side * 4,
        "max_pixels": side * side * image_tokens,
        "patch_size": patch,
        "merge_size": 2,
        "temporal_patch_size": 2,
        "image_mean": IMAGE_MEAN,
        "image_std": IMAGE_STD,
        "do_resize": True,
        "do_rescale": True,
        "do_normalize": True,
        "do_convert_rgb": True,
        "rescale_factor": 1 / 255,
    }
    (out / "preprocessor_config.json").write_text(json.dumps(processor, indent=2))


def _save_random(model_class, model_config, seed: int, out: Path) -> None:
    """mlx-vlm's model of the family with its own random weights, saved as its tree names them."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    mx.random.seed(seed)
    model = model_class(model_config)
    mx.save_safetensors(str(out / "model.safetensors"), dict(tree_flatten(model.parameters())))
