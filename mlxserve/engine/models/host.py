"""Loading the active model and reading the facts the server needs about it."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.nn as nn

from ...embedding.kinds import embedding_architecture
from ...fim import CONFIG_KEY, FimError, model_fim
from ...planning.model_facts import ModelFacts
from ...platform import PlatformPolicy, current_policy
from ...registry import context_length_of
from ...vision.folder import ImageTokens
from ..mlx_lm_compat.cache_kinds import CacheLayout
from ..mlx_lm_compat.quantized_kv import install as install_quantized_kv
from ..prefix.fingerprint import model_fingerprint
from .features import features_off_for
from .naming import model_id_for, size_text
from .sources import (
    ModelLoadError,
    cached_hub_folder,
    check_model_source,
    first_line,
    hub_endpoint,
    hub_failed,
    looks_like_path,
)

FALLBACK_CONTEXT = 4096  # a model folder that declares no context window
# A calibration prefill slower than this (MLX's reference BLAS: 20 s or more) is timed once,
# not twice: it was most of a minute-long load.
REPEAT_TIMING_UNDER_S = 2.0
# A load reads (and converts) this many bytes of weights between two turns of the other models'
# streams: their gap while a model loads is a slice's read, not the whole load.
LOAD_SLICE_BYTES = 64 << 20
log = logging.getLogger("mlxserve.engine")


@dataclass
class LoadedModel(ModelFacts):
    """The model's facts (planning/model_facts.py) and the model itself."""

    model: nn.Module = field(kw_only=True)
    prefill_chunk: int = 512  # prompt tokens prefilled between two decode steps
    decode_step_s: float | None = None  # one sequence's decode step, timed at load
    weights_folder: Path | None = None  # its files on this machine (None: a rank's shard)
    draft: LoadedModel | None = None  # --draft-model's, loaded beside it (draft.py)
    draft_kv_share: float = 0.0  # the draft's KV per token over the model's own
    vision: Any = None  # a vision model's image side (vision/tower.py's VisionTower)

    def fingerprint(self) -> str | None:
        """What its KV depends on (`prefix/fingerprint.py`: reads blocks of every weight
        file, so only the disk cache asks); None where its files are not on this machine."""
        if self.weights_folder is None:
            return None
        return model_fingerprint(self.weights_folder, self.how_it_runs)


class LoadProgress:
    """What a load is doing now, for the log (one INFO line a phase), GET /admin/status and
    GET /health's 503 body. The engine thread writes it; any thread reads it.

    Phases, in order: `downloading` (a hub repo not in the local cache), `reading config and
    tokenizer`, `reading weights`, `converting weights` (for MLX's CPU backend: dequantized,
    float32), `calibrating` (timing a decode step and a prompt chunk on this machine: the
    prefill chunk's start, minutes on a slow BLAS)."""

    def __init__(self, source: str):
        self.name = model_id_for(source)
        self.phase = "starting"
        self.weight_files = 0
        self.weight_bytes = 0
        self.started = self.phase_started = time.monotonic()

    def enter(self, phase: str, detail: str = "") -> None:
        self.phase, self.phase_started = phase, time.monotonic()
        log.info(
            "loading %s [%.1f s]: %s%s",
            self.name,
            self.phase_started - self.started,
            phase,
            f" ({detail})" if detail else "",
        )

    def count_weights(self, folder: Path) -> str:
        """Note the weight files in `folder` (those mlx-lm reads); their names and size."""
        files = sorted(folder.glob("model*.safetensors"))
        self.weight_files = len(files)
        self.weight_bytes = sum(f.stat().st_size for f in files)
        names = ", ".join(f.name for f in files[:2]) + (", ..." if len(files) > 2 else "")
        plural = "" if len(files) == 1 else "s"
        return f"{len(files)} file{plural}: {names}, {size_text(self.weight_bytes)}"

    def as_dict(self) -> dict[str, Any]:
        now = time.monotonic()
        return {
            "phase": self.phase,
            "weight_files": self.weight_files,
            "weight_bytes": self.weight_bytes,
            "elapsed_s": round(now - self.started, 1),
            "phase_elapsed_s": round(now - self.phase_started, 1),
        }


def load_model(
    path_or_repo: str,
    fim_template: str | None = None,
    cluster=None,
    policy: PlatformPolicy | None = None,
    progress: LoadProgress | None = None,
    kv_quantization: tuple[int, int] | None = None,
    between: Callable[[], None] | None = None,
    calibrate: bool = True,
) -> LoadedModel:
    """`fim_template`: a template name forcing that FIM format ("none": no infill); None
    detects it from the vocabulary. `cluster`: load this rank's shard (engine/cluster/lockstep.py).
    `policy`: how this platform runs the model (None: `current_policy()`). `progress`: where
    the load says what it is doing (phase by phase, in the log too). `kv_quantization`: (bits,
    group size) of the KV caches, None for the model's own dtype. `between`: called between
    slices of the load (weights read, converted, timed), where other models' streams step.
    `calibrate`: time a decode step and a prompt chunk (a draft model, whose prompts ride with
    its model's, needs neither)."""
    import mlx_lm

    from_hub = not looks_like_path(path_or_repo)
    if not from_hub:  # a hub repo was looked up before serving; its download says what failed
        check_model_source(path_or_repo)
    policy = policy if policy is not None else current_policy()
    progress = progress if progress is not None else LoadProgress(path_or_repo)
    sharded = cluster is not None and cluster.size > 1
    folder = cached_hub_folder(path_or_repo) if from_hub else Path(path_or_repo).expanduser()
    architecture = embedding_architecture(folder) if folder is not None else None
    if architecture is not None:
        from .embedding import load_embedding_model

        return load_embedding_model(
            folder, architecture, path_or_repo, policy, progress, between, cluster
        )
    try:
        if sharded:
            shard_of = progress.count_weights(folder) if folder is not None else path_or_repo
            progress.enter("reading weights", f"this rank's shard of {shard_of}")
            model, tokenizer, config = cluster.load(path_or_repo)
        else:
            if folder is None:
                progress.enter("downloading", f"{path_or_repo} from the Hugging Face hub")
            else:
                progress.enter("reading config and tokenizer", str(folder))
            model, tokenizer, config = mlx_lm.load(path_or_repo, lazy=True, return_config=True)
            folder = folder or cached_hub_folder(path_or_repo)
            weights = progress.count_weights(folder) if folder is not None else ""
            progress.enter("reading weights", weights)
            eval_in_slices(model, between)
    except Exception as error:  # mlx-lm raises many kinds; the user needs one clear line
        if from_hub and folder is None:
            failed = f"downloading it from {hub_endpoint()} failed ({first_line(error)})"
            raise hub_failed(path_or_repo, failed) from error
        raise ModelLoadError(f"could not load model {path_or_repo}: {first_line(error)}") from error
    try:
        fim = model_fim(tokenizer.get_vocab(), config, fim_template)
    except FimError as error:
        source = "--fim-template" if fim_template else f"its config.json's {CONFIG_KEY}"
        raise ModelLoadError(f"{source} for {path_or_repo}: {error}") from error
    if policy.converts_weights:
        progress.enter("converting weights", "for MLX's CPU backend")
    # A pipeline's layers are whole (a tensor split's are not): the platform converts them
    split_tensors = sharded and cluster.sharding == "tensor"
    policy.prepare_model(
        model, sharded=split_tensors, evaluate=lambda m: eval_in_slices(m, between)
    )
    eval_in_slices(model, between)  # what the conversion left lazy
    how_it_runs = policy.description
    if kv_quantization is not None:
        try:
            install_quantized_kv(model, *kv_quantization)
        except ValueError as error:
            raise ModelLoadError(f"{path_or_repo}: {error}") from error
        how_it_runs += ", KV {}-bit in groups of {}".format(*kv_quantization)
    vision = _vision_tower(folder, model, progress) if not sharded else None
    layout = CacheLayout.of(model)
    features_off = features_off_for(model, layout)
    for feature, why in features_off.items():
        log.info("%s: %s is off: %s", model_id_for(path_or_repo), feature, why)
    prefill_chunk, decode_step_s = LoadedModel.prefill_chunk, None
    if calibrate:
        progress.enter("calibrating", "timing a decode step and a prompt chunk on this machine")
        prefill_chunk, decode_step_s = measure_prefill_chunk(model, between, repeat=not sharded)
    return LoadedModel(
        model_id=model_id_for(path_or_repo),
        path=str(path_or_repo),
        model=model,
        tokenizer=tokenizer,
        context_length=_context_length(config, Path(path_or_repo)),
        vocab_size=_vocab_size(config, tokenizer),
        eos_token_ids=tuple(sorted(tokenizer.eos_token_ids)),
        bos_token_id=tokenizer.bos_token_id,
        kv_bytes_per_token=kv_bytes_per_token(model),
        prefill_chunk=prefill_chunk,
        decode_step_s=decode_step_s,
        fim=fim,
        weights_folder=None if sharded else folder,
        how_it_runs=how_it_runs,
        # the image side's own arrays (its language model reads mlx-lm's)
        weight_bytes=weight_bytes(model) + (weight_bytes(vision.vlm, model) if vision else 0),
        vision=vision,
        takes_images=vision is not None,
        image_tokens=ImageTokens.of_folder(folder) if vision else None,
        cache_kinds=layout.kinds,
        features_off=features_off,
    )


def _vision_tower(folder: Path | None, model: nn.Module, progress: LoadProgress):
    """A vision-language model's image side, where mlx-vlm is installed (else it is served as
    the text model mlx-lm loaded, and the log says how to give it images)."""
    from ...vision.folder import is_vision_folder, vision_installed
    from ...vision.tower import VisionTower

    if not is_vision_folder(folder):
        return None
    if not vision_installed():
        log.info(
            "%s is a vision model, served here as text only: pip install 'mlxserve[vision]' "
            "to give it images",
            folder.name,
        )
        return None
    progress.enter("reading the vision tower", str(folder))
    try:
        return VisionTower.load(folder, model)
    except Exception as error:  # mlx-vlm raises many kinds; the user needs one clear line
        raise ModelLoadError(
            f"could not load the image side of {folder} with mlx-vlm: {first_line(error)}"
        ) from error


def eval_in_slices(model: nn.Module, between: Callable[[], None] | None = None) -> None:
    """Evaluate the model's arrays, LOAD_SLICE_BYTES at a time with `between()` after each
    slice (None: all at once)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    if between is None:
        mx.eval(model.parameters())
        return
    group, size = [], 0
    for _, array in tree_flatten(model.parameters()):
        group.append(array)
        size += array.nbytes
        if size >= LOAD_SLICE_BYTES:
            mx.eval(group)
            between()
            group, size = [], 0
    if group:
        mx.eval(group)
        between()


def measure_prefill_chunk(
    model: nn.Module, between: Callable[[], None] | None = None, repeat: bool = True
) -> tuple[int, float]:
    """Prompt tokens per prefill chunk, sized on this machine from a decode step's time: the
    pacer's starting point (`scheduling/pacing.py` adjusts it step by step from then on); and
    that decode step's seconds (one sequence, 64 tokens deep). `repeat`: time a cheap prompt
    chunk twice (not on a rank of a split model: each rank would decide on its own timing, and
    their passes' collectives would pair up wrongly).

    Measured rather than fixed: on a CPU one prompt token costs a sizeable share of a decode
    step, on a GPU a tiny one, so a fixed chunk either stalls streams or slows prefill.
    """
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from ..scheduling.pacing import CHUNK_COST_IN_DECODE_STEPS, clamp_chunk

    def timed(tokens: int, cache) -> float:
        start = time.perf_counter()
        logits = model(mx.zeros((1, tokens), dtype=mx.int32), cache=cache)
        mx.eval(logits, [c.state for c in cache])
        return time.perf_counter() - start

    def then(seconds: float) -> float:
        if between is not None:  # other models' streams step between the timed passes
            between()
        return seconds

    cache = make_prompt_cache(model)
    then(timed(64, cache))  # warm up; the decode steps below attend to 64 cached tokens
    decode = min(then(timed(1, cache)) for _ in range(3))
    prefill = then(timed(128, make_prompt_cache(model)))
    if repeat and prefill < REPEAT_TIMING_UNDER_S:  # a second try, against noise, where cheap
        prefill = min(prefill, then(timed(128, make_prompt_cache(model))))
    prefill /= 128
    return clamp_chunk(CHUNK_COST_IN_DECODE_STEPS * decode / max(prefill, 1e-9)), decode


def weight_bytes(model: nn.Module, besides: nn.Module | None = None) -> int:
    """Bytes of the model's arrays, each counted once; those `besides` holds too are not."""
    from mlx.utils import tree_flatten

    shared = {id(a) for _, a in tree_flatten(besides.parameters())} if besides is not None else ()
    arrays = {id(a): a for _, a in tree_flatten(model.parameters()) if id(a) not in shared}
    return sum(a.nbytes for a in arrays.values())


def kv_bytes_per_token(model: nn.Module) -> int:
    """Measured, not derived from config: one token through a fresh cache, bytes per position.

    Caches of constant size (state-space layers) add nothing per token.
    """
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    model(mx.array([[0]]), cache=cache)
    total = 0
    for layer in cache:
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if keys is None or values is None:
            continue
        mx.eval(keys, values)
        total += (keys.nbytes + values.nbytes) // keys.shape[-2]
    return total


def _context_length(config: dict[str, Any], path: Path) -> int:
    return context_length_of(config, path) or FALLBACK_CONTEXT


def _vocab_size(config: dict[str, Any], tokenizer: Any) -> int:
    size = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    return int(size) if size else len(tokenizer.vocab)
