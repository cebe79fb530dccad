"""Mixed batches: a step's prompt chunk runs inside the next decode step's forward pass.

mlx-lm prefills in a forward pass of its own, so a step beside a long prompt reads every weight
twice: on a CPU, a step with a few prompt tokens beside it cost more than the 3x bound on a
running stream's gap. Here the prompt's rows join the decode rows in every projection and MLP
matmul of one forward pass; only attention runs per batch, each against its own KV cache.

How it plugs into mlx-lm's `BatchGenerator` (0.32): the prompt batch's `prompt(tokens)` keeps the
chunk instead of running it when a decode step will follow and the chunk fits one pass; the
decode batch's model call then runs both. mlx-lm starts each decode step's forward pass before
waiting for the previous one, so a carried chunk would be paid a step or two later, in a step the
pacer would not charge for it, and the pacer swung between its smallest and largest chunks. So
a step whose forward pass carries a chunk waits for that
pass before it returns, and `paid_tokens` is exact. A kept chunk with no decode step to carry it
(the batch emptied) runs on its own before the next step, and before the generator removes or
extracts caches.

A prompt's last token rides in the pass that carries its final chunk, and the decode batch
starts it from that pass's logits: mlx-lm would run it in a forward pass of its own in the step
the prompt joins, after the decode pass: two passes where one does. Prompts side by side take
chunks of different lengths (a burst of requests arrives spread out): the chunk still rides in
the one pass, each prompt's last token with it, its tokens packed in the matmuls and
right-padded for attention, as mlx-lm pads its own prompt passes (`PromptPart`).
A final chunk with no decode batch to ride in (an idle server) runs at once, its last tokens
with it, rather than in mlx-lm's pass followed by a pass for the last tokens.

Deep in a long prompt not one token fits a step (a token's attention reads the whole KV), but
several tokens share those reads. So the pacer may spread a chunk over several passes, some of
its layers in each (`MixedBatches.layers_per_pass`, `PromptPart`); mlx-lm is held meanwhile
(`_hold_prompts`).

The same forward pass attends the decode batch group by group when it is made of several KV
caches (`batch_join.KVGroups`: a deep prompt joins as a group of its own rather than being copied
into the batch's rectangular KV), so `MixedBatches` also routes the decode batch's `extend`
through `batch_join.join_caches`.

Llama-architecture models (mlx-lm's `llama`, `qwen2` and `qwen3` modules, full attention; the
language model of a Qwen2-VL or Qwen3-VL) on one machine; anything else prefills, and joins the
decode batch, as before.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import accumulate

import mlx.core as mx
from mlx_lm.generate import BatchGenerator, PromptProcessingBatch
from mlx_lm.models import base
from mlx_lm.models.base import create_attention_mask

from ...families import mixed_batch_modules
from . import batch_join

_mlx_lm_prompt = PromptProcessingBatch.prompt


# mlx-lm's modules whose layers `mixed_forward` runs (families.py says which)
MODULES = tuple(f"mlx_lm.models.{name}" for name in mixed_batch_modules())
# A chunk of this few tokens (a prompt's last one, joining) goes through every layer in the pass
# that carries it, whatever the pacer's layers a pass: it costs the pass a few rows, where spread
# over passes it held its prompt's join for as many steps (a prompt with images, its last token
# alone, joined 10 steps later at 3 layers a pass)
ONE_PASS_TOKENS = 4


def language_of(model):
    """The language model a vision-language model's wrapper holds (mlx-lm's `qwen2_vl`,
    `qwen3_vl`), or the model itself."""
    inner = getattr(model, "language_model", None)
    return inner if inner is not None and hasattr(inner, "model") else model


def supports(model) -> bool:
    """Whether `mixed_forward` knows the model's layers."""
    language = language_of(model)
    inner = getattr(language, "model", None)
    return (
        type(language).__module__ in MODULES
        and inner is not None
        and getattr(inner, "swa_idx", None) is None  # llama's sliding-window layers: not here
        # (a layer of another rank's pipeline stage is None here: mlx-lm's pipeline)
        and all(hasattr(getattr(layer, "self_attn", None), "q_proj") for layer in inner.layers)
    )


@dataclass
class PromptPart:
    """A prompt chunk on its way through the model, some of its layers each forward pass. Its
    tokens go through the matmuls packed, each prompt's after the one before; only attention
    sees them right-padded to the longest, as the prompt batch's KV holds them (`padded_rows`,
    `packed_rows`), so prompts at different points pay no padding in the matmuls."""

    inputs: mx.array  # (1, N): the prompts' tokens, one prompt after the other
    lengths: list[int]  # each prompt's tokens in the chunk (N in all)
    caches: list  # one per layer
    join_rows: list[int] = field(default_factory=list)  # rows whose last token's logits we want
    hidden: mx.array | None = None  # (1, N, width) after the first `done` layers
    done: int = 0
    logits: mx.array | None = None  # (J, 1, V) for the J `join_rows`, once through every layer

    def __post_init__(self):
        self.batch, self.length = len(self.lengths), max(self.lengths)
        self.padded = min(self.lengths) < self.length
        self._starts = list(accumulate(self.lengths, initial=0))
        if self.padded:  # padded position -> packed token (N: a row of zeros), and back
            self._to_padded = mx.array(
                [
                    a + i if i < n else self._starts[-1]
                    for a, n in zip(self._starts, self.lengths)
                    for i in range(self.length)
                ]
            )
            self._to_packed = mx.array(
                [row * self.length + i for row, n in enumerate(self.lengths) for i in range(n)]
            )

    @property
    def wants_logits(self) -> bool:
        return bool(self.join_rows)

    @property
    def tokens(self) -> int:
        return self._starts[-1]

    def padded_rows(self, x: mx.array) -> mx.array:
        """(1, N, d) -> (1, P * C, d), zeros in the padding."""
        if not self.padded:
            return x
        zeros = mx.zeros((1, 1, x.shape[-1]), x.dtype)
        return mx.concatenate([x, zeros], axis=1)[:, self._to_padded]

    def packed_rows(self, x: mx.array) -> mx.array:
        """(1, P * C, d) -> (1, N, d)."""
        return x[:, self._to_packed] if self.padded else x

    def last_tokens(self) -> mx.array:
        """The packed positions of the joining rows' last tokens."""
        return mx.array([self._starts[row] + self.lengths[row] - 1 for row in self.join_rows])


def mixed_forward(
    model,
    decode_parts,
    prompt: PromptPart | None = None,
    layers=None,
    attention: Callable = base.scaled_dot_product_attention,
    matmul_rows: Callable[[int], int] | None = None,
):
    """The decode rows' logits (B, 1, V) for `decode_parts`, a list of (inputs (b, 1), one cache
    per layer) with b summing to B (None if there are none), and `prompt` taken through its next
    `layers` layers (all that are left if None), written into its caches: one pass over the
    weights, attention per part (by `attention`, mlx-lm's `scaled_dot_product_attention` or
    the platform's). `matmul_rows(n)`: the rows the matmuls of n rows run with, zero rows added
    (the platform's; None: n)."""
    model = language_of(model)
    inner = model.model
    total = len(inner.layers)
    first = prompt.done if prompt is not None else total
    stop = total if prompt is None or layers is None else min(total, first + layers)
    shapes = [inputs.shape for inputs, _ in decode_parts]
    hidden = [inner.embed_tokens(inputs) for inputs, _ in decode_parts]
    masks = [create_attention_mask(h, caches[0]) for h, (_, caches) in zip(hidden, decode_parts)]
    rows = sum(inputs.size for inputs, _ in decode_parts)
    width = model.args.hidden_size  # not the embedding's weight: packed when quantized
    h = mx.concatenate([x.reshape(1, -1, width) for x in hidden], axis=1) if rows else None
    if rows:
        h = _padded(h, rows, matmul_rows)
    if prompt is not None:
        prompt_h = prompt.hidden
        if prompt_h is None:
            prompt_h = inner.embed_tokens(prompt.inputs).reshape(1, -1, width)
        prompt_mask = create_attention_mask(  # reads only its `shape[1]`, the padded length
            mx.zeros((prompt.batch, prompt.length)), prompt.caches[first]
        )
    for index, layer in enumerate(inner.layers):
        with_prompt = first <= index < stop
        if index == first and prompt is not None:
            h = mx.concatenate([h[:, :rows], prompt_h], axis=1) if rows else prompt_h
            h = _padded(h, rows + prompt.tokens, matmul_rows)
        if h is None or not (rows or with_prompt):
            continue
        parts = [*shapes, prompt] if with_prompt else shapes
        part_masks = [*masks, prompt_mask] if with_prompt else masks
        caches = [layer_caches[index] for _, layer_caches in decode_parts]
        if with_prompt:
            caches.append(prompt.caches[index])
        x = layer.input_layernorm(h)
        h = h + _attention(layer.self_attn, x, parts, part_masks, caches, attention)
        h = h + layer.mlp(layer.post_attention_layernorm(h))
        if index == stop - 1 and prompt is not None:
            h, prompt_h = h[:, :rows], h[:, rows : rows + prompt.tokens]
            if rows:
                h = _padded(h, rows, matmul_rows)
    decoded = h[:, :rows] if rows else None
    if prompt is None:
        return _logits(model, decoded, matmul_rows)
    prompt.hidden, prompt.done = prompt_h, stop
    if stop < total or not prompt.wants_logits:
        return _logits(model, decoded, matmul_rows) if rows else None
    last = prompt_h[:, prompt.last_tokens()]  # logits for the joining rows' last tokens only
    out = mx.concatenate([decoded, last], axis=1) if rows else last
    logits = _logits(model, out, matmul_rows)
    prompt.logits, prompt.hidden = logits[rows:], None
    return logits[:rows] if rows else None


def _by_row(logits: mx.array | None, length: int) -> mx.array | None:
    """Logits of decode rows fed `length` tokens each, (rows, length, V) whether the pass packed
    them ((rows * length, 1, V), `mixed_forward`) or not."""
    return None if logits is None else logits.reshape(-1, length, logits.shape[-1])


def _padded(h: mx.array, real: int, matmul_rows: Callable[[int], int] | None) -> mx.array:
    """The first `real` rows of `h` (1, n, width), with zero rows after them up to
    `matmul_rows(real)`. The norms, projections and MLP work row by row, and attention reads
    only the real rows, so what the padding holds never reaches them."""
    if matmul_rows is None:
        return h
    rows = matmul_rows(real)
    h = h[:, :real] if h.shape[1] != real else h
    if rows == real:
        return h
    return mx.concatenate([h, mx.zeros((1, rows - real, h.shape[-1]), h.dtype)], axis=1)


def _logits(model, h: mx.array, matmul_rows: Callable[[int], int] | None = None) -> mx.array:
    """(n, 1, V) for hidden states (1, n, width)."""
    inner = model.model
    n = h.shape[1]
    h = _padded(h, n, matmul_rows)
    out = inner.norm(h).reshape(h.shape[1], 1, h.shape[-1])
    if model.args.tie_word_embeddings:
        logits = inner.embed_tokens.as_linear(out)
    else:
        logits = model.lm_head(out)
    return logits[:n] if logits.shape[0] != n else logits


def _attention(attn, x: mx.array, parts, masks, caches, sdpa: Callable) -> mx.array:
    """mlx-lm's llama `Attention` over rows of several batches: projections once, attention
    apart. `parts`: each batch's (rows, length), or the `PromptPart` whose packed rows these
    are."""
    queries, keys, values = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
    outputs, start = [], 0
    for part, mask, cache in zip(parts, masks, caches):
        prompt = part if isinstance(part, PromptPart) else None
        batch, length = (prompt.batch, prompt.length) if prompt else part
        rows = slice(start, start + (prompt.tokens if prompt else batch * length))
        q, k, v = queries[:, rows], keys[:, rows], values[:, rows]
        if prompt is not None:
            q, k, v = prompt.padded_rows(q), prompt.padded_rows(k), prompt.padded_rows(v)
        q = _heads(q, batch, length, attn.n_heads, getattr(attn, "q_norm", None))
        k = _heads(k, batch, length, attn.n_kv_heads, getattr(attn, "k_norm", None))
        v = _heads(v, batch, length, attn.n_kv_heads)
        q, k = attn.rope(q, offset=cache.offset), attn.rope(k, offset=cache.offset)
        k, v = cache.update_and_fetch(k, v)
        out = sdpa(q, k, v, cache=cache, scale=attn.scale, mask=mask)
        out = out.transpose(0, 2, 1, 3).reshape(1, batch * length, -1)
        outputs.append(prompt.packed_rows(out) if prompt is not None else out)
        start = rows.stop
    if start < x.shape[1]:  # the padding's rows (`_padded`)
        outputs.append(mx.zeros((1, x.shape[1] - start, outputs[0].shape[-1]), x.dtype))
    return attn.o_proj(mx.concatenate(outputs, axis=1))


def _heads(rows: mx.array, batch: int, length: int, heads: int, norm=None) -> mx.array:
    """(1, batch * length, heads * d) -> (batch, heads, length, d), each head normed first
    where the family norms them (Qwen3's q_norm, k_norm)."""
    split = rows.reshape(batch, length, heads, -1)
    if norm is not None:
        split = norm(split)
    return split.transpose(0, 2, 1, 3)


class MixedBatches:
    """Carries each step's prompt chunk in the next decode step of one `BatchGenerator`."""

    def __init__(
        self,
        generator: BatchGenerator,
        max_chunk: int,
        attention: Callable = base.scaled_dot_product_attention,
        matmul_rows: Callable[[int], int] | None = None,
    ):
        self.generator = generator
        self.attention = attention
        self.matmul_rows = matmul_rows  # the platform's (`mixed_forward`)
        self.model = generator.model
        self.language = language_of(self.model)  # a vision model's language model, or the model
        self.max_chunk = max_chunk  # longer chunks run in mlx-lm's own passes
        self.layers = len(self.language.model.layers)
        # The layers a chunk taken from now on goes through in each forward pass, None for all
        # (the pacer's: deep in a long prompt one token through every layer is already more than
        # a stream's step may carry)
        self.layers_per_pass: int | None = None
        self.pending: PromptPart | None = None
        self._layers_per_pass = self.layers  # the pending chunk's
        self._pending_joins: list[int] | None = None  # uids whose last token `pending` carries
        self._held_prefill_batch: int | None = None  # mlx-lm's, while a chunk spans passes
        self._join_logits: dict[int, mx.array] = {}  # uid: its last prompt token's logits (1, V)
        # totals: in decode passes; kept, then run on their own; run at once with no decode batch
        self.carried_tokens = self.flushed_tokens = self.idle_tokens = 0
        self.joins_carried = 0  # prompts whose last token rode in a chunk's pass
        self._carried = self._taken = self._flushed = 0  # this step's
        self._decoded = False  # whether this step ran a decode pass
        self._skipped: set[int] = set()  # uids left out of this step's pass (`_rows_ending`)
        generator._prompt_batch._mixed_batches = self
        generator._generation_batch.model = self._decode_forward
        self._mlx_lm_extend = generator._generation_batch.extend
        generator._generation_batch.extend = self._extend
        generator._prompt_batch.split = self._split_for_generation(generator._prompt_batch.split)

    def paid_tokens(self, scheduled: int) -> float:
        """The prompt tokens computed in the step just ended, of which `scheduled` were given to
        the prompt batch in it (mlx-lm's count); a chunk's pass through some of the layers counts
        as that share of its tokens."""
        return scheduled - self._taken + self._carried + self._flushed

    def take(self, batch: PromptProcessingBatch, tokens: list[list[int]]) -> bool:
        """`prompt(tokens)` of the generator's prompt batch: keep the chunk for the next decode
        step (and do mlx-lm's bookkeeping), or say no and let mlx-lm run it now. A chunk is kept
        too when this step's decode emptied the batch: it then runs alone at the start of the
        next step, after the last tokens of this one are out (run now, it delays a finishing
        stream's last token by a prompt pass). With no decode batch at all, a chunk that ends
        a prompt runs now, carrying its last token.

        Each prompt that the chunk leaves with only its last token has that token carried too
        (`_joining_rows`); rows of unequal length are right-padded. A chunk spread over
        several passes holds mlx-lm's prompt processing until its last one (`_hold_prompts`)."""
        lengths = [len(t) for t in tokens]
        decoding = bool(len(self.generator._generation_batch) or self._decoded)
        if (
            batch is not self.generator._prompt_batch
            or self.pending is not None
            or not 0 < max(lengths, default=0) <= self.max_chunk
        ):
            return False
        joining = self._joining_rows(batch)
        if not decoding and not joining:
            return False  # mlx-lm's own pass does as well
        for kept, new in zip(batch.tokens, tokens):
            kept += new
        self._pending_joins = [batch.uids[row] for row in joining] or None
        chunk = [list(t) for t in tokens]
        for row, token in joining.items():
            chunk[row].append(token)
        self.pending = self._part(batch, chunk, list(joining))
        self._taken += sum(lengths)
        if not decoding:  # nothing to ride in: run it now, with the prompts' last tokens
            self.idle_tokens += self._run_alone()
            return True
        self._layers_per_pass = max(1, min(self.layers_per_pass or self.layers, self.layers))
        if sum(map(len, chunk)) <= ONE_PASS_TOKENS:
            self._layers_per_pass = self.layers
        self._hold_prompts(batch, math.ceil(self.layers / self._layers_per_pass) - 1)
        return True

    def _part(self, batch: PromptProcessingBatch, chunk: list[list[int]], join_rows) -> PromptPart:
        """The chunk as a `PromptPart` on the prompt batch's caches, which are told of the right
        padding its rows of unequal length have in them (as mlx-lm's own `prompt` does)."""
        part = PromptPart(
            mx.array([token for row in chunk for token in row])[None],
            [len(row) for row in chunk],
            batch.prompt_cache,
            join_rows=join_rows,
        )
        if part.padded:
            padding = [part.length - n for n in part.lengths]
            for cache in batch.prompt_cache:
                cache.prepare(lengths=part.lengths, right_padding=padding)
        return part

    def _hold_prompts(self, batch: PromptProcessingBatch, steps: int) -> None:
        """Keep mlx-lm from giving the prompt batch more tokens, or more prompts, for `steps`
        steps, while the pending chunk goes through the rest of its layers: an empty segment in
        front of each prompt's (mlx-lm takes nothing from it, then drops it) delays its next
        chunk, or its move to the decode batch, by a step; and no prompt joins the batch, whose
        caches are part-way through a pass."""
        if steps <= 0:
            return
        for processing in self.generator._currently_processing:
            processing[0][0:0] = [[] for _ in range(steps)]
        self._held_prefill_batch = self.generator.prefill_batch_size
        self.generator.prefill_batch_size = len(batch)

    def flush(self) -> None:
        """Run a kept chunk on its own."""
        if self.pending is not None:
            self.flushed_tokens += self._run_alone()

    def _run_alone(self) -> float:
        """The pending chunk through all its layers left in a pass of its own: tokens computed."""
        part = self.pending
        _, computed = self._run(part, [], None)
        mx.eval(self._join_logits, [c.state for c in part.caches])
        self._flushed += computed
        return computed

    def abandon(self) -> None:
        """Forget a kept chunk and carried logits without running anything: their prompts are
        leaving the batch (a failed step)."""
        self.pending = None
        self._pending_joins = None
        self._join_logits.clear()
        if self._held_prefill_batch is not None:
            self.generator.prefill_batch_size = self._held_prefill_batch
            self._held_prefill_batch = None

    def step(self, next_step: Callable):
        """The generator's step (`next_step`, mlx-lm's `_next`) with this step's chunk carried."""
        self._carried = self._taken = self._flushed = 0
        self._decoded = False
        self._skipped.clear()
        if len(self.generator._generation_batch) == 0:
            self.flush()
        responses = next_step()
        self._trim_skipped(responses[1])
        pass_outputs = getattr(self.generator._generation_batch, "_next_tokens", None)
        if self._carried and pass_outputs is not None:  # the step pays for its chunk (see above)
            mx.eval(pass_outputs)
        return responses

    def _decode_forward(self, inputs: mx.array, cache) -> mx.array:
        self._decoded = True
        groups = batch_join.groups_of(cache)
        starts = [0, inputs.shape[0]]
        if len(groups) > 1:
            starts = list(accumulate((batch_join.rows_of(g[0]) for g in groups), initial=0))
        decode_parts = [(inputs[a:b], g) for a, b, g in zip(starts, starts[1:], groups)]
        ending = self._rows_ending()
        idle = [all(ending[a:b]) for a, b in zip(starts, starts[1:])]
        length = inputs.shape[1]  # 1, or a verify pass's last token and drafts
        if not any(idle):
            return _by_row(self._forward(decode_parts), length)
        uids = self.generator._generation_batch.uids
        for a, b, skipped in zip(starts, starts[1:], idle):
            if skipped:
                self._skipped.update(uids[a:b])
        live = [part for part, skipped in zip(decode_parts, idle) if not skipped]
        return self._with_idle_rows(_by_row(self._forward(live), length), starts, idle, length)

    def _rows_ending(self) -> list[bool]:
        """Per decode row, whether the token this pass reads is its last (`max_tokens`): mlx-lm
        computes a token ahead, so such a row's pass is wasted; beside a deep prompt answering
        one token, that pass was a running stream's longest gap."""
        batch = self.generator._generation_batch
        return [n + 1 >= most for n, most in zip(batch._num_tokens, batch.max_tokens)]

    def _with_idle_rows(
        self, logits: mx.array | None, starts: list[int], idle: list[bool], length: int
    ):
        """`logits` (rows, length, V) of the live groups, with rows of zeros for the groups left
        out (sampled, then dropped: their sequences end in this step)."""
        vocabulary = self.language.args.vocab_size
        dtype = mx.float32 if logits is None else logits.dtype
        pieces, at = [], 0
        for a, b, skipped in zip(starts, starts[1:], idle):
            if skipped:
                pieces.append(mx.zeros((b - a, length, vocabulary), dtype))
            else:
                pieces.append(logits[at : at + b - a])
                at += b - a
        return mx.concatenate(pieces)

    def _forward(self, decode_parts) -> mx.array | None:
        """The decode rows' logits for `decode_parts` (None if there are none), carrying the
        pending chunk if any."""
        if not decode_parts and self.pending is None:
            return None
        if self.pending is None:
            if len(decode_parts) == 1 and not self._pads(decode_parts[0][0].size):
                inputs, caches = decode_parts[0]
                return self.model(inputs, cache=caches)
            return mixed_forward(
                self.language, decode_parts, attention=self.attention, matmul_rows=self.matmul_rows
            )
        logits, computed = self._run(self.pending, decode_parts, self._layers_per_pass)
        self._carried += computed
        self.carried_tokens += computed
        return logits

    def _pads(self, rows: int) -> bool:
        return self.matmul_rows is not None and self.matmul_rows(rows) != rows

    def _trim_skipped(self, responses) -> None:
        """A row left out of its last pass has no KV for its last token: its `all_tokens`
        (which the prefix cache keys that KV by) ends a token earlier."""
        for r in responses:
            if r.uid in self._skipped and r.all_tokens:
                r.all_tokens = r.all_tokens[:-1]

    def _run(self, part: PromptPart, decode_parts, layers: int | None):
        """The pending chunk through its next `layers` layers (all if None), with the decode
        rows if any: their logits, and the chunk's share computed, in tokens."""
        before = part.done
        logits = mixed_forward(
            self.language, decode_parts, part, layers, self.attention, self.matmul_rows
        )
        if part.done == self.layers:
            self.pending = None
            if part.padded:  # the padding moves in front of each row, as mlx-lm's does
                for cache in part.caches:
                    cache.finalize()
            if part.logits is not None:
                self._keep_join_logits(part.logits)
            if self._held_prefill_batch is not None:
                self.generator.prefill_batch_size = self._held_prefill_batch
                self._held_prefill_batch = None
        return logits, part.tokens * (part.done - before) / self.layers

    def _joining_rows(self, batch: PromptProcessingBatch) -> dict[int, int]:
        """Row: last token, for each prompt in `batch` that mlx-lm has only its last token left
        of (it then moves it to the decode batch in the next step, in a forward pass of its own
        after the decode pass that carried the chunk, where that pass could carry both)."""
        processing = getattr(self.generator, "_currently_processing", None) or []
        if len(processing) != len(batch.uids):
            return {}
        return {
            row: p[0][0][0]
            for row, p in enumerate(processing)
            if len(p[0]) == 1 and len(p[0][0]) == 1
        }

    def _keep_join_logits(self, logits: mx.array) -> None:
        if self._pending_joins is not None:
            self._join_logits.update(zip(self._pending_joins, logits))
            self.joins_carried += len(self._pending_joins)
            self._pending_joins = None

    def _split_for_generation(self, split):
        """The prompt batch's `split`, which mlx-lm calls only to move prompts to the decode
        batch: the ones whose last token a pass already carried start from its logits."""

        def split_for_generation(indices):
            moving = split(indices)
            if any(uid in self._join_logits for uid in moving.uids):
                moving.generate = self._generation_from_carried_logits(moving)
            return moving

        return split_for_generation

    def _generation_from_carried_logits(self, moving: PromptProcessingBatch):
        """`moving.generate`: rows whose last prompt token was carried take its logits instead of
        a forward pass (which would write that token's KV a second time); any others (a prompt
        that arrived with one token left) go through mlx-lm's pass and follow them."""
        generate = moving.generate

        def generate_from_carried(last_tokens: list[list[int]]):
            carried, others = [], []
            for i, uid in enumerate(moving.uids):
                (carried if uid in self._join_logits else others).append(i)
            rest = PromptProcessingBatch.split(moving, others) if others else None
            logits = mx.stack([self._join_logits.pop(uid) for uid in moving.uids])
            model, moving.model = moving.model, lambda inputs, cache: logits
            generation = generate([last_tokens[i] for i in carried])
            generation.model = model
            if rest is not None:
                generation.extend(rest.generate([last_tokens[i] for i in others]))
            return generation

        return generate_from_carried

    def _extend(self, joining) -> None:
        """The decode batch's `extend`: a joining prompt's KV goes in by `batch_join.join_caches`
        (a group of its own when merging would copy too much); mlx-lm does the rest."""
        mine = self.generator._generation_batch
        if mine.prompt_cache and joining.prompt_cache:
            mine.prompt_cache = batch_join.join_caches(mine.prompt_cache, joining.prompt_cache)
            joining.prompt_cache = []  # joined: mlx-lm's extend keeps the batch's as they are
        self._mlx_lm_extend(joining)

    def before_remove(self, uids) -> None:
        """Run a kept chunk, and forget the carried logits of prompts removed before they joined
        the decode batch."""
        self.flush()
        for uid in uids:
            self._join_logits.pop(uid, None)


def _prompt(batch: PromptProcessingBatch, tokens: list[list[int]]) -> None:
    mixed = getattr(batch, "_mixed_batches", None)
    if mixed is None or not mixed.take(batch, tokens):
        _mlx_lm_prompt(batch, tokens)


def install() -> None:
    """Route mlx-lm's `PromptProcessingBatch.prompt` through `MixedBatches.take` where a
    generator has one (idempotent)."""
    PromptProcessingBatch.prompt = _prompt
