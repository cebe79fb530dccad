"""A prompt with an image, prefilled by mlx-vlm's model into mlx-lm's caches and decoded by
mlx-lm's language model in a batch (mlxserve/vision/tower.py, mlx_lm_compat/rope_shift.py):
each step's logits equal mlx-vlm's own model's, running the whole prompt itself. The tiny
Qwen2-VL places its image's tokens by row and column (M-RoPE), so the row's positions are not
its token indexes: without the shift, the logits differ."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models.cache import BatchKVCache, make_prompt_cache
from mlx_lm.utils import load_model

from mlxserve.engine.mlx_lm_compat import rope_shift
from mlxserve.vision.tower import VisionTower, is_vision_folder, vision_installed

from ..helpers import skip_for_missing
from ..vision_models import build_tiny_qwen2_vl, checkerboard_png

FORCED = [5, 77, 300, 12]  # tokens fed after the prompt, the same to both


@pytest.fixture(scope="module")
def qwen2_vl(tmp_path_factory):
    if not vision_installed():
        skip_for_missing("mlx-vlm is not installed (make install-dev installs it)")
    folder = build_tiny_qwen2_vl(tmp_path_factory.mktemp("models") / "tiny-qwen2-vl")
    language, _ = load_model(folder, lazy=True)
    tower = VisionTower.load(folder, language)
    return folder, language, tower


def prompt(tower) -> str:
    messages = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]}
    ]
    return tower.processor.tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )


def mlx_vlm_logits(tower, language, text: str, image: bytes) -> list[mx.array]:
    """mlx-vlm's model over the whole prompt, then FORCED one at a time: each step's logits."""
    import io

    from mlx_vlm.utils import prepare_inputs
    from PIL import Image

    inputs = prepare_inputs(
        tower.processor,
        images=[Image.open(io.BytesIO(image)).convert("RGB")],
        prompts=text,
        image_token_index=tower.image_token_id,
        add_special_tokens=False,
    )
    extra = {
        k: v for k, v in inputs.items() if k not in ("input_ids", "pixel_values", "attention_mask")
    }
    cache = make_prompt_cache(language)
    out = tower.vlm(inputs["input_ids"], inputs["pixel_values"], cache=cache, **extra)
    logits = [out.logits[:, -1, :]]
    for token in FORCED:
        logits.append(tower.vlm.language_model(mx.array([[token]]), cache=cache).logits[:, -1, :])
    return logits


def batch_logits(tower, language, text: str, image: bytes, shift: bool = True) -> list[mx.array]:
    """The tower's prefill, its caches merged as the batch merges a sequence's (with its
    shift), the last prompt token and FORCED decoded by mlx-lm's model."""
    rope_shift.install()
    prefilled = tower.prefill(tower.prepare(text, [image]), lambda: make_prompt_cache(language))
    for layer in prefilled.cache:
        layer.rope_shift = prefilled.rope_shift if shift else 0
    batch = [BatchKVCache.merge([layer]) for layer in prefilled.cache]
    logits = [language(mx.array([[prefilled.tokens[-1]]]), cache=batch)[:, -1, :]]
    for token in FORCED:
        logits.append(language(mx.array([[token]]), cache=batch)[:, -1, :])
    return logits


def largest_difference(a: list[mx.array], b: list[mx.array]) -> float:
    return max(mx.max(mx.abs(x - y)).item() for x, y in zip(a, b))


def test_the_folder_is_a_vision_model(qwen2_vl, tiny_model):
    assert is_vision_folder(qwen2_vl[0]) and not is_vision_folder(tiny_model)


def test_the_language_weights_are_held_once(qwen2_vl):
    from mlx.utils import tree_flatten

    _, language, tower = qwen2_vl
    theirs = {id(a) for _, a in tree_flatten(language.parameters())}
    mine = [a for _, a in tree_flatten(tower.vlm.language_model.parameters())]
    assert mine and all(id(a) in theirs for a in mine)


def test_decoding_in_the_batch_equals_mlx_vlm(qwen2_vl):
    _, language, tower = qwen2_vl
    text, image = prompt(tower), checkerboard_png()
    expected = mlx_vlm_logits(tower, language, text, image)
    prefilled = tower.prefill(tower.prepare(text, [image]), lambda: make_prompt_cache(language))
    assert prefilled.rope_shift < 0  # an image's tokens take fewer positions than tokens
    assert tower.image_token_id in prefilled.tokens
    assert largest_difference(batch_logits(tower, language, text, image), expected) < 1e-4
    # the shift is what makes them equal, and the image is what they read
    assert largest_difference(batch_logits(tower, language, text, image, False), expected) > 1e-2
    other = checkerboard_png(colors=((0, 0, 255), (255, 255, 0)))
    assert largest_difference(batch_logits(tower, language, text, other), expected) > 1e-3
