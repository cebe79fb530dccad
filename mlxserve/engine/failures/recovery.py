"""A step that raised: the rows of the batch go on without the one that made it fail.

The failed step is undone (`mlx_lm_compat.failed_step`): a decode pass that raised is as if it
never ran; a prompt pass that raised after the decode pass went through lets that pass's tokens
out, and its prompts start over. Which row made the pass fail is found by halving the rows that
were in it (`Bisection`): half of them are held out of the batch for a step; if the pass fails
again the culprit is in the half that stayed, else in the half held out. A row found alone in a
failing pass is the culprit: it ends with an error event naming the cause. The others produce
exactly what they would have: a held decode row leaves with its KV and the token it had sampled
(sent at once) and comes back where it was; a prompt has sent nothing and starts again.

While a culprit is sought, new requests wait: one arriving then would be a suspect no halving
accounts for.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from types import SimpleNamespace

from ..mlx_lm_compat import failed_step
from ..mlx_lm_compat.failed_step import PausedRow, StepCheckpoint
from ..requests import GenerationEvent
from ..scheduling.messages import Group
from ..sequences.starting import insert_sequence
from ..sequences.state import SequenceState, read_logprob_rows

log = logging.getLogger("mlxserve.engine")


@dataclass
class Held:
    """A suspect out of the batch for now."""

    seq: SequenceState
    group_id: int
    old_uid: int
    paused: PausedRow | None  # a decode row's KV and next token; None: a prompt, started anew


def _among(seq: SequenceState, seqs: list[SequenceState]) -> bool:
    return any(seq is s for s in seqs)


class Bisection:
    """Which row makes a pass fail, by halving the suspects. A suspect back in the batch is
    cleared once it sends a token (its passes, its whole prefill for a prompt, went through);
    the next held half comes back when every one in the batch is cleared."""

    def __init__(self) -> None:
        self.testing: list[SequenceState] = []  # suspects in the batch, not cleared yet
        self.held: list[list[Held]] = []  # suspects out of it, the latest half last

    @property
    def active(self) -> bool:
        return bool(self.testing or self.held)

    def failed(self, in_pass: list[SequenceState]) -> tuple[SequenceState | None, list]:
        """A pass holding `in_pass` raised: the culprit when one is left, else the suspects to
        hold out of the batch while the others are tested."""
        suspects = [s for s in in_pass if _among(s, self.testing)] or in_pass
        if len(suspects) <= 1:
            self.testing = []
            return (suspects[0] if suspects else None), []
        half = len(suspects) // 2
        self.testing = suspects[:half]
        return None, suspects[half:]

    def cleared(self, seqs: list[SequenceState]) -> None:
        self.testing = [s for s in self.testing if not _among(s, seqs)]

    def next_half(self) -> list[Held]:
        """The latest held half, to be tested now, once the suspects in the batch are cleared."""
        if self.testing or not self.held:
            return []
        released = self.held.pop()
        self.testing = [h.seq for h in released]
        return released

    def release_all(self) -> list[Held]:
        released = [h for half in self.held for h in half]
        self.held.clear()
        self.testing = []
        return released

    def drop_group(self, group_id: int) -> list[Held]:
        """A cancelled request's held rows, forgotten here."""
        dropped = [h for half in self.held for h in half if h.group_id == group_id]
        self.held = [[h for h in half if h.group_id != group_id] for half in self.held]
        self.held = [half for half in self.held if half]
        return dropped


class FailedSteps:
    """The engine's side of a failed step: who is out, who is back, who failed."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.bisection = Bisection()
        self.deferred: list[Group] = []  # arrived while a culprit was sought
        # rows back in the batch, no token sent yet: id -> (the row, as it left); the row is held
        # here so that its id names no other while it is
        self.resuming: dict[int, tuple[SequenceState, PausedRow]] = {}

    @property
    def busy(self) -> bool:
        return self.bisection.active or bool(self.deferred)

    def defer(self, group: Group) -> bool:
        """Keep an arriving group back while a culprit is sought; whether it was kept."""
        if self.bisection.active:
            self.deferred.append(group)
        return self.bisection.active

    def sent(self, decoded: list[tuple]) -> None:
        """The (response, row) pairs that sent a token this step: the rows are cleared as
        suspects, and back for good. Nothing to do, and nothing done, in the usual step."""
        if not (self.bisection.testing or self.resuming):
            return
        seqs = [seq for _, seq in decoded]
        self.bisection.cleared(seqs)
        for seq in seqs:
            self.resuming.pop(id(seq), None)

    def recover(self, error: Exception, point: StepCheckpoint) -> None:
        engine = self.engine
        generator, live = engine.generator, engine.live
        decoding = set(point.decode_uids)
        decoded = generator.decoded
        if decoded is None and decoding:  # the decode pass raised: as if it never ran
            failed_step.restore(generator, point)
            in_pass = [*point.decode_uids, *point.carried_uids]
        failed_step.drop_prompts(generator, decoding)
        prompts = [s for s in live.all() if s.uid not in decoding]
        if decoded is not None or not decoding:  # a prompt pass raised: its prompts start over
            in_pass = [s.uid for s in prompts]
            if decoded:  # the decode pass went through: its tokens go out
                engine._emit(decoded)
        groups = {id(s): live.group_of(s) for s in live.all()}
        suspects = [s for uid in in_pass if (s := live.get(uid)) is not None]
        log.error("a step failed (%d rows in the failing pass): %r", len(suspects), error)
        log.debug("the failed step's traceback", exc_info=error)
        culprit, out = self.bisection.failed(suspects)
        cause = f"generation failed: the model's pass failed: {type(error).__name__}: {error}"
        # Decode rows out first: pausing one reads what the failed step left (a pass that failed
        # in evaluation fails it again, and every sequence in flight with it, prompts still live).
        held = [self._pause(s, groups[id(s)]) for s in out if s.uid in decoding]
        # a decode row on its way back has its KV and sent tokens: it comes back as it was
        again = {id(s): self.resuming.pop(id(s), (s, None))[1] for s in prompts}
        held += [Held(s, groups[id(s)], s.uid, again[id(s)]) for s in out if s.uid not in decoding]
        for seq in prompts:
            live.forget(seq)
        if culprit is not None:
            self._fail(culprit, cause)
        self._release(
            [
                Held(seq, groups[id(seq)], seq.uid, again[id(seq)])
                for seq in prompts
                if seq is not culprit and not _among(seq, out)
            ]
        )
        held = [h for h in held if h is not None]
        if held:
            self.bisection.held.append(held)
        if culprit is not None:
            self._release(self.bisection.release_all())

    def passed(self) -> None:
        """After a step that went through."""
        live = self.engine.live
        gone = [s for s in self.bisection.testing if live.get(s.uid) is not s]
        self.bisection.cleared(gone)  # finished, cancelled or failed on their own
        for key, (seq, _) in list(self.resuming.items()):
            if live.get(seq.uid) is not seq:
                del self.resuming[key]
        if self.bisection.active:
            self._release(self.bisection.next_half())
        if not self.bisection.active and self.deferred:
            deferred, self.deferred = self.deferred, []
            for group in deferred:
                self.engine.admission.admit(group)

    def forget_group(self, group_id: int) -> int:
        """A cancelled request's rows held or deferred here; how many."""
        held = self.bisection.drop_group(group_id)
        deferred = [g for g in self.deferred if g.group_id == group_id]
        self.deferred = [g for g in self.deferred if g.group_id != group_id]
        return len(held) + sum(len(g.requests) for g in deferred)

    def fail_all(self, message: str, unavailable: bool) -> None:
        self.resuming.clear()
        for h in self.bisection.release_all():
            h.seq.post(GenerationEvent(index=h.seq.index, error=message, unavailable=unavailable))
        for group in self.deferred:
            group.fail(message, unavailable)
        self.deferred = []

    # ---- rows out and back ------------------------------------------------------------------

    def _fail(self, seq: SequenceState, cause: str) -> None:
        engine = self.engine
        log.error("a sequence made the model's pass fail: %s", cause)
        seq.post(GenerationEvent(index=seq.index, error=cause))
        engine.stats.failed_sequences += 1
        if engine.live.get(seq.uid) is seq:
            engine._remove([seq])
        # its choices start from the prefix cache, or anew
        engine.admission.release_followers(seq.uid)

    def _pause(self, seq: SequenceState, group_id: int) -> Held | None:
        """Decode row `seq` out of the batch; it sends the token it had sampled first (None if
        that ends it)."""
        engine = self.engine
        paused = failed_step.pause(engine.generator, seq.uid)
        engine.live.forget(seq)
        finish = None
        if paused.stop.matcher().advance(paused.next_token):
            finish = "stop"
        elif paused.remaining <= 1:
            finish = "length"
        response = SimpleNamespace(
            uid=seq.uid, token=paused.next_token, logprobs=paused.logprobs, finish_reason=finish
        )
        row = read_logprob_rows([(response, seq)]).get(id(seq))
        event = engine._advance(seq, response, row)
        engine.stats.generated_tokens += event.error is None
        seq.post(event)
        if event.finished:
            engine.stats.finished_sequences += 1
            return None
        return Held(seq, group_id, seq.uid, paused)

    def _release(self, held: list[Held]) -> None:
        for h in held:
            if h.paused is None:
                self._start_again(h)
                continue
            h.seq.uid = failed_step.resume(self.engine.generator, h.paused)
            self.engine.live.add(h.group_id, h.seq)
            self.resuming[id(h.seq)] = (h.seq, h.paused)  # until it sends a token

    def _start_again(self, h: Held) -> None:
        """A prompt back in the batch from its start; it fails alone if it cannot be."""
        engine = self.engine
        try:
            insert_sequence(
                h.seq, engine.slot.loaded, engine.generator, engine.prefixes, again=True
            )
        except Exception as error:
            log.exception("could not start a sequence again")
            h.seq.post(GenerationEvent(index=h.seq.index, error=f"generation failed: {error}"))
            engine.admission.release_followers(h.old_uid)
            return
        engine.live.add(h.group_id, h.seq)
        engine.admission.followers.move(h.old_uid, h.seq.uid)
