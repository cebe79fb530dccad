"""The engines: one per served model, each decoding its sequences in one batch, all stepped in
turn by the one thread that owns every MLX call.

What a front door needs (the boundary's types, states and errors) imports without MLX; `Engine`
itself loads MLX on first use, in the process that runs it."""

from .requests import (
    MAX_BATCH,
    FinishReason,
    GenerationEvent,
    GenerationRequest,
    RunningSlot,
    StopSpec,
    Timings,
    TokenLogprob,
    kv_tokens,
)
from .states import LOADING_STATES, EmbeddingFailed, EngineError, NoRoom

__all__ = [
    "LOADING_STATES",
    "MAX_BATCH",
    "Engine",
    "EmbeddingFailed",
    "EngineError",
    "FinishReason",
    "GenerationEvent",
    "GenerationRequest",
    "NoRoom",
    "RunningSlot",
    "StopSpec",
    "Timings",
    "TokenLogprob",
    "kv_tokens",
]


def __getattr__(name: str):
    if name == "Engine":
        from .engine import Engine

        return Engine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
