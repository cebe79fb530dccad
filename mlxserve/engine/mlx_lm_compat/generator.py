"""mlx-lm's `BatchGenerator` as the engine drives it: its internals reached through public names.

A subclass rather than attributes swapped on a live generator: mixed batches wrap the step,
and a chunk kept for the next pass runs before rows leave or caches are read.
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx
from mlx_lm.generate import BatchGenerator
from mlx_lm.models import base

from ...speculation.planner import DraftPlanner
from ..requests import MAX_BATCH
from . import batch_join, decode_step, mixed_batch, rope_shift, ssm_lengths, window_prefill
from .contract import check_contract
from .kv_reserve import reserve_for_generator
from .lockstep_tokens import broadcast_sampled_tokens

PREFILL_BATCH = 8  # prompts prefilled side by side


class ServerBatchGenerator(BatchGenerator):
    """Continuous batching with the engine's additions: fewer KV copies on joins (batch_join),
    prompt chunks riding in decode passes (mixed_batch), KV grown ahead (kv_reserve), rows that
    sample alike drawn together (decode_step), drafts verified (speculative_step)."""

    def __init__(
        self,
        model,
        prefill_chunk: int,
        pass_tokens: int,
        mixed: bool = True,
        attention: Callable = base.scaled_dot_product_attention,
        cluster=None,
        mixed_max_chunk: int | None = None,
        matmul_rows: Callable[[int], int] | None = None,
        planner: DraftPlanner | None = None,
        **kwargs,
    ):
        """`prefill_chunk`: prompt tokens a step takes (the pacer changes it step by step);
        `pass_tokens`: the longest forward pass a chunk runs in, the same on every rank of a
        `cluster` (collectives of different shapes would pair up wrongly). `mixed`: carry
        chunks in decode passes where the model allows (not across ranks), up to
        `mixed_max_chunk` tokens (default: `pass_tokens`), their matmuls on `matmul_rows(n)`
        rows for n (the platform's padding; None: n)."""
        check_contract()
        batch_join.install()
        decode_step.install()
        rope_shift.install()
        ssm_lengths.install()
        window_prefill.install()
        if cluster is not None and cluster.size > 1:
            # A pipeline's last stage gathers its hidden state to every rank: the same logits
            # everywhere, so the same tokens without a broadcast (with one, the ring hangs)
            if cluster.sharding != "pipeline":
                broadcast_sampled_tokens(cluster)
            mixed = False
        kwargs.setdefault("completion_batch_size", MAX_BATCH)
        kwargs.setdefault("prefill_batch_size", PREFILL_BATCH)
        super().__init__(model, prefill_step_size=prefill_chunk, **kwargs)
        self._prompt_batch.prefill_step_size = pass_tokens
        self.mixed: mixed_batch.MixedBatches | None = None
        if mixed and mixed_batch.supports(model):
            mixed_batch.install()
            max_chunk = mixed_max_chunk or pass_tokens
            self.mixed = mixed_batch.MixedBatches(self, max_chunk, attention, matmul_rows)
        # The decode pass's responses in the step under way, once that pass has ended: a step
        # that raises after it (in a prompt pass) still sends them (`failed_step`).
        self.decoded: list | None = None
        decode = self._generation_batch
        decode.next = self._recorded(decode.next)
        self.planner = decode.planner = planner

    # ---- mlx-lm's methods, with the mixed batches' bookkeeping -----------------------------

    def _next(self):
        self.decoded = None
        self._generation_batch.may_draft = self.planner is not None and not self.prompt_work()
        if self.mixed is None:
            return super()._next()
        return self.mixed.step(super()._next)

    def _recorded(self, decode_next):
        def recorded_next():
            self.decoded = decode_next()
            return self.decoded

        return recorded_next

    def prompt_work(self) -> bool:
        """Whether the next step runs prompt tokens (a chunk carried, or prompts waiting)."""
        pending = self.mixed is not None and self.mixed.pending is not None
        return pending or bool(len(self._prompt_batch) or self._unprocessed_sequences)

    def remove(self, uids, return_prompt_caches=False):
        if self.planner is not None:
            self.planner.forget(uids)
        if self.mixed is not None:
            self.mixed.before_remove(uids)
        return super().remove(uids, return_prompt_caches=return_prompt_caches)

    def extract_cache(self, uids):
        if self.mixed is not None:
            self.mixed.flush()
        return super().extract_cache(uids)

    # ---- what the engine reads --------------------------------------------------------------

    @property
    def decode_batch(self):
        """mlx-lm's `GenerationBatch`: uids, tokens, prompt_cache per row."""
        return self._generation_batch

    def running_tokens(self, uid: int) -> list[int] | None:
        """The tokens of a decode row so far (its prompt, once it has just joined)."""
        batch = self._generation_batch
        if uid not in batch.uids:
            return None
        return batch.tokens[batch.uids.index(uid)]

    def prompt_tails(self) -> list[int]:
        """Each prompt's tokens left before its last one (a prompt's segments end with its last
        token alone; mixed batches may put empty ones in front)."""
        return [
            sum(len(segment) for segment in p[0][:-1])
            for p in self._currently_processing
            if isinstance(p[0], list) and len(p[0]) >= 2 and len(p[0][-1]) == 1
        ]

    def reserve_kv(self) -> int:
        """Grow KV caches ahead of the next steps; the layers grown."""
        with mx.stream(self.stream):
            return reserve_for_generator(self)

    def paid_tokens(self, scheduled: int) -> float:
        """Prompt tokens computed in the step just ended, of `scheduled` given to it."""
        return scheduled if self.mixed is None else self.mixed.paid_tokens(scheduled)

    def set_layers_per_pass(self, layers: int | None) -> None:
        if self.mixed is not None:
            self.mixed.layers_per_pass = layers
