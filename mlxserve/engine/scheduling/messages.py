"""What reaches the engine thread through its inbox: typed messages, and the groups they add."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..requests import GenerationEvent, GenerationRequest

_held = threading.local()  # the events of the posts held on this thread, by destination
# Where another process's groups' events go: called with a step's [(group_id, event), ...].
Sink = Callable[[list[tuple[int, GenerationEvent]]], None]


@contextlib.contextmanager
def posted_together() -> Iterator[None]:
    """Hold the events posted on this thread inside the block and hand each loop (or sink) its
    share in one call at the end: the server's loop wakes once per engine step, not once per
    token (each wake-up writes to its self-pipe and queues a callback while the engine thread
    holds the interpreter's lock), and the front process gets one message per step."""
    if getattr(_held, "events", None) is not None:  # already holding: the outer block hands over
        yield
        return
    _held.events = held = {}
    try:
        yield
    finally:
        _held.events = None
        for destination, events in held.items():
            if isinstance(destination, asyncio.AbstractEventLoop):
                with contextlib.suppress(RuntimeError):  # a loop closed meanwhile: cancels follow
                    destination.call_soon_threadsafe(_put_all, events)
            else:
                destination(events)


def _put_all(events: list[tuple[asyncio.Queue, Any]]) -> None:
    for queue, event in events:
        queue.put_nowait(event)


@dataclass
class Group:
    """One submitted request's sequences, and where their events go: a queue on an event loop
    in this process, or a sink to the front process (neither on other ranks)."""

    group_id: int
    requests: Sequence[GenerationRequest]
    loop: asyncio.AbstractEventLoop | None = None
    events: asyncio.Queue | None = None
    sink: Sink | None = None
    disk_read: bool = False  # its prompts' prefixes on disk were looked for (engine thread)
    reading: int = 0  # of those, being read now (engine thread)
    images_processed: bool = False  # its prompts' images went through the processor
    images_read: bool = False  # its prompts' images were prefilled, or found prefilled before
    images_prefilled: bool = False  # ...prefilled for it: its sequences report none cached

    def post(self, event: GenerationEvent) -> None:
        """Hand `event` to the submitter's loop; dropped if nobody can listen any more (ranks
        other than 0, or a loop already closed: its cancel is on the way)."""
        held = getattr(_held, "events", None)
        if self.sink is not None:
            if held is not None:
                held.setdefault(self.sink, []).append((self.group_id, event))
            else:
                self.sink([(self.group_id, event)])
            return
        if self.loop is None or self.loop.is_closed():
            return
        if held is not None:
            held.setdefault(self.loop, []).append((self.events, event))
            return
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # closed between the check and the call
            pass

    def fail(self, message: str, unavailable: bool = False, code: str | None = None) -> None:
        """End every sequence of the group with an error event (`code`: its own, where the
        front answers it otherwise than a 500)."""
        for index in range(len(self.requests)):
            self.post(
                GenerationEvent(index=index, error=message, unavailable=unavailable, code=code)
            )


@dataclass(frozen=True)
class Add:
    group: Group


@dataclass(frozen=True)
class Cancel:
    group_id: int


@dataclass(frozen=True)
class Prefetched:
    """A prefix of one of the group's prompts, read from disk (`PrefixKeeper.prefetch`)."""

    group_id: int
    read: Any  # prefix_disk.Read, or None where nothing could be read


@dataclass(frozen=True)
class ImagesRead:
    """A group's prompts with images through the model's processor (sequences/image_reads.py):
    (prompt, images, vision.tower.Prepared) each, or why they could not be read."""

    group_id: int
    read: list = field(default_factory=list)
    error: str | None = None


@dataclass(frozen=True)
class ModelChanged:
    """The slot has a change pending, or a new idle-unload time: wake the thread to apply it
    (when idle)."""


@dataclass(frozen=True)
class Stop:
    pass
