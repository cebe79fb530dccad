"""Admission control: a bounded queue (503 + Retry-After beyond it) and a KV memory budget.

A request whose KV cache could never fit the budget is refused up front (400) rather than
crashing the process mid-generation; one that fits but not beside the work in flight waits its
turn in the queue, or gets a 503 when the queue is full.
"""

from __future__ import annotations

from ..engine import MAX_BATCH, kv_tokens
from ..settings import Settings
from .errors import InvalidRequest, ServiceUnavailable

RETRY_AFTER_S = "1"
MIB = 1 << 20
DRAINING = "MLXSERVE_DRAINING"  # app config key, set once the server is stopping


def refuse_if_draining(config) -> None:
    """A stopping server finishes what it has and takes nothing new."""
    if config.get(DRAINING):
        raise ServiceUnavailable(
            "The server is shutting down; retry on another instance or after it restarts.",
            code="shutting_down",
            headers={"Retry-After": RETRY_AFTER_S, "Connection": "close"},
        )


def admit(engine, loaded, sequences, settings: Settings, others_kv_bytes: int = 0) -> int:
    """Raise unless `sequences` (GenerationRequests) may be submitted now; else reserve their
    place (`Engine.reserve`), counted until they are submitted. `others_kv_bytes`: the KV the
    other models' requests in flight hold (the budget is the server's, not a model's)."""
    tokens = kv_tokens(sequences)
    need = tokens * loaded.kv_bytes_per_token
    budget = settings.kv_budget_bytes
    if need > budget:
        raise InvalidRequest(
            f"This request needs {need / MIB:,.0f} MiB of KV cache ({tokens:,} tokens of prompt "
            f"plus max_tokens over its {len(sequences)} sequences), over this server's budget of "
            f"{budget / MIB:,.0f} MiB. Lower max_tokens, n or the prompt's length.",
            param="max_tokens",
            code="kv_budget_exceeded",
        )
    admitted = engine.admitted_sequences
    waiting = admitted + len(sequences) - MAX_BATCH
    in_flight_kv = (engine.admitted_kv_tokens + tokens) * loaded.kv_bytes_per_token
    in_flight_kv += others_kv_bytes
    busy = admitted or others_kv_bytes
    if waiting > settings.max_queued_sequences or (busy and in_flight_kv > budget):
        raise ServiceUnavailable(
            f"The server is busy ({admitted} sequences in flight); retry shortly.",
            code="server_busy",
            headers={"Retry-After": RETRY_AFTER_S},
        )
    return engine.reserve(sequences)
