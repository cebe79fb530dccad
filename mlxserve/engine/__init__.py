"""The engines: one per served model, each decoding its sequences in one batch, all stepped in
turn by the one thread that owns every MLX call."""

from .engine import Engine, EngineError
from .mlx_lm_compat import MAX_BATCH
from .models.slot import LOADING_STATES
from .requests import (
    FinishReason,
    GenerationEvent,
    GenerationRequest,
    StopSpec,
    Timings,
    TokenLogprob,
    kv_tokens,
)

__all__ = [
    "LOADING_STATES",
    "MAX_BATCH",
    "Engine",
    "EngineError",
    "FinishReason",
    "GenerationEvent",
    "GenerationRequest",
    "StopSpec",
    "Timings",
    "TokenLogprob",
    "kv_tokens",
]
