"""Loading the active model and reading the facts the server needs about it."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.nn as nn
from mlx.utils import tree_flatten

from ..fim import Fim, FimError, detect_fim
from ..registry import context_length_of
from ..sampling.grammars import GrammarCompiler
from ..settings import machine_memory_bytes

FALLBACK_CONTEXT = 4096  # a model folder that declares no context window
log = logging.getLogger("mlxserve.engine")


class ModelLoadError(Exception):
    """The model could not be loaded; the message is one line a user can act on."""


@dataclass
class LoadedModel:
    model_id: str
    path: str
    model: nn.Module
    tokenizer: Any  # mlx-lm TokenizerWrapper
    context_length: int
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    kv_bytes_per_token: int = 0  # KV cache memory one token of one sequence takes
    prefill_chunk: int = 512  # prompt tokens prefilled between two decode steps
    fim: Fim | None = None  # its fill-in-the-middle template, when the vocabulary has one
    _grammars: GrammarCompiler | None = field(default=None, repr=False)
    _grammars_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def grammars(self) -> GrammarCompiler:
        """The grammar compiler for this tokenizer, built on first use (about a second)."""
        with self._grammars_lock:
            if self._grammars is None:
                self._grammars = GrammarCompiler(
                    self.tokenizer._tokenizer, self.vocab_size, list(self.eos_token_ids)
                )
            return self._grammars


def model_id_for(path_or_repo: str) -> str:
    """The name clients use: a local folder's name, or the repo id as given."""
    path = Path(path_or_repo).expanduser()
    return path.name if path.exists() else path_or_repo


def check_model_source(path_or_repo: str) -> None:
    """Fail fast, before serving, on a source that cannot possibly load."""
    path = Path(path_or_repo).expanduser()
    looks_like_path = path_or_repo.startswith((".", "/", "~")) or path.exists()
    if looks_like_path:
        if not path.is_dir():
            raise ModelLoadError(f"model folder not found: {path_or_repo}")
        if not (path / "config.json").exists():
            raise ModelLoadError(f"{path_or_repo} has no config.json: not an mlx-lm model folder")


def load_model(path_or_repo: str, fim_template: str | None = None, cluster=None) -> LoadedModel:
    """`fim_template`: a template name forcing that FIM format ("none": no infill); None
    detects it from the vocabulary. `cluster`: load this rank's shard (engine/distributed.py)."""
    import mlx_lm

    check_model_source(path_or_repo)
    try:
        if cluster is not None and cluster.size > 1:
            model, tokenizer, config = cluster.load(path_or_repo)
        else:
            model, tokenizer, config = mlx_lm.load(path_or_repo, return_config=True)
    except Exception as error:  # mlx-lm raises many kinds; the user needs one clear line
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ModelLoadError(f"could not load model {path_or_repo}: {reason}") from error
    try:
        fim = detect_fim(tokenizer.get_vocab(), fim_template)
    except FimError as error:
        raise ModelLoadError(f"--fim-template for {path_or_repo}: {error}") from error
    if cluster is None or cluster.size < 2:
        fit_to_device(model)
    else:
        upcast_on_cpu(model)  # sharded quantized layers stay as they are
    vocab_size = _vocab_size(config, tokenizer)
    eos = tuple(sorted(tokenizer.eos_token_ids))
    return LoadedModel(
        model_id=model_id_for(path_or_repo),
        path=str(path_or_repo),
        model=model,
        tokenizer=tokenizer,
        context_length=_context_length(config, Path(path_or_repo)),
        vocab_size=vocab_size,
        eos_token_ids=eos,
        bos_token_id=tokenizer.bos_token_id,
        kv_bytes_per_token=kv_bytes_per_token(model),
        prefill_chunk=measure_prefill_chunk(model),
        fim=fim,
    )


def measure_prefill_chunk(model: nn.Module) -> int:
    """Prompt tokens per prefill chunk, sized on this machine from a decode step's time: the
    pacer's starting point (`pacing.py` adjusts it step by step from then on).

    Measured rather than fixed: on a CPU one prompt token costs a sizeable share of a decode
    step, on a GPU a tiny one, so a fixed chunk either stalls streams or slows prefill.
    """
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from .pacing import CHUNK_COST_IN_DECODE_STEPS, clamp_chunk

    def timed(tokens: int, cache) -> float:
        start = time.perf_counter()
        logits = model(mx.zeros((1, tokens), dtype=mx.int32), cache=cache)
        mx.eval(logits, [c.state for c in cache])
        return time.perf_counter() - start

    cache = make_prompt_cache(model)
    timed(64, cache)  # warm up; the decode steps below attend to 64 cached tokens
    decode = min(timed(1, cache) for _ in range(3))
    prefill = min(timed(128, make_prompt_cache(model)) for _ in range(2)) / 128
    return clamp_chunk(CHUNK_COST_IN_DECODE_STEPS * decode / max(prefill, 1e-9))


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


def fit_to_device(model: nn.Module) -> None:
    """The model as the server runs it: on MLX's CPU backend, float32 weights where memory
    allows and attention with a vectorised exp (`cpu_attention`)."""
    from mlxserve.engine.cpu_attention import use_on_cpu

    dequantize_on_cpu(model, machine_memory_bytes() // DEQUANTIZE_MEMORY_SHARE)
    upcast_on_cpu(model)
    use_on_cpu(model)


# A quantized model is widened on the CPU only while its float32 weights take at most this share
# of the machine's memory (1/8: SmolLM2-135M's 0.5 GB, not a 7B model's 28 GB).
DEQUANTIZE_MEMORY_SHARE = 8


def dequantize_on_cpu(model: nn.Module, budget_bytes: int) -> bool:
    """On MLX's CPU backend a quantized matmul is MLX's own loop, so a batch costs what its
    sequences cost one by one (SmolLM2-135M 4-bit: one token 140 ms, 16 tokens 1,962 ms), while
    float32 weights go through BLAS, where that batch of 16 takes 366 ms (with OpenBLAS). Batched
    decoding only pays off with float weights, so a quantized model that fits `budget_bytes` as
    float32 is dequantized here. Metal keeps its fast quantized kernels."""
    import mlx.core as mx
    from mlx_lm.utils import dequantize_model

    if mx.default_device() != mx.cpu:
        return False
    quantized = [m for _, m in model.named_modules() if hasattr(m, "bits") and "scales" in m]
    if not quantized:
        return False
    quantized_elements = sum(m.weight.size * 32 // m.bits for m in quantized)
    packed = sum(m.weight.size for m in quantized)
    others = sum(v.size for _, v in tree_flatten(model.parameters())) - packed
    float_bytes = 4 * (quantized_elements + others)
    if float_bytes > budget_bytes:
        log.info(
            "CPU backend: keeping quantized weights (%.1f GB as float32 is over %.1f GB)",
            float_bytes / 1e9,
            budget_bytes / 1e9,
        )
        return False
    dequantize_model(model)
    model.set_dtype(mx.float32)
    mx.eval(model.parameters())
    log.info(
        "CPU backend: quantized weights widened to float32 (%.2f GB) for batching",
        float_bytes / 1e9,
    )
    return True


def upcast_on_cpu(model: nn.Module) -> bool:
    """On MLX's CPU backend half-precision matmuls are several times slower than float32
    (measured: 73-98 vs 280 tok/s on the demo model), so half-precision weights and quantization
    scales are widened there. Metal keeps the model as stored."""
    import mlx.core as mx

    if mx.default_device() != mx.cpu:
        return False
    half = {mx.float16, mx.bfloat16}
    if not any(v.dtype in half for _, v in tree_flatten(model.parameters())):
        return False
    model.set_dtype(mx.float32, predicate=lambda dtype: dtype in half)
    log.info("CPU backend: half-precision weights widened to float32 for speed")
    return True


def _context_length(config: dict[str, Any], path: Path) -> int:
    return context_length_of(config, path) or FALLBACK_CONTEXT


def _vocab_size(config: dict[str, Any], tokenizer: Any) -> int:
    size = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    return int(size) if size else len(tokenizer.vocab)
