"""Drafts from a second, smaller model that shares the target's tokenizer (`--draft-model`).

The draft model keeps its own batch of KV caches, one row per drafting row of the target's
batch, by uid. A row joins it at its first drafting step (the draft model reads its prompt
alone, then the row is added to the batch), and leaves when the target's row does. Each
verify step first feeds every row what its draft KV lacks (the tokens kept since, and the
token the step starts from; right-padded, the padding rolled back), then drafts greedily one
token a pass; after the target's verdict each row's KV is rolled back to the drafts it kept.
Plain steps in between leave the draft KV behind; the next drafting step catches it up.

With a prefix cache of its own (beside the target's, keyed by tokens as the target's is, in
memory and on disk), a joining row reads only what no earlier row left there: each row's prompt
is kept as it joins, and its whole sequence as it leaves.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, KVCache, make_prompt_cache

from ..engine.mlx_lm_compat.batch_join import row_view
from ..engine.prefix.keeper import PrefixKeeper
from ..engine.prefix.memory import prefix_copy
from .rollback import roll_back

PROMPT_PASS_TOKENS = 512  # a joining row's prompt is read in passes of this many tokens


class DraftModelError(ValueError):
    """A draft model that cannot draft for this target (the message says why)."""


def check_draft_pair(draft_model, draft_vocab: dict[str, int], vocab: dict[str, int]) -> None:
    """Refuse a draft model whose tokens mean something else than the target's, or whose KV
    cannot be batched and rolled back (sliding windows, state-space layers)."""
    if draft_vocab != vocab:
        differ = len(set(draft_vocab.items()) ^ set(vocab.items()))
        raise DraftModelError(
            f"its tokenizer differs from the model's ({len(draft_vocab)} tokens against "
            f"{len(vocab)}, {differ} entries differ); a draft model must share the model's "
            "tokenizer"
        )
    kinds = {type(c).__name__ for c in make_prompt_cache(draft_model)}
    if kinds != {KVCache.__name__}:
        raise DraftModelError(
            f"its layers keep {', '.join(sorted(kinds))}; a draft model needs plain KV caches"
        )


class ModelDrafter:
    """The draft model's batch: rows by uid, each with how many of its tokens its KV holds."""

    def __init__(self, model, prefixes: PrefixKeeper | None = None):
        """`prefixes`: where rows' draft KV is kept for later prompts (None: nowhere)."""
        self.model = model
        self.prefixes = prefixes
        self.uids: list[int] = []
        self.known: list[list[int]] = []  # per row: its tokens so far, drafts not yet judged too
        self.fed: list[int] = []  # per row: how many of `known` the draft KV holds
        # its own drafts the target verified, and kept: the pair's agreement (a grammar's
        # forced tokens, always kept, are not the draft model's)
        self.judged = self.agreed = 0
        self.cache: list[BatchKVCache] | None = None
        self._last: tuple | None = None  # per row: sequence length; width; per row: drafts
        self.joined = 0  # rows that read their prompt in this step (its time is no pass cost)

    def forget(self, uids: Sequence[int]) -> None:
        gone = set(uids)
        keep = [i for i, uid in enumerate(self.uids) if uid not in gone]
        if len(keep) == len(self.uids):
            return
        self._keep_rows([i for i, uid in enumerate(self.uids) if uid in gone])
        if not keep:
            self.reset()
            return
        for layer in self.cache:
            layer.filter(mx.array(keep))
        self.uids = [self.uids[i] for i in keep]
        self.known = [self.known[i] for i in keep]
        self.fed = [self.fed[i] for i in keep]
        self._last = None

    def reset(self) -> None:
        """Forget every row: each reads its sequence anew when it next drafts."""
        self.uids, self.known, self.fed, self.cache, self._last = [], [], [], None, None

    def drafts(
        self, uids: Sequence[int], sequences: Sequence[list[int]], width: int
    ) -> dict[int, list[int]]:
        """`width` greedy drafts for each row, after its sequence (every token the target's KV
        will hold once the step's first token is fed: that token last)."""
        sequence_of = dict(zip(uids, sequences))
        self.forget([uid for uid in self.uids if uid not in sequence_of])
        joining = [uid for uid in uids if uid not in self.uids]
        self.joined += len(joining)
        self._join(joining, sequence_of)
        rows = [sequence_of[uid] for uid in self.uids]
        feeds = [seq[fed:] for seq, fed in zip(rows, self.fed)]
        longest = max(map(len, feeds))
        padded = mx.array([feed + [0] * (longest - len(feed)) for feed in feeds])
        logits = self.model(padded, cache=self.cache)
        roll_back(self.cache, [longest - len(feed) for feed in feeds])
        last = mx.array([len(feed) - 1 for feed in feeds])
        token = mx.argmax(logits[mx.arange(len(feeds)), last], axis=-1)
        drafted = [token]
        for _ in range(width - 1):
            token = mx.argmax(self.model(token[:, None], cache=self.cache)[:, -1], axis=-1)
            drafted.append(token)
        out = mx.stack(drafted, axis=1).tolist()
        self.known = [seq + row[: width - 1] for seq, row in zip(rows, out)]
        self.fed = [len(seq) + width - 1 for seq in rows]
        self._last = ([len(seq) for seq in rows], width, out)
        return dict(zip(self.uids, out))

    def record(self, kept: dict[int, int], verified: dict[int, Sequence[int]]) -> None:
        """The target's verdict on the last drafts: `kept[uid]` drafts of each row (rows not
        named kept none; a step that verified none, none). `verified[uid]`: the drafts the
        target verified, which may not be the model's own (a grammar's: the ones it allows, or
        the tokens it forces). Each row's KV keeps its sequence and the drafts that were both
        its own and kept."""
        if self._last is None:
            return
        lengths, width, drafted = self._last
        self._last = None
        keep = []
        for uid, own in zip(self.uids, drafted):
            pairs = list(zip(own, verified.get(uid, ())))
            # of its own drafts, those the target verified, and kept
            judged = next((i for i, (a, b) in enumerate(pairs) if a != b), len(pairs))
            count = min(kept.get(uid, 0), judged)
            self.judged += judged
            self.agreed += count
            keep.append(min(count, width - 1))
        roll_back(self.cache, [width - 1 - k for k in keep])
        self.fed = [length + k for length, k in zip(lengths, keep)]

    def _join(self, uids: list[int], sequence_of: dict[int, list[int]]) -> None:
        """Rows new to the draft batch: each reads all but its last token alone (past what
        the prefix cache holds of it), in passes of PROMPT_PASS_TOKENS, then joins the batch."""
        if not uids:
            return
        caches = []
        for uid in uids:
            sequence = sequence_of[uid]
            cache, cached = None, 0
            if self.prefixes is not None:
                cache, cached = self.prefixes.fetch(sequence)
            cache = cache or make_prompt_cache(self.model)
            prompt = sequence[:-1]
            for start in range(cached, len(prompt), PROMPT_PASS_TOKENS):
                self.model(mx.array(prompt[start : start + PROMPT_PASS_TOKENS])[None], cache=cache)
                mx.eval([c.state for c in cache])
            if self.prefixes is not None and cached < len(prompt):
                self.prefixes.keep(prompt, cache)  # merged below into buffers of the batch's
            caches.append(cache)
            self.known.append(list(sequence))
            self.fed.append(len(prompt))
        joined = [BatchKVCache.merge(list(layer)) for layer in zip(*caches)]
        if self.cache is None:
            self.cache = joined
        else:
            for mine, theirs in zip(self.cache, joined):
                mine.extend(theirs)
        self.uids.extend(uids)

    def _keep_rows(self, rows: list[int]) -> None:
        """Into the prefix cache, the draft KV of rows about to leave, with the tokens it holds."""
        if self.prefixes is None:
            return
        for row in rows:
            copy = [prefix_copy(row_view(layer, row), self.fed[row]) for layer in self.cache]
            mx.eval([(c.keys, c.values) for c in copy])
            self.prefixes.keep(self.known[row][: self.fed[row]], copy)
