"""A vision-language model's image side beside mlx-lm's language model: a prompt with images
prefilled into KV the continuous batch then decodes from.

mlx-vlm loads the folder (its processor, vision tower and projector, and a language model of its
own); its language model is pointed at mlx-lm's arrays, so the weights are held once. A prompt
is prefilled by mlx-vlm's model, which knows how its family places image tokens (M-RoPE's rows
and columns), into mlx-lm's caches; what the batch needs besides is the shift between the
prompt's last token's index and its position (`rope_shift`), which the row keeps while it
decodes (`mlx_lm_compat/rope_shift.py`).
"""

from __future__ import annotations

import hashlib
import io
import logging
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from ..module_calls import with_call
from .attention_rows import rows_chunked

log = logging.getLogger("mlxserve.engine")


@dataclass(frozen=True)
class Prepared:
    """A prompt with images as the model's processor reads it: its tokens (each image's
    placeholder expanded), the processor's arrays, and its prefix cache key: the tokens with
    each image's run of tokens replaced by ids drawn from the image's digest (negative: no
    token has them), so that the cache tells images apart."""

    tokens: list[int]
    inputs: dict
    key: list[int]
    images_end: int  # the index after the last image token (0: none found)


@dataclass(frozen=True)
class Prefilled:
    """A prompt with images, prefilled: its tokens, the KV of all of them but the last (mlx-lm's
    caches, one a layer), and the last token's position less its index."""

    tokens: list[int]
    cache: list
    rope_shift: int


# Shifts remembered, by the key up to a prompt's last image: a prompt found in the prefix cache
# is not prefilled again, and its row needs the shift its first prefill measured
KNOWN_SHIFTS = 4096
PREPARED_KEPT = 16  # prompts with images (and the images) as the processor gave them, the latest
HANDED_KEPT = 8  # prefills waiting for their sequences to start, where the prefix cache is off


class VisionTower:
    """mlx-vlm's side of a vision-language model, its language weights shared with mlx-lm's."""

    def __init__(self, vlm: nn.Module, processor) -> None:
        self.vlm = vlm
        self.processor = processor
        self._shifts: dict[int, int] = {}  # KNOWN_SHIFTS of them, the oldest dropped first
        self._prepared: dict[tuple, Prepared] = {}  # PREPARED_KEPT of them
        self._handed: dict[tuple[int, ...], Prefilled] = {}  # HANDED_KEPT of them
        # While a prefill's graph is built: each of the vision tower's blocks' outputs, in order
        self.recording: list[mx.array] | None = None
        self.language_layers = _record_blocks(self)
        vision = _vision_of(vlm)
        self.vision_module = None if vision is None else type(vision).__module__

    @classmethod
    def load(cls, folder: Path, language_model: nn.Module) -> VisionTower:
        """mlx-vlm's model and processor for `folder`; its language model reads
        `language_model`'s arrays where their names and shapes match (else it keeps its own:
        the weights are then held twice, which the log says)."""
        from mlx_vlm.utils import load as load_vlm

        vlm, processor = load_vlm(str(folder), lazy=True)
        shared = _share_language_weights(vlm.language_model, language_model)
        if not shared:
            log.warning(
                "%s: mlx-vlm's language model does not match mlx-lm's; its weights are held twice",
                Path(folder).name,
            )
        mx.eval(vlm.parameters())
        vlm.eval()
        return cls(vlm, processor)

    @property
    def image_token_id(self) -> int | None:
        config = self.vlm.config
        for name in ("image_token_id", "image_token_index"):
            value = getattr(config, name, None)
            if isinstance(value, int):
                return value
        return None

    def prepare(self, prompt: str, images: list[bytes]) -> Prepared:
        """`prompt` (the chat template's text, one placeholder an image) with `images`
        (encoded: PNG, JPEG, ...) through the model's processor, or as it was read before (the
        engine reads a request's images on a thread of its own, `read`, then prepares its
        prefill and its sequence from what it read)."""
        asked = _asked(prompt, images)
        prepared = self._prepared.get(asked)
        if prepared is None:
            prepared = self.read(prompt, images)
            self._keep(asked, prepared)
        return prepared

    def has_read(self, prompt: str, images: tuple[bytes, ...]) -> bool:
        return _asked(prompt, images) in self._prepared

    def keep(self, prompt: str, images: tuple[bytes, ...], prepared: Prepared) -> None:
        """What `read` made of `prompt` and `images`, for `prepare` to return."""
        self._keep(_asked(prompt, images), prepared)

    def _keep(self, asked: tuple, prepared: Prepared) -> None:
        self._prepared[asked] = prepared
        while len(self._prepared) > PREPARED_KEPT:
            self._prepared.pop(next(iter(self._prepared)))

    def read(self, prompt: str, images: list[bytes]) -> Prepared:
        """The processor's reading of `prompt` with `images`, its arrays evaluated: on any
        thread (each thread evaluates on a stream of its own)."""
        from mlx_vlm.utils import prepare_inputs
        from PIL import Image

        pictures = [Image.open(io.BytesIO(data)).convert("RGB") for data in images]
        inputs = prepare_inputs(
            self.processor,
            images=pictures,
            prompts=prompt,
            image_token_index=self.image_token_id,
            add_special_tokens=False,
        )
        mx.eval([value for value in inputs.values() if isinstance(value, mx.array)])
        tokens = inputs["input_ids"][0].tolist()
        key, end = _keyed(tokens, self.image_token_id, images)
        return Prepared(tokens, inputs, key, end)

    def prefill(self, prepared: Prepared, make_cache) -> Prefilled:
        """All of the prompt's tokens but the last into `make_cache()`'s layers, in one go."""
        job = self.prefill_in_passes(prepared, make_cache)
        while not job.advance(len(prepared.tokens)):
            pass
        return job.result

    def prefill_in_passes(self, prepared: Prepared, make_cache) -> PrefillJob:
        """The same prefill as a job run a pass at a time (`PrefillJob.advance`), so that the
        batch's streams step between its passes."""
        return PrefillJob(self, prepared, make_cache())

    def _remember(self, prepared: Prepared, shift: int) -> None:
        self._shifts[_images_key(prepared)] = shift
        while len(self._shifts) > KNOWN_SHIFTS:
            self._shifts.pop(next(iter(self._shifts)))

    def hand_over(self, key: list[int], prefilled: Prefilled) -> None:
        """Keep a prefill for the sequence that starts from it next (`take_handed`): a prompt
        prefilled in passes where the prefix cache does not keep it."""
        self._handed[tuple(key)] = prefilled
        while len(self._handed) > HANDED_KEPT:
            self._handed.pop(next(iter(self._handed)))

    def take_handed(self, prepared: Prepared) -> Prefilled | None:
        return self._handed.pop(tuple(prepared.key), None)

    def known_shift(self, prepared: Prepared) -> int | None:
        """The shift a prompt with the same images (and text before them) was prefilled with,
        if one was."""
        return self._shifts.get(_images_key(prepared))


class PrefillJob:
    """A prompt with images prefilled a pass at a time: first the images' embeddings, half a
    block of the vision tower a pass (the whole graph is built lazily, then evaluated up to each
    block's attention's output, its rows a chunk a pass for a large image (attention_rows.py),
    and the block's in turn), then the language model over the prompt's embeddings, positions
    as the family places them, a chunk of the tokens each `advance` allows at a time, each
    chunk's graph built once and evaluated up to the output of as many of its layers as the
    pass allows (a pass of the whole model over a few tokens cost more than a decode step: a
    pass of a few layers over many tokens fits beside one). `result` once done."""

    def __init__(self, tower: VisionTower, prepared: Prepared, cache: list) -> None:
        self.tower = tower
        self.prepared = prepared
        self.cache = cache
        self.done_tokens = 0  # of the prompt's tokens but the last, in the cache
        self.features = None
        self.blocks: list[mx.array] = []  # the vision tower's block outputs not yet evaluated
        self.embedded = False
        # the language model's chunk under way: its layers' outputs not yet evaluated (the
        # cache's state last), and the token after it
        self.layers: list = []
        self.states: list = []  # ...and its cache's state after them
        self.chunk_end = 0
        self.last_pass: tuple[int, int] | None = None  # a language pass's (layers, tokens)
        self.result: Prefilled | None = None

    @property
    def total(self) -> int:
        return len(self.prepared.tokens) - 1

    @property
    def chunk_tokens(self) -> int:
        """The tokens of the language model's chunk under way (0: none is)."""
        return self.chunk_end - self.done_tokens if self.layers else 0

    @property
    def layer_count(self) -> int:
        """The language model's layers a chunk is evaluated by (1: the whole model at once,
        where its layers were not found)."""
        return len(self.tower.language_layers) or 1

    def advance(self, tokens: int, layers: int | None = None) -> bool:
        """One pass: the images' embeddings, or the language model over the prompt in chunks
        of up to `tokens`, `layers` of its layers a pass (None: all of them). Whether done."""
        inputs = self.prepared.inputs
        ids = inputs["input_ids"]
        self.last_pass = None
        if self.features is None:
            extra = {
                k: v
                for k, v in inputs.items()
                if k not in ("input_ids", "pixel_values", "attention_mask")
            }
            self.tower.recording = []
            try:
                with rows_chunked(self.tower.recording, self.tower.vision_module):
                    self.features = self.tower.vlm.get_input_embeddings(
                        ids, inputs.get("pixel_values"), **extra
                    )
            finally:
                self.blocks, self.tower.recording = self.tower.recording, None
            return False  # the graph built (the processor's numbers read): a pass of its own
        if self.blocks:
            mx.eval(self.blocks.pop(0))
            return False
        if not self.embedded:
            mx.eval(self.features.inputs_embeds)
            self.embedded = True
            return self._finish() if self.total <= 0 else False
        if not self.layers:
            self._build_chunk(ids, min(self.total, self.done_tokens + max(1, tokens)))
        count = len(self.layers) if layers is None else max(1, layers)
        now, self.layers = self.layers[:count], self.layers[count:]
        mx.eval(now[-1] if self.layers else [now[-1], self.states])  # the earlier ones with it
        self.last_pass = (len(now), self.chunk_end - self.done_tokens)
        if self.layers:
            return False
        self.done_tokens = self.chunk_end
        return self._finish() if self.done_tokens >= self.total else False

    def _build_chunk(self, ids: mx.array, end: int) -> None:
        """The language model's graph over the prompt's tokens from `done_tokens` to `end`,
        each layer's output recorded; the cache's state after them."""
        start = self.done_tokens
        self.tower.recording = []
        try:
            self.tower.vlm.language_model(
                ids[:, start:end],
                inputs_embeds=self.features.inputs_embeds[:, start:end],
                cache=self.cache,
                **_pass_inputs(self.features, start, end),
            )
        finally:
            recorded, self.tower.recording = self.tower.recording, None
        self.states = [c.state for c in self.cache]
        self.layers = recorded or [self.states]
        self.chunk_end = end

    def _finish(self) -> bool:
        deltas = getattr(self.features, "rope_deltas", None)
        shift = int(mx.array(deltas).reshape(-1)[0].item()) if deltas is not None else 0
        self.tower._remember(self.prepared, shift)
        self.result = Prefilled(self.prepared.tokens, self.cache, shift)
        self.features = None
        return True


def _pass_inputs(features, start: int, end: int) -> dict:
    """What a family's language model reads besides the embeddings, for the prompt's tokens
    [start, end): their positions (M-RoPE's rows and columns), and where the tower's early
    blocks' features are added to the first layers (Qwen3-VL's deepstack), the image tokens
    among them and their rows of those features."""
    kwargs = {}
    positions = getattr(features, "position_ids", None)
    if positions is not None:
        kwargs["position_ids"] = positions[..., start:end]
    masks = getattr(features, "visual_pos_masks", None)
    deepstack = getattr(features, "deepstack_visual_embeds", None)
    if masks is not None and deepstack is not None:
        before = int(masks[0, :start].sum().item())
        within = int(masks[0, start:end].sum().item())
        if within:
            kwargs["visual_pos_masks"] = masks[:, start:end]
            kwargs["deepstack_visual_embeds"] = [
                layer[before : before + within] for layer in deepstack
            ]
    return kwargs


ATTENTION_NAMES = ("attn", "self_attn", "attention")  # a vision block's attention, by family


def _record_blocks(tower: VisionTower) -> list[nn.Module]:
    """The vision tower's patch embedding, each of its blocks (its longest list of modules),
    each block's attention and each of the language model's layers record their outputs on
    `tower.recording` while that is a list, in the order they are called: what a prefill
    evaluates a pass at a time. The language model's layers (none where they are not found:
    its chunks are then evaluated whole)."""

    def __call__(self, *args, **kwargs):
        out = super(type(self), self).__call__(*args, **kwargs)  # the block's own class's
        if tower.recording is not None:
            first = out[0] if isinstance(out, tuple) else out
            if isinstance(first, mx.array):
                tower.recording.append(first)
        return out

    language = getattr(tower.vlm, "language_model", None)
    layers = _longest_module_list(language) if isinstance(language, nn.Module) else []
    for layer in layers:
        with_call(layer, "Recorded", __call__)
    vision = _vision_of(tower.vlm)
    blocks = [] if vision is None else _longest_module_list(vision)
    if not blocks:
        return layers
    # the patch embedding first (a pass of its own), then each block
    embedding = [
        m
        for m in (getattr(vision, n, None) for n in ("patch_embed", "embeddings"))
        if isinstance(m, nn.Module)
    ]

    # a block's attention a pass of its own before the rest of the block: half a block's time
    attentions = [
        getattr(block, name)
        for block in blocks
        for name in ATTENTION_NAMES
        if isinstance(getattr(block, name, None), nn.Module)
    ]
    for module in [*embedding[:1], *blocks, *attentions]:
        with_call(module, "Recorded", __call__)
    return layers


def _longest_module_list(root: nn.Module) -> list[nn.Module]:
    """`root`'s longest list of modules of one kind (a tower's blocks, a language model's
    layers; not an MLP's Linear, GELU, Linear), or []."""
    lists = [
        value
        for _, module in root.named_modules()
        for value in module.values()
        if isinstance(value, list)
        and value
        and all(isinstance(v, nn.Module) and type(v) is type(value[0]) for v in value)
    ]
    return max(lists, key=len) if lists else []


def _vision_of(vlm: nn.Module) -> nn.Module | None:
    """The model's vision tower, where it has one under a name mlx-vlm's families use."""
    vision = getattr(vlm, "vision_tower", None) or getattr(vlm, "vision_model", None)
    return vision if isinstance(vision, nn.Module) else None


def _asked(prompt: str, images) -> tuple:
    """What `prepare` remembers a prompt with images by: the images themselves, not a digest.
    The engine thread asks several times a request (`has_read`, `keep`, `prepare`); a bytes
    object hashes once and keeps its hash, where a digest reads every byte each time."""
    return (prompt, tuple(images))


def _images_key(prepared: Prepared) -> int:
    return hash(tuple(prepared.key[: prepared.images_end]))


def _keyed(
    tokens: list[int], image_token: int | None, images: list[bytes]
) -> tuple[list[int], int]:
    """`tokens` with the k-th run of image tokens replaced by ids from the k-th image's digest
    (one digest of them all where runs and images do not pair up), and the index after the last
    image token."""
    runs, start = [], None
    for i, token in enumerate([*tokens, None]):
        if token == image_token and start is None:
            start = i
        elif token != image_token and start is not None:
            runs.append((start, i))
            start = None
    if not runs:
        return list(tokens), 0
    digests = [hashlib.sha256(data).digest() for data in images]
    if len(runs) != len(digests):
        digests = [hashlib.sha256(b"".join(digests)).digest()] * len(runs)
    key = list(tokens)
    for (a, b), digest in zip(runs, digests):
        seed = int.from_bytes(digest[:8], "little")
        for offset, i in enumerate(range(a, b)):
            key[i] = -1 - (seed + offset) % (2**31 - 2)
    return key, runs[-1][1]


def _share_language_weights(vlm_language: nn.Module, language_model: nn.Module) -> bool:
    """Point mlx-vlm's language model at mlx-lm's arrays, where every one of its arrays has a
    counterpart of the same name (under mlx-lm's `language_model.`, or none) and shape."""
    from mlx.utils import tree_flatten, tree_unflatten

    theirs = dict(tree_flatten(language_model.parameters()))
    mine = tree_flatten(vlm_language.parameters())
    shared = []
    for name, array in mine:
        other = theirs.get(f"language_model.{name}", theirs.get(name))
        if other is None or other.shape != array.shape:
            return False
        shared.append((name, other))
    vlm_language.update(tree_unflatten(shared))
    return True
