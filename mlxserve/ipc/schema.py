"""The engine's whole interface as seen from the front process: msgpack messages (msgspec) over
ZeroMQ. Requests, cancels and calls go to the engine; one `Events` message a step (every
sequence's events of that step), `Report`s of the engines' state and `Reply`s come back.

Plain data only: the front decodes these without MLX.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import msgspec

from ..engine.requests import GenerationEvent, GenerationRequest
from ..engine.stats import EngineStats
from ..fim import Fim
from ..planning.model_facts import ModelFacts
from ..vision.folder import ImageTokens

# The engine process's exit code when, distributed, it cannot go on (a rank is lost, or the
# model does not load over the ranks): the front then stops with an error too.
DISTRIBUTED_EXIT = 3

# ---- front -> engine ---------------------------------------------------------------------------


class Submit(msgspec.Struct, tag=True):
    """A group of sequences for `model`; its events carry `group_id`."""

    group_id: int
    model: str
    requests: list[GenerationRequest]


class Cancel(msgspec.Struct, tag=True):
    group_id: int


class Call(msgspec.Struct, tag=True):
    """One of the pool's or an engine's operations (`engine_main.OPERATIONS`); its `Reply`
    carries the same `call_id`."""

    call_id: int
    op: str
    model: str = ""
    args: dict[str, Any] = {}


ToEngine = Submit | Cancel | Call

# ---- engine -> front ---------------------------------------------------------------------------


class Events(msgspec.Struct, tag=True):
    """A step's events, each with its group's id."""

    items: list[tuple[int, GenerationEvent]]


@dataclass
class FactsWire:
    """`ModelFacts` as they cross: the tokenizer pickled (the engine's own, so that both sides
    tokenize alike), the FIM template resolved. The same field names as `ModelFacts`."""

    model_id: str
    path: str
    tokenizer: bytes
    context_length: int
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    kv_bytes_per_token: int
    fim: Fim | None
    how_it_runs: str
    weight_bytes: int
    base_model: str | None
    kind: str
    dimensions: int
    matryoshka: bool
    prompts: dict[str, str]
    default_prompt: str | None
    judges_pairs: bool
    takes_images: bool
    image_tokens: ImageTokens | None
    cache_kinds: tuple[str, ...]
    features_off: dict[str, str]

    @classmethod
    def of(cls, facts: ModelFacts, tokenizer: bytes) -> FactsWire:
        values = {f.name: getattr(facts, f.name) for f in fields(cls)}
        return cls(**{**values, "tokenizer": tokenizer})

    def facts(self, tokenizer: Any) -> ModelFacts:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return ModelFacts(**{**values, "tokenizer": tokenizer})


class EngineView(msgspec.Struct):
    """One engine as the front may see it (the defaults: one not begun yet)."""

    name: str
    source: str
    state: str
    started: bool = True
    begun: bool = False
    loads: int = 0  # models loaded so far: a new one means new facts
    error: str | None = None
    load_error: str | None = None
    load_progress: dict[str, Any] | None = None
    idle_unload_s: float | None = None
    default_idle_unload_s: float | None = None
    # when an idle unload is due (time.monotonic(): one clock for both processes), so that the
    # view does not change while nothing happens
    keep_alive_until: float | None = None
    idle_for_eviction: bool = False
    pending_change: bool = False
    unloading: bool = False
    stats: EngineStats = msgspec.field(default_factory=EngineStats)
    tokens_per_second: float = 0.0
    footprint: int = 0
    loaded: bool = False


class PoolView(msgspec.Struct):
    default_name: str
    budget_bytes: int
    memory_bytes: int
    pinned: list[str]
    engines: list[EngineView]


class Report(msgspec.Struct, tag=True):
    """The engines' state, sent whenever it changed (and once a poll while anything runs)."""

    pool: PoolView


class Reply(msgspec.Struct, tag=True):
    """A `Call`'s outcome: `error` with its `kind` ("no_room", "engine", "unknown_model",
    "failed"), or a value; the pool's state as the call left it."""

    call_id: int
    pool: PoolView
    error: str | None = None
    kind: str | None = None
    state: str = ""
    value: Any = None


class Started(msgspec.Struct, tag=True):
    """The engine process is up and listening; `pid` is its own."""

    pid: int
    pool: PoolView


FromEngine = Events | Report | Reply | Started

ENCODER = msgspec.msgpack.Encoder()
TO_ENGINE = msgspec.msgpack.Decoder(ToEngine)
FROM_ENGINE = msgspec.msgpack.Decoder(FromEngine)


def encode(message) -> bytes:
    return ENCODER.encode(message)
