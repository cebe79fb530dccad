"""Names a client sends that the server notes in its log once per process (a model name it
answers for, a field it ignores): bounded, so a client sending ever new names cannot fill it."""

from __future__ import annotations


class FirstSight:
    """Which names are seen for the first time, up to `limit` distinct names."""

    def __init__(self, limit: int = 1000):
        self.limit = limit
        self._seen: set[str] = set()

    def first(self, name: str) -> bool:
        if name in self._seen or len(self._seen) >= self.limit:
            return False
        self._seen.add(name)
        return True
