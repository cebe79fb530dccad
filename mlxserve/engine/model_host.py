"""Loading the active model and reading the facts the server needs about it."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.nn as nn

from ..fim import Fim, FimError, detect_fim
from ..platform import PlatformPolicy, current_policy
from ..registry import context_length_of
from ..sampling.grammars import GrammarCompiler

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


def load_model(
    path_or_repo: str,
    fim_template: str | None = None,
    cluster=None,
    policy: PlatformPolicy | None = None,
) -> LoadedModel:
    """`fim_template`: a template name forcing that FIM format ("none": no infill); None
    detects it from the vocabulary. `cluster`: load this rank's shard (engine/distributed.py).
    `policy`: how this platform runs the model (None: `current_policy()`)."""
    import mlx_lm

    check_model_source(path_or_repo)
    policy = policy if policy is not None else current_policy()
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
    policy.prepare_model(model, sharded=cluster is not None and cluster.size > 1)
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


def _context_length(config: dict[str, Any], path: Path) -> int:
    return context_length_of(config, path) or FALLBACK_CONTEXT


def _vocab_size(config: dict[str, Any], tokenizer: Any) -> int:
    size = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    return int(size) if size else len(tokenizer.vocab)
