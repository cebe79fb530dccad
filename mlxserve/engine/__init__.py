"""The engine: one thread that owns every MLX call and decodes all sequences in one batch."""

from .engine import Engine, EngineError
from .requests import FinishReason, GenerationEvent, GenerationRequest, StopSpec, TokenLogprob

__all__ = [
    "Engine",
    "EngineError",
    "FinishReason",
    "GenerationEvent",
    "GenerationRequest",
    "StopSpec",
    "TokenLogprob",
]
