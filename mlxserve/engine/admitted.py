"""What an engine has admitted and not finished, counted on the event loop's thread for
admission control: submitted groups, and reservations made at admission (a stream's submit
starts only once its response does). The same for an engine in this process and for the front's
stand-in for one in the engine process (ipc/remote.py). No MLX."""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Iterator, Sequence

from .requests import GenerationRequest, kv_tokens

# An admitted request not submitted by then (it failed in between) no longer counts.
RESERVATION_TTL_S = 30.0


class AdmittedWork:
    """Mixed into an engine whose `loaded` has `kv_bytes_per_token` (None while unloaded)."""

    def __init__(self) -> None:
        self.pending_sequences = 0  # submitted and not finished
        self.pending_kv_tokens = 0
        self._reservations: dict[int, tuple[float, int, int]] = {}  # id: (when, sequences, kv)
        self._reservation_ids = itertools.count()

    def reserve(self, requests: Sequence[GenerationRequest]) -> int:
        """Count `requests` as in flight from their admission on (`admitted_sequences`,
        `admitted_kv_tokens`), before `submit` starts them: requests arriving together were
        each admitted as if alone. A reservation never submitted lapses after
        RESERVATION_TTL_S."""
        now = time.monotonic()
        for key, (when, _, _) in list(self._reservations.items()):
            if now - when > RESERVATION_TTL_S:
                del self._reservations[key]
        key = next(self._reservation_ids)
        self._reservations[key] = (now, len(requests), kv_tokens(requests))
        return key

    def release(self, reservation: int | None) -> None:
        """`reserve`'s reservation is being submitted (or given up)."""
        self._reservations.pop(reservation, None)

    @contextlib.contextmanager
    def counted(self, requests: Sequence[GenerationRequest]) -> Iterator[None]:
        """`requests` pending while the block runs (a submitted group, until it ends)."""
        tokens = kv_tokens(requests)
        self.pending_sequences += len(requests)
        self.pending_kv_tokens += tokens
        try:
            yield
        finally:
            self.pending_sequences -= len(requests)
            self.pending_kv_tokens -= tokens

    def awaiting_submission(self) -> bool:
        """A request admitted and not submitted yet (nor lapsed): its model must stay. Safe on
        any thread (the event loop's adds and removes reservations meanwhile)."""
        now = time.monotonic()
        reservations = list(self._reservations.values())  # one step under the GIL
        return any(now - when <= RESERVATION_TTL_S for when, _, _ in reservations)

    @property
    def admitted_sequences(self) -> int:
        return self.pending_sequences + sum(n for _, n, _ in self._reservations.values())

    @property
    def admitted_kv_tokens(self) -> int:
        return self.pending_kv_tokens + sum(t for _, _, t in self._reservations.values())

    def admitted_kv_bytes(self) -> int:
        """KV memory the requests admitted here take (0 without a model)."""
        loaded = self.loaded
        return self.admitted_kv_tokens * loaded.kv_bytes_per_token if loaded is not None else 0
