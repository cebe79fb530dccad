"""A prompt with an image, prefilled by mlx-vlm's model into mlx-lm's caches and decoded by
mlx-lm's language model in a batch (mlxserve/vision/tower.py, mlx_lm_compat/rope_shift.py):
each step's logits equal mlx-vlm's own model's, running the whole prompt itself. The tiny
Qwen2-VL places its image's tokens by row and column (M-RoPE), so the row's positions are not
its token indexes: without the shift, the logits differ."""

from __future__ import annotations

import sys

import mlx.core as mx
import pytest
from mlx_lm.models.cache import BatchKVCache, make_prompt_cache
from mlx_lm.utils import load_model

from mlxserve.engine.mlx_lm_compat import rope_shift
from mlxserve.vision.folder import is_vision_folder, vision_installed
from mlxserve.vision.tower import VisionTower

from ..helpers import skip_for_missing
from ..vision_models import build_tiny_qwen2_vl, build_tiny_qwen3_vl, checkerboard_png

FORCED = [5, 77, 300, 12]  # tokens fed after the prompt, the same to both


BUILDERS = {"qwen2-vl": build_tiny_qwen2_vl, "qwen3-vl": build_tiny_qwen3_vl}


@pytest.fixture(scope="module", params=sorted(BUILDERS))
def vision_model(request, tmp_path_factory):
    """Each family's tiny model: Qwen2-VL's M-RoPE, Qwen3-VL's interleaved M-RoPE with its
    tower's deepstack features added to the language model's first layers."""
    if not vision_installed():
        skip_for_missing("mlx-vlm is not installed (make install-dev installs it)")
    build = BUILDERS[request.param]
    folder = build(tmp_path_factory.mktemp("models") / f"tiny-{request.param}")
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


def test_the_folder_is_a_vision_model(vision_model, tiny_model):
    assert is_vision_folder(vision_model[0]) and not is_vision_folder(tiny_model)


def test_the_language_weights_are_held_once(vision_model):
    from mlx.utils import tree_flatten

    _, language, tower = vision_model
    theirs = {id(a) for _, a in tree_flatten(language.parameters())}
    mine = [a for _, a in tree_flatten(tower.vlm.language_model.parameters())]
    assert mine and all(id(a) in theirs for a in mine)


def test_decoding_in_the_batch_equals_mlx_vlm(vision_model):
    _, language, tower = vision_model
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


@pytest.mark.parametrize("layers", [None, 1])
def test_a_prefill_in_passes_equals_one_in_one_go(vision_model, layers):
    """The vision tower a block a pass, then chunks of 7 tokens (the image's run cut across
    them, its positions sliced alike), each the whole language model in a pass or one of its
    layers a pass, leave the KV one pass leaves: the next token's logits agree."""
    _, language, tower = vision_model
    prepared = tower.prepare(prompt(tower), [checkerboard_png()])
    whole = tower.prefill(prepared, lambda: make_prompt_cache(language))
    job = tower.prefill_in_passes(prepared, lambda: make_prompt_cache(language))
    passes, image_passes, language_passes = 0, 0, []
    while not job.advance(7, layers):
        passes += 1
        image_passes += job.done_tokens == 0 and job.last_pass is None
        if job.last_pass is not None:
            language_passes.append(job.last_pass)
    # the graph built; the patch embedding; each of the tower's blocks' attention, then the
    # rest of the block; the merge
    assert image_passes == 1 + 1 + 2 * tower.vlm.config.vision_config.depth + 1
    chunks = -(-job.total // 7)
    per_chunk = 1 if layers is None else -(-len(tower.language_layers) // layers)
    assert len(language_passes) + 1 == chunks * per_chunk  # the last returned done
    assert job.layer_count == len(tower.language_layers) == len(language.layers) > 1
    assert job.result.rope_shift == whole.rope_shift
    assert next_logits_gap(language, job.result, whole) < 1e-4


def next_logits_gap(language, prefilled, other) -> float:
    """How far apart the logits of the token after two prefills of a prompt are, each decoded
    as the batch decodes it."""
    rope_shift.install()

    def next_logits(prefilled):
        for layer in prefilled.cache:
            layer.rope_shift = prefilled.rope_shift
        batch = [BatchKVCache.merge([layer]) for layer in prefilled.cache]
        return language(mx.array([[prefilled.tokens[-1]]]), cache=batch)[:, -1, :]

    return largest_difference([next_logits(prefilled)], [next_logits(other)])


def test_a_large_images_attention_is_cut_by_rows_into_passes(vision_model, monkeypatch):
    """Attention over more scores a head than attention_rows.MAX_SCORES is computed a chunk of
    query rows a pass (here a third of the image's patches): each block's attention takes
    three passes more, the KV is the one pass leaves, and MLX's own attention is back after."""
    from mlx_vlm.models import base

    from mlxserve.vision import attention_rows

    _, language, tower = vision_model
    prepared = tower.prepare(prompt(tower), [checkerboard_png()])
    whole = tower.prefill(prepared, lambda: make_prompt_cache(language))
    patches = prepared.inputs["pixel_values"].shape[0]
    monkeypatch.setattr(attention_rows, "MAX_SCORES", patches * -(-patches // 3))
    job = tower.prefill_in_passes(prepared, lambda: make_prompt_cache(language))
    image_passes = 0
    while not job.advance(len(prepared.tokens)):
        image_passes += job.done_tokens == 0
    depth = tower.vlm.config.vision_config.depth
    assert image_passes == 1 + 1 + (2 + 3) * depth + 1
    assert mx.fast.scaled_dot_product_attention is attention_rows._fused
    family = sys.modules[tower.vision_module]  # mlx-vlm's compiled wrapper, where it calls that
    assert getattr(family, "ensure_fused_sdpa", base.ensure_fused_sdpa) is base.ensure_fused_sdpa
    assert next_logits_gap(language, job.result, whole) < 1e-4


def image_prefill_setup(vision_model, **fields):
    """The model as the engine loads it, a request with an image (and `fields`), a prefix cache
    and an empty queue of image prefills."""
    from mlxserve.engine.models.host import load_model
    from mlxserve.engine.prefix.keeper import PrefixKeeper
    from mlxserve.engine.requests import GenerationRequest
    from mlxserve.engine.sequences.image_prefill import ImagePrefills
    from mlxserve.engine.stats import EngineStats
    from mlxserve.sampling.params import SamplingParams

    folder, _, _ = vision_model
    loaded = load_model(str(folder), calibrate=False)
    request = GenerationRequest(
        prompt_ids=(1,),
        max_tokens=2,
        sampling=SamplingParams(),
        seed=0,
        images=(checkerboard_png(),),
        prompt_text=prompt(loaded.vision),
        **fields,
    )
    return loaded, request, PrefixKeeper(64 << 20, EngineStats()), ImagePrefills()


def test_a_group_with_images_waits_for_its_passes_then_finds_its_kv_cached(vision_model):
    """The engine's queue of prompts with images (sequences/image_prefill.py): a pass a turn
    (the images' embeddings, then the prompt in passes of the pacer's chunk), the group handed
    back for admission only after the last, its KV then in the prefix cache under its key."""
    from mlxserve.engine.scheduling.messages import Group

    loaded, request, prefixes, queue = image_prefill_setup(vision_model)
    text = request.prompt_text
    group = Group(7, [request, request])  # two choices of one prompt: one job
    assert queue.start(group, loaded, prefixes) and len(queue) == 1
    turns = 0
    while not (admitted := queue.step(1e-9, 8, prefixes)):  # 4 tokens a pass after the first
        turns += 1
    assert admitted == [group] and turns >= 3 and len(queue) == 0
    prepared = loaded.vision.prepare(text, list(request.images))
    cache, reused = prefixes.fetch(prepared.key)
    assert reused == len(prepared.tokens) - 1
    assert loaded.vision.known_shift(prepared) is not None
    assert not queue.start(Group(8, [request]), loaded, prefixes)  # prefilled before


@pytest.mark.parametrize(
    "size",
    [(64, 48), (28, 28), (20, 20), (300, 100), (100, 900), (57, 83)],  # under and over the range
)
def test_the_front_counts_the_tokens_the_processor_makes_of_an_image(vision_model, size):
    """ImageTokens (read off the folder's configs, no MLX: the front counts with it) says how
    many tokens mlx-vlm's processor expands an image of each size into."""
    from mlxserve.vision.folder import ImageTokens

    folder, _, tower = vision_model
    counted = ImageTokens.of_folder(folder)
    prepared = tower.prepare(prompt(tower), [checkerboard_png(size)])
    assert counted.count(*size) == prepared.tokens.count(tower.image_token_id)


def test_a_prompt_not_to_be_cached_is_prefilled_in_passes_and_handed_to_its_sequence(vision_model):
    """`cache_prompt: false` (or the prefix cache off): the prompt with images is still
    prefilled a pass a turn beside the streams; its KV is handed to its sequence through the
    tower, nothing kept in the prefix cache."""
    from mlxserve.engine.scheduling.messages import Group

    loaded, request, prefixes, queue = image_prefill_setup(vision_model, cache_prompt=False)
    text = request.prompt_text
    assert queue.start(Group(9, [request]), loaded, prefixes)
    turns = 0
    while not queue.step(1e-9, 8, prefixes):
        turns += 1
    assert turns >= 3
    prepared = loaded.vision.prepare(text, list(request.images))
    assert prefixes.fetch(prepared.key)[1] == 0  # not kept
    handed = loaded.vision.take_handed(prepared)
    assert handed is not None and len(handed.tokens) == len(prepared.tokens)
    whole = loaded.vision.prefill(prepared, lambda: make_prompt_cache(loaded.model))
    assert handed.rope_shift == whole.rope_shift
    assert loaded.vision.take_handed(prepared) is None  # taken once
