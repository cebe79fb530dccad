"""Server settings: one place for every default and limit."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

# The embedded default: a small Python code model with fill-in-the-middle, trained by
# scripts/train_demo_model.py, shipped in the wheel: the first `mlxserve serve` downloads nothing.
DEFAULT_MODEL = Path(__file__).resolve().parent / "models" / "mlxserve-demo-coder"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
# Sequences one request may ask for: prompts x best_of (n alone is capped at 128 by the schema).
DEFAULT_MAX_SEQUENCES_PER_REQUEST = 256
# Sequences that may wait beyond the running batch before new requests get 503 + Retry-After.
DEFAULT_MAX_QUEUED_SEQUENCES = 256


def machine_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 16 << 30


def default_kv_budget_bytes() -> int:
    """KV cache for the requests in flight: a quarter of the machine's memory."""
    return machine_memory_bytes() // 4


@dataclass(frozen=True)
class Settings:
    model: str
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    api_key: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_sequences_per_request: int = DEFAULT_MAX_SEQUENCES_PER_REQUEST
    max_queued_sequences: int = DEFAULT_MAX_QUEUED_SEQUENCES
    kv_budget_bytes: int = field(default_factory=default_kv_budget_bytes)
    prefix_cache_bytes: int | None = None  # None: engine default from memory; 0: off
    fim_template: str | None = None  # None: detected from the model's vocabulary
    models_dirs: tuple[str, ...] = ()  # folders of model folders, besides the HF cache, LM Studio
    allow_switch: bool = False  # a request's `model` may load another known model
    idle_unload_s: float | None = None  # free the model after this long without requests
    distributed: bool = False  # one model over the ranks mlx.launch started
    rank_timeout_s: float = 60.0  # distributed: a step waiting longer on the other ranks fails
