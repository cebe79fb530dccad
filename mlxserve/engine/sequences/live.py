"""The sequences in the batch, found by group (one HTTP request's prompts x best_of, cancelled
together) and by batch row (mlx-lm's uid, which each decoded token carries). Each also holds a
slot number, the lowest free one, which llama.cpp's clients read (/slots, `id_slot`)."""

from __future__ import annotations

from collections.abc import Iterator

from .state import SequenceState


class LiveSequences:
    def __init__(self) -> None:
        self._groups: dict[int, list[SequenceState]] = {}
        self._by_uid: dict[int, tuple[int, SequenceState]] = {}
        self._slots: set[int] = set()

    def __len__(self) -> int:
        return len(self._by_uid)

    def add(self, group_id: int, seq: SequenceState) -> None:
        """A sequence that got a batch row (one without a row never runs)."""
        if seq.uid is not None:
            # a sequence back in the batch after a failed step keeps its slot
            if seq.slot < 0 or seq.slot in self._slots:
                seq.slot = next(i for i in range(len(self._slots) + 1) if i not in self._slots)
            self._slots.add(seq.slot)
            self._groups.setdefault(group_id, []).append(seq)
            self._by_uid[seq.uid] = (group_id, seq)

    def get(self, uid: int) -> SequenceState | None:
        entry = self._by_uid.get(uid)
        return None if entry is None else entry[1]

    def group_of(self, seq: SequenceState) -> int:
        return self._by_uid[seq.uid][0]

    def group(self, group_id: int) -> list[SequenceState]:
        return list(self._groups.get(group_id, []))

    def all(self) -> Iterator[SequenceState]:
        for members in list(self._groups.values()):
            yield from members

    def forget(self, seq: SequenceState) -> bool:
        """Drop a finished or cancelled sequence; False if it was not live."""
        if seq.uid is None or seq.uid not in self._by_uid:
            return False
        group_id, _ = self._by_uid.pop(seq.uid)
        self._slots.discard(seq.slot)
        members = self._groups.get(group_id, [])
        if seq in members:
            members.remove(seq)
        if not members:
            self._groups.pop(group_id, None)
        return True

    def clear(self) -> None:
        self._groups.clear()
        self._by_uid.clear()
        self._slots.clear()

    def snapshot(self) -> list[tuple[int, SequenceState]]:
        """(group id, sequence) of every live sequence, by slot; safe from another thread (one
        copy of a dict, atomic under the GIL), for views such as /slots."""
        return sorted(dict(self._by_uid).values(), key=lambda entry: entry[1].slot)
