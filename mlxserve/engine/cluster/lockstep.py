"""One model over several machines with mlx.distributed (started by `mlx.launch`).

Every rank loads its shard (tensor parallel where the model's heads split over the ranks, else
a pipeline of its layers: mlx-lm's where the architecture has one, pipeline.py's for the rest)
and runs the same engine loop in lock-step. Rank 0
alone serves HTTP: before each engine step it broadcasts what changed (requests added or
cancelled, sequences its stop rules ended, the prefill chunk), and the other ranks apply exactly
that, so every rank runs the same forward passes. Rank 0's sampled tokens are broadcast back
inside the step (one collective per step for the whole batch), so all ranks continue from the
same tokens even if their logits differed in the last bit.
"""

from __future__ import annotations

import inspect
import logging
import os
import pickle
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten
from mlx_lm.generate import generation_stream

from ...platform import current_policy
from ...settings import machine_memory_bytes
from ..models.sources import ModelLoadError
from ..scheduling.messages import Add
from . import pipeline
from .doorbell import Doorbell

if TYPE_CHECKING:
    from ..engine import Engine

log = logging.getLogger("mlxserve.engine")

COLLECTIVE_PROBES = 16  # small all_sums timed at start (the slowest counts)
READ_PROBE_BYTES = 64 << 20  # an array summed at start, to time memory reads
WATCHDOG_EVERY_S = 0.5  # how often a collective under way is checked against the rank timeout
WATCHDOG_IDLE_CHECK_S = 5.0  # with none under way, how often the watchdog looks whether to stop


class DistributedError(RuntimeError):
    """The model cannot be sharded, or a rank is gone."""


class Cluster:
    """This process's place in the group mlx.launch started."""

    def __init__(
        self,
        group: mx.distributed.Group | None = None,
        layer_split: list[int] | None = None,
        parallel: str = "auto",
    ):
        """`layer_split`: layers by rank for a pipeline (`--layer-split`), else by memory;
        `parallel`: "tensor", "pipeline" or "auto" (`--parallel`: measured at start)."""
        self.group = group if group is not None else mx.distributed.init(strict=True)
        self.rank = self.group.rank()
        self.size = self.group.size()
        self.layer_split = layer_split
        self.parallel = "pipeline" if layer_split is not None else parallel
        log.info("distributed: rank %d of %d (pid %d)", self.rank, self.size, os.getpid())
        self.sharding: str | None = None  # "tensor" or "pipeline", once the model loaded
        self.stages: list[tuple[int, int]] = []  # a pipeline's layers by rank: (first, end)

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def broadcast(self, message: Any = None) -> Any:
        """Rank 0's `message` on every rank (others pass None): its pickled length, then its
        bytes, each summed over the group with zeros from the other ranks.

        On mlx-lm's generation stream: the model's own collectives run there, and collectives
        issued on two streams reach the ring in an order that differs between ranks.
        """
        with mx.stream(generation_stream):
            data = pickle.dumps(message) if self.leader else b""
            length = mx.distributed.all_sum(mx.array([len(data)], dtype=mx.int32), group=self.group)
            size = int(length.item())
            payload = (
                mx.array(np.frombuffer(data, dtype=np.uint8))
                if self.leader
                else mx.zeros((size,), dtype=mx.uint8)
            )
            received = mx.distributed.all_sum(payload, group=self.group)
            mx.eval(received)  # a collective: every rank must run it, the sender too
        if self.leader:
            return message
        return pickle.loads(bytes(np.array(received, dtype=np.uint8)))

    def load(self, path: str):
        """(model, tokenizer, config) with this rank's shard of the weights, decided on the
        lazily read model before any weight is read (`sharding`): tensor parallel where the
        model's heads split over the ranks, else a pipeline of layers, split by `layer_split`
        or in proportion to each rank's memory. (mlx-lm's `sharded_load` needs a weight index
        to pick a pipeline stage's files, which a model of one file has not.)"""
        from mlx_lm.utils import load_model, load_tokenizer

        folder = _local(path)
        model, config = load_model(folder, lazy=True, strict=False)
        splits = tensor_refusal(model, self.size) is None  # every rank reads the same config
        costs = self.link_costs() if self.parallel == "auto" and splits else None
        self.sharding = how = sharding(model, self.size, self.parallel, costs)
        if costs is not None:
            why = costs.why(model, self.size)
        elif self.parallel == "auto":
            why = "its attention heads or MLP do not split evenly over the ranks"
        else:
            why = "--layer-split" if self.layer_split is not None else f"--parallel {self.parallel}"
        if how == "tensor":
            current_policy().widen_before_tensor_split(model, self.size)
            model.shard(self.group)
            log.info("tensor parallel over %d ranks (%s)", self.size, why)
        else:
            split = self._split(len(model.layers))
            if hasattr(model.model, "pipeline"):
                _mlx_lm_pipeline(model.model, self.group, split)
                first, end = model.model.start_idx, model.model.end_idx
                whose = "mlx-lm's"
            else:
                first, end = pipeline.install(model, self.group, split)
                whose = "mlxserve's"
            self.stages = self._gather_stages(first, end)
            log.info(
                "pipeline parallel over %d ranks (%s; %s): %s",
                self.size,
                whose,
                why,
                "; ".join(f"rank {r}: layers {a}-{b - 1}" for r, (a, b) in enumerate(self.stages)),
            )
        mx.eval(model.parameters())  # this rank's shard only: the rest is never read
        self.broadcast()  # every rank has its shard before any runs the model
        tokenizer = load_tokenizer(
            folder, {"trust_remote_code": True}, eos_token_ids=config.get("eos_token_id")
        )
        return model, tokenizer, config

    def link_costs(self) -> LinkCosts:
        """A small collective's time and this machine's memory read speed, the slowest
        rank's (every rank decides alike): what a tensor split costs and saves a token."""
        with mx.stream(generation_stream):
            one = mx.ones((1,))
            mx.eval(mx.distributed.all_sum(one, group=self.group))  # the first sets things up
            times = []
            for _ in range(COLLECTIVE_PROBES):
                started = time.perf_counter()
                mx.eval(mx.distributed.all_sum(one, group=self.group))
                times.append(time.perf_counter() - started)
            block = mx.ones((READ_PROBE_BYTES // 4,))
            mx.eval(block)
            started = time.perf_counter()
            mx.eval(block.sum())
            read = block.nbytes / max(time.perf_counter() - started, 1e-9)
        # The slowest of the probes: a step waits for every collective, so one rank late (a
        # busy machine, a link's hiccup) is what a split pays, not the typical time
        measured = self._gather_ints([int(max(times) * 1e9), int(read)])
        return LinkCosts(max(m[0] for m in measured) / 1e9, min(m[1] for m in measured))

    def _split(self, layers: int) -> list[int]:
        """Layers by rank: `layer_split` as given, else in proportion to each rank's memory."""
        if self.layer_split is not None:
            if len(self.layer_split) != self.size or sum(self.layer_split) != layers:
                raise DistributedError(
                    f"--layer-split {','.join(map(str, self.layer_split))} does not fit: it "
                    f"needs {self.size} counts (one a rank, rank 0 first) that add up to the "
                    f"model's {layers} layers"
                )
            return self.layer_split
        memory = self._gather_ints([machine_memory_bytes()])
        split = pipeline.split_by_memory(layers, [int(m[0]) for m in memory])
        log.info(
            "layers split by each rank's memory (%s)",
            ", ".join(f"rank {r}: {m[0] / 2**30:.1f} GiB" for r, m in enumerate(memory)),
        )
        return split

    def _gather_stages(self, first: int, end: int) -> list[tuple[int, int]]:
        return [(int(a), int(b)) for a, b in self._gather_ints([first, end])]

    def _gather_ints(self, values: list[int]) -> list[list[int]]:
        """Each rank's `values`, by rank (a collective: every rank calls it)."""
        with mx.stream(generation_stream):
            gathered = mx.distributed.all_gather(
                mx.array([values], dtype=mx.int64), group=self.group
            )
            return np.array(gathered).tolist()


def cluster_options(settings) -> dict:
    """Cluster's keyword arguments from the server's settings (`--layer-split`, `--parallel`)."""
    split = list(settings.layer_split) if settings.layer_split else None
    return {"layer_split": split, "parallel": settings.parallel}


def _mlx_lm_pipeline(inner, group, split: list[int]) -> None:
    """mlx-lm's pipeline of the model's layers, split as asked where it takes a split (a few of
    its architectures split evenly only)."""
    if "split" in inspect.signature(inner.pipeline).parameters:
        inner.pipeline(group, split)
        return
    base, extra = divmod(sum(split), len(split))
    if split != [base + (1 if r < extra else 0) for r in range(len(split))]:
        raise DistributedError(
            f"mlx-lm's pipeline for this architecture splits its layers evenly only; layers "
            f"by rank {','.join(map(str, split))} cannot be"
        )
    inner.pipeline(group)


@dataclass(frozen=True)
class LinkCosts:
    """What splitting costs on this group, measured at start (`Cluster.link_costs`)."""

    collective_s: float  # one small all_sum, the slowest of a few
    read_bytes_per_s: float  # memory read speed (a decode step reads every weight)

    def tensor_pays(self, model, ranks: int) -> bool:
        """A tensor split runs two collectives a layer each token, and saves each rank the
        reading of all but its share of the weights: whether the saving is the larger."""
        return self._collectives_s(model) < self._saved_s(model, ranks)

    def why(self, model, ranks: int) -> str:
        return (
            f"a tensor split's collectives {self._collectives_s(model) * 1000:.2f} ms a token "
            f"against {self._saved_s(model, ranks) * 1000:.2f} ms of weight reads saved, measured"
        )

    def _collectives_s(self, model) -> float:
        return 2 * len(model.layers) * self.collective_s

    def _saved_s(self, model, ranks: int) -> float:
        weights = sum(v.nbytes for _, v in tree_flatten(model.parameters()))
        return (1 - 1 / ranks) * weights / self.read_bytes_per_s


def tensor_refusal(model, ranks: int) -> str | None:
    """Why mlx-lm cannot split `model`'s layers by tensors over `ranks`, or None where it can:
    it needs a `shard`, and attention heads, key/value heads and MLP rows that divide evenly
    (the refusal names the rank counts that would do)."""
    kind = type(model).__module__.rsplit(".", 1)[-1]
    if not hasattr(model, "shard"):
        return f"mlx-lm has no tensor parallelism for {kind} models"
    args = getattr(model, "args", None)
    heads = getattr(args, "num_attention_heads", None)
    kv_heads = getattr(args, "num_key_value_heads", None) or heads
    if heads and (heads % ranks or kv_heads % ranks):
        fits = [n for n in range(2, min(heads, kv_heads) + 1) if heads % n == kv_heads % n == 0]
        would = f"{' or '.join(map(str, fits))} ranks would" if fits else "no number of ranks would"
        return (
            f"its {heads} attention heads ({kv_heads} key/value heads) do not split evenly over "
            f"{ranks} ranks ({would})"
        )
    inner_size = getattr(args, "intermediate_size", None)
    if isinstance(inner_size, int) and inner_size % ranks:
        return f"its MLP's {inner_size} rows do not split evenly over {ranks} ranks"
    return None


def sharding(model, ranks: int, parallel: str = "auto", costs: LinkCosts | None = None) -> str:
    """How `model` splits over `ranks`: "tensor" where its heads and MLP split evenly (and,
    with `costs`, its collectives cost less than it saves; `parallel` "pipeline" never), else
    "pipeline" (mlx-lm's for the architecture, or pipeline.py's). DistributedError, saying why
    and what would work, where neither can (or not as `parallel` asks)."""
    kind = type(model).__module__.rsplit(".", 1)[-1]
    layers = len(getattr(model, "layers", ()))
    inner = getattr(model, "model", None)
    refusal = None if hasattr(inner, "pipeline") else pipeline.pipeline_refusal(model)
    why_not_tensor = tensor_refusal(model, ranks)
    can_pipeline = refusal is None and layers >= ranks
    if parallel == "tensor" and why_not_tensor is not None:
        raise DistributedError(
            f"--parallel tensor: {kind} models cannot split so over {ranks} ranks"
        )
    if parallel == "pipeline" and refusal is not None:
        raise DistributedError(f"a pipeline was asked for, and {kind} models have none: {refusal}")
    if why_not_tensor is None and parallel != "pipeline":
        if (
            parallel == "tensor"
            or costs is None
            or costs.tensor_pays(model, ranks)
            or not can_pipeline
        ):
            return "tensor"
    if can_pipeline:
        return "pipeline"
    if refusal is None:
        why_not_pipeline = (
            f"its {layers} layers are too few for a pipeline of {ranks} ranks "
            f"(at most {layers} ranks would)"
        )
    else:
        why_not_pipeline = f"a pipeline of its layers cannot split {kind} models: {refusal}"
    raise DistributedError(
        f"this model cannot be split over {ranks} ranks: {why_not_tensor}, and {why_not_pipeline}"
    )


class LockStep:
    """Rank 0's side of the lock-step: a tick before each step, and a watchdog for lost ranks.

    A tick says what the other ranks must do the same before stepping: the inbox messages rank 0
    applies, the sequences its own stop rules ended, its prefill chunk. None (one small
    collective) when nothing changed.
    """

    def __init__(
        self, cluster: Cluster, rank_timeout_s: float, on_lost: Callable[[Exception], None]
    ):
        self.cluster = cluster
        # A lost rank can leave a collective waiting for ever: rank 0 gives a step this long.
        self.rank_timeout_s = rank_timeout_s
        self.on_lost = on_lost
        self.removed: list[int] = []  # ended by rank 0's own rules since the last tick
        self.doorbell: Doorbell | None = None  # set once the model is loaded (doorbell.py)
        self.asleep = False  # the others wait on the doorbell
        self._sent_prefill: int | None = None
        self._waiting_since: float | None = None
        self._wait_began = threading.Event()  # wakes the watchdog, which sleeps while idle

    def hurry(self, seconds: float) -> None:
        """A stop is under way: a step waiting this long on the others means one is gone (a
        launcher stops rank 0 when another rank dies, and the drain must not wait on it)."""
        self.rank_timeout_s = min(self.rank_timeout_s, seconds)

    def sleep(self) -> None:
        """Rank 0 has no work: the others wait on the doorbell, not in a collective."""
        if self.doorbell is not None and not self.asleep:
            self.tick([], self._sent_prefill, stop=False, idle=True)
            self.asleep = True

    def wake(self) -> None:
        """Rank 0 has a tick to send: the others come back to the collectives."""
        if self.asleep:
            self.doorbell.ring()
            self.asleep = False

    @contextmanager
    def waiting(self):
        """Around a collective: the watchdog counts from here."""
        self._waiting_since = time.monotonic()
        self._wait_began.set()
        try:
            yield
        finally:
            self._waiting_since = None

    def tick(self, messages: list, prefill: int | None, stop: bool, idle: bool = False) -> None:
        """Send the tick; added groups go without their event loop, queue or sink. `idle`: the
        others wait on the doorbell after it."""
        messages = [
            Add(replace(m.group, loop=None, events=None, sink=None)) if isinstance(m, Add) else m
            for m in messages
        ]
        removed, self.removed = self.removed, []
        changed = messages or removed or stop or idle or prefill != self._sent_prefill
        self._sent_prefill = prefill
        tick = {
            "messages": messages,
            "removed": removed,
            "prefill": prefill,
            "stop": stop,
            "idle": idle,
        }
        with self.waiting():
            self.cluster.broadcast(tick if changed else None)

    def start_watchdog(self, stopped: Callable[[], bool]) -> None:
        threading.Thread(
            target=self._watch, args=(stopped,), name="mlxserve-ranks", daemon=True
        ).start()

    def _watch(self, stopped: Callable[[], bool]) -> None:
        """A step or tick stuck past `rank_timeout_s` means a rank is gone (the ring backend
        does not always report it): fail as for a reported loss."""
        while not stopped():
            self._wait_began.clear()  # before looking: a wait that begins from now on wakes it
            since = self._waiting_since
            if since is None:  # no collective under way: nothing to time until one begins
                self._wait_began.wait(WATCHDOG_IDLE_CHECK_S)
                continue
            if time.monotonic() - since > self.rank_timeout_s:
                self.on_lost(
                    TimeoutError(f"no answer from the other ranks for {self.rank_timeout_s:g} s")
                )
                return
            time.sleep(WATCHDOG_EVERY_S)


def follow(engine: Engine) -> int:
    """The loop of a rank other than 0: load the shard, then apply rank 0's ticks and step with
    it until it stops. Returns the process's exit code; exits at once (1) when rank 0 is gone,
    or a collective waits on it longer than the rank timeout."""
    try:
        engine.slot.load(engine.slot.source)
    except ModelLoadError as error:
        log.error("%s", error)
        return 1
    lockstep, cluster = engine.lockstep, engine.cluster
    lockstep.on_lost = lambda error: _exit_lost(cluster.rank, str(error))
    lockstep.start_watchdog(lambda: False)
    try:
        with lockstep.waiting():
            doorbell = Doorbell.open(cluster, on_gone=lambda why: _exit_lost(cluster.rank, why))
        while True:
            with lockstep.waiting():
                tick = cluster.broadcast()
            if tick is not None:
                engine.remove_uids(tick["removed"])
                engine.apply(tick["messages"])
                if tick["prefill"] is not None:
                    engine.generator.prefill_step_size = tick["prefill"]
                if tick["stop"]:
                    break
                if tick["idle"]:
                    doorbell.wait()
                    continue
            if engine.has_live_sequences:
                with lockstep.waiting():
                    engine.step()
    except Exception as error:  # a collective failed: rank 0 or another rank is gone
        _exit_lost(cluster.rank, f"{type(error).__name__}: {error}")
    mx.synchronize()
    return 0


def _exit_lost(rank: int, why: str) -> None:
    """A rank other than 0 without rank 0 has nothing left to do: say why and exit."""
    log.error("rank %d stops: %s", rank, why)
    logging.shutdown()
    os._exit(1)


def _local(path: str):
    from pathlib import Path

    from mlx_lm.utils import _download

    local = Path(path).expanduser()
    return local if local.exists() else _download(path)
