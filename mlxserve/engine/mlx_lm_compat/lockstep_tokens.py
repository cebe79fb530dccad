"""Every rank of a cluster continues from rank 0's sampled tokens (engine/cluster/lockstep.py)."""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.generate import GenerationBatch, generation_stream


def broadcast_sampled_tokens(cluster) -> None:
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
