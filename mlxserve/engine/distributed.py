"""One model over several machines with mlx.distributed (started by `mlx.launch`).

Every rank loads its shard (mlx-lm's `sharded_load`: tensor parallel where the architecture has
it, pipeline parallel where only that exists) and runs the same engine loop in lock-step. Rank 0
alone serves HTTP: before each engine step it broadcasts what changed (requests added or
cancelled, sequences its stop rules ended, the prefill chunk), and the other ranks apply exactly
that, so every rank runs the same forward passes. Rank 0's sampled tokens are broadcast back
inside the step (one collective per step for the whole batch), so all ranks continue from the
same tokens even if their logits differed in the last bit.
"""

from __future__ import annotations

import pickle
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.generate import GenerationBatch, generation_stream


class DistributedError(RuntimeError):
    """The model cannot be sharded, or a rank is gone."""


class Cluster:
    """This process's place in the group mlx.launch started."""

    def __init__(self, group: mx.distributed.Group | None = None):
        self.group = group if group is not None else mx.distributed.init(strict=True)
        self.rank = self.group.rank()
        self.size = self.group.size()

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
        """(model, tokenizer, config) with this rank's shard of the weights."""
        from mlx_lm.utils import load_model, sharded_load

        probe, _ = load_model(_local(path), lazy=True, strict=False)
        if hasattr(probe, "shard"):
            groups = {"tensor_group": self.group}
        elif hasattr(probe, "model") and hasattr(probe.model, "pipeline"):
            groups = {"pipeline_group": self.group}
        else:
            kind = type(probe).__module__.rsplit(".", 1)[-1]
            raise DistributedError(
                f"the {kind} architecture supports neither tensor nor pipeline parallelism in "
                "mlx-lm, so it cannot be served across machines"
            )
        del probe
        return sharded_load(path, return_config=True, **groups)


def broadcast_sampled_tokens(cluster: Cluster) -> None:
    """Make every rank continue from rank 0's sampled tokens.

    mlx-lm keeps a batch's sampled tokens in `GenerationBatch._next_tokens` until the next
    forward pass reads them (it samples at the end of prefill and of every decode step). In a
    distributed process that attribute becomes a property whose setter replaces the tokens with
    an all_sum of rank 0's (zeros elsewhere): one collective per step for the whole batch.
    Process-wide, and only when there are several ranks; mlx-lm is pinned to 0.32.x, whose
    GenerationBatch this relies on.
    """
    if cluster.size < 2 or isinstance(vars(GenerationBatch).get("_next_tokens"), property):
        return

    def get(batch):
        return batch.__dict__.get("_lockstep_next_tokens")

    def set_(batch, tokens) -> None:
        if isinstance(tokens, mx.array) and tokens.size:  # (an empty batch has none)
            with mx.stream(generation_stream):  # where the model's collectives run
                # Times 0 elsewhere, not zeros: a filtered or joined batch re-broadcasts lazily,
                # and only a graph that still depends on the earlier broadcasts runs them on
                # every rank (with zeros rank 0 alone did, and the ring paired mismatched sums).
                mine = tokens * mx.array(int(cluster.leader), dtype=tokens.dtype)
                tokens = mx.distributed.all_sum(mine, group=cluster.group)
        batch.__dict__["_lockstep_next_tokens"] = tokens

    GenerationBatch._next_tokens = property(get, set_)


def _local(path: str):
    from pathlib import Path

    from mlx_lm.utils import _download

    local = Path(path).expanduser()
    return local if local.exists() else _download(path)
