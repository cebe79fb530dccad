"""An engine's inbox: the queue its messages (`messages.py`) wait in for the engine thread."""

from __future__ import annotations

import queue
import threading


class Inbox:
    """An engine's queue of messages; a message wakes the thread the engine runs on."""

    def __init__(self, wake: threading.Event):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = wake

    def put(self, message) -> None:
        self._queue.put(message)
        self._wake.set()

    def get_nowait(self):
        return self._queue.get_nowait()

    def qsize(self) -> int:
        return self._queue.qsize()
