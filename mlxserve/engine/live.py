"""The sequences in the batch, found by group (one HTTP request's prompts x best_of, cancelled
together) and by batch row (mlx-lm's uid, which each decoded token carries)."""

from __future__ import annotations

from collections.abc import Iterator

from .sequence import SequenceState


class LiveSequences:
    def __init__(self) -> None:
        self._groups: dict[int, list[SequenceState]] = {}
        self._by_uid: dict[int, tuple[int, SequenceState]] = {}

    def __len__(self) -> int:
        return len(self._by_uid)

    def add(self, group_id: int, seq: SequenceState) -> None:
        """A sequence that got a batch row (one without a row never runs)."""
        if seq.uid is not None:
            self._groups.setdefault(group_id, []).append(seq)
            self._by_uid[seq.uid] = (group_id, seq)

    def get(self, uid: int) -> SequenceState | None:
        entry = self._by_uid.get(uid)
        return None if entry is None else entry[1]

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
        members = self._groups.get(group_id, [])
        if seq in members:
            members.remove(seq)
        if not members:
            self._groups.pop(group_id, None)
        return True

    def clear(self) -> None:
        self._groups.clear()
        self._by_uid.clear()
