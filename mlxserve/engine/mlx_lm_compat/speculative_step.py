"""A decode step that verifies drafted tokens: each row's token sampled in the step before and its
drafts go through one forward pass, and every row emits that token, the drafts the target agrees
with, and the target's own token after them (mlx-lm's step emits one token a row).

Only rows without logits processors but bans of fixed ids and a grammar draft (the planner
admits no others): greedy rows keep drafts while the argmax agrees, sampled rows by speculative
sampling (`SequenceSampler.drafts_verified`); the batch's other rows ride in the same pass with
no drafts, their first position sampled as in a plain step. A grammar row's drafts are those
its grammar allows, or the tokens it forces where the lookup found none, each position masked
as the grammar would mask it there.
Positions a row did not keep are taken out of the KV (`speculation.rollback`); caches that cannot
be trimmed (states, wrapped windows) are put back as they were before the pass and fed again what
each row kept (`state_rollback`). So the batch's tokens and caches stay as mlx-lm
keeps them: the tokens each row has fed.
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.generate import GenerationBatch

from ...sampling.batched import draw
from ...sampling.chain import banned_at_rows, shared_bans
from ...speculation.planner import DraftPlanner
from ...speculation.rollback import roll_back
from ...speculation.verify import NO_DRAFT, kept_count
from .batch_join import groups_of, rows_of
from .state_rollback import StateSnapshot, positional, refeed


def planned_drafts(batch: GenerationBatch, planner: DraftPlanner) -> list[list[int]] | None:
    """Each row's drafts for this step, or None for a plain step. Reads the tokens sampled in
    the step before (waiting for them) only when some row's lookup finds drafts worth a pass,
    or a drafting row has a grammar (whose mask waits for them anyway): the tokens a grammar
    forces are kept whatever the model says, so they are worth a pass of their own."""
    remaining = [most - n - 1 for n, most in zip(batch._num_tokens, batch.max_tokens)]
    width = planner.width(batch.uids, batch.tokens, remaining)
    grammars = {}  # drafting rows' grammars, by row
    for row, processors in enumerate(batch.logits_processors):
        grammar = _grammar_of(processors)
        if grammar is not None and planner.drafting(batch.uids[row]) and remaining[row] > 0:
            grammars[row] = grammar
    if not width and not grammars:
        return None
    current = batch._next_tokens.tolist()
    if width:
        drafts = planner.drafts(batch.uids, batch.tokens, current, width, remaining)
    else:
        drafts = [[] for _ in batch.uids]
    batch.draft_masks, batch.draft_forced = {}, {}
    for row, grammar in grammars.items():
        context = batch._token_context[row]
        unseen = context._buffer[grammar.consumed : context._size].tolist()
        # beyond the lookup's width, as many as the grammar forces (all of them are kept)
        most = min(planner.limit(batch.uids[row]), remaining[row])
        drafts[row], masks, forced = grammar.drafted(unseen, current[row], drafts[row], most)
        if masks is not None:
            batch.draft_masks[row] = masks
            batch.draft_forced[row] = forced
    if not any(drafts):
        planner.not_verified()
        return None
    return drafts


def _grammar_of(processors):
    """A row's grammar mask among its logits processors (sampling/grammar_mask.py), or None."""
    return next((p.grammar for p in processors if getattr(p, "grammar", None)), None)


def verify_step(batch: GenerationBatch, planner: DraftPlanner, drafts: list[list[int]], processed):
    """The step with `drafts`: (per row, the tokens it emits; their logprobs). `processed`:
    the plain step's logits processors on a (B, V) slice, -> (logits, token contexts)."""
    batch._current_tokens = current = batch._next_tokens
    batch._current_logprobs = current_logprobs = batch._next_logprobs
    rows = len(drafts)
    batch.draft_width = width = max(map(len, drafts))
    drafted = mx.array([d + [NO_DRAFT] * (width - len(d)) for d in drafts])
    fed = mx.maximum(drafted, 0).astype(current.dtype)  # a pad's position is rolled back
    inputs = mx.concatenate([current[:, None], fed], axis=1)

    snapshot = None if positional(batch.prompt_cache) else StateSnapshot(batch.prompt_cache)
    logits = batch.model(inputs, cache=batch.prompt_cache)
    # a drafting row's only processors but a grammar's: bans of fixed ids (`Ban`: ignore_eos),
    # the same wherever the token falls
    bans, _ = shared_bans(batch.logits_processors)
    logits = banned_at_rows(logits.reshape(rows, width + 1, -1), bans)
    for row, masks in batch.draft_masks.items():  # a grammar row's masks after each draft
        count = masks.shape[0]
        logits[row, 1 : 1 + count] = mx.where(masks, logits[row, 1 : 1 + count], -mx.inf)
    first, token_context = processed(logits[:, 0, :], current)
    if token_context:  # some row's processors (a grammar's) changed its first position
        logits[:, 0, :] = first
    samplers = [batch.fallback_sampler if s is None else s for s in batch.samplers]
    if any(getattr(s, "needs_logprobs", True) for s in samplers):
        first = first - mx.logsumexp(first, axis=-1, keepdims=True)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    else:  # no row reports logprobs or samples: argmaxes of the logits as they are
        logprobs = logits
    sampled = draw(samplers, first)
    chosen = mx.argmax(logits, axis=-1)
    kept = kept_count(chosen[:, :-1] == drafted)
    at = mx.arange(rows)
    following = chosen[at, kept]
    took = kept > 0  # a greedy row's token after no kept draft is its plain draw's
    sampling = [r for r, s in enumerate(samplers) if drafts[r] and getattr(s, "samples", False)]
    if sampling:  # speculative sampling, row by row (rows that sample and drafted are few)
        kept, following = _sampled_rows(kept, following, sampling, samplers, logits, drafts)
        took = (kept > 0) | mx.array([r in sampling for r in range(rows)])  # its residual's
    batch._next_tokens = mx.where(took, following, sampled)
    next_logprobs = mx.where(took[:, None], logprobs[at, kept], first)
    batch._next_logprobs = list(next_logprobs)
    mx.async_eval(batch._next_tokens, batch._next_logprobs, token_context)

    mx.eval(current, current_logprobs, kept)
    kept_rows = kept.tolist()
    if snapshot is None:
        roll_back_rows(batch.prompt_cache, [width - k for k in kept_rows])
    elif min(kept_rows) < width:
        refeed(batch.model, batch.prompt_cache, snapshot, inputs, kept_rows)
    forced = [batch.draft_forced.get(row, 0) for row in range(rows)]
    planner.record(batch.uids, drafts, kept_rows, forced)
    tokens, token_logprobs = [], []
    for row, (token, draft, count) in enumerate(zip(current.tolist(), drafts, kept_rows)):
        emitted = [token, *draft[:count]]
        batch.tokens[row].extend(emitted)
        if row in batch.draft_masks and count:  # its grammar reads the kept drafts next step
            batch._token_context[row].update_and_fetch(mx.array(draft[:count]))
        tokens.append(emitted)
        token_logprobs.append([current_logprobs[row], *(logprobs[row, j] for j in range(count))])
    return tokens, token_logprobs


def _sampled_rows(kept, following, rows: list[int], samplers, logits, drafts):
    """`kept` and `following` (B,) with the sampling `rows`' own, each drawn by its sampler's
    speculative sampling over its positions."""
    verified = [
        samplers[r].drafts_verified(logits[r, : len(drafts[r]) + 1], mx.array(drafts[r]))
        for r in rows
    ]
    at = mx.array(rows)
    kept[at] = mx.concatenate([k for k, _ in verified]).astype(kept.dtype)
    following[at] = mx.concatenate([n for _, n in verified]).astype(following.dtype)
    return kept, following


def roll_back_rows(layers: list, rejected: list[int]) -> None:
    """`rejected[row]` positions out of each row's KV, whichever groups hold the rows."""
    if not any(rejected):
        return
    start = 0
    for group in groups_of(layers):
        count = rows_of(group[0])
        roll_back(group, rejected[start : start + count])
        start += count


def _trimmed(cache: list, surplus: int) -> list | None:
    """A finished row's `cache` without its last `surplus` positions; None where some layer
    cannot drop them."""
    if not all(layer.is_trimmable() for layer in cache):
        return None
    for layer in cache:
        layer.trim(surplus)
    return cache


def next_responses(self: GenerationBatch) -> list:
    """mlx-lm's `GenerationBatch.next` for steps that emit several tokens a row: a response per
    token, each counted against `max_tokens` and stop tokens; a row that ends part-way drops the
    tokens after its end, from its token list and its KV."""
    if not self.uids:
        return []
    step_tokens, step_logprobs = self._step()
    keep, responses, ended = [], [], []
    for i, uid in enumerate(self.uids):
        emitted, logprobs = step_tokens[i], step_logprobs[i]
        if not isinstance(emitted, list):  # a plain step's one token
            emitted, logprobs = [emitted], [logprobs]
        finish, count = None, 0
        for token in emitted:
            count += 1
            self._num_tokens[i] += 1
            if self._num_tokens[i] >= self.max_tokens[i]:
                finish = "length"
            if self._matchers[i].advance(token):
                finish = "stop"
            if finish is not None:
                break
        for token, token_logprobs in zip(emitted[: count - 1], logprobs):
            responses.append(self.Response(uid, token, token_logprobs, None, None, None))
        last = emitted[count - 1]
        if finish is None:
            keep.append(i)
            responses.append(self.Response(uid, last, logprobs[count - 1], None, None, None))
            continue
        surplus = len(emitted) - count
        if surplus:
            del self.tokens[i][-surplus:]
        cache = self.extract_cache(i)
        if surplus:  # a state that read them cannot give them back: nothing to keep
            cache = _trimmed(cache, surplus)
        ended.append(uid)
        responses.append(
            self.Response(uid, last, logprobs[count - 1], finish, cache, self.tokens[i])
        )
    if len(keep) < len(self.uids):
        self.filter(keep)
    planner = getattr(self, "planner", None)
    if planner is not None and ended:
        planner.forget(ended)
    return responses
