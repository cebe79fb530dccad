"""Groups waiting for what the disk cache holds of their prompts before they are admitted.

A long prompt's KV takes a while to read, which the streams in the batch would wait through: it
is read on the disk store's own thread, then taken into memory a step's share at a time (all at
once while no stream waits), and the group is admitted once every one of its prompts is in.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from ..prefix.keeper import PrefixKeeper
from ..scheduling.messages import Group, Prefetched


class DiskReads:
    def __init__(self) -> None:
        self._reading: dict[int, Group] = {}  # groups waiting for a read, by id
        self._arrived: deque[Prefetched] = deque()  # reads done, to take into memory

    @property
    def reading(self) -> bool:
        """A group waits for a read (no model change meanwhile)."""
        return bool(self._reading)

    @property
    def adopting(self) -> bool:
        """A read is done and not yet in memory."""
        return bool(self._arrived)

    def start(
        self, group: Group, prefixes: PrefixKeeper, post: Callable[[Prefetched], None]
    ) -> bool:
        """Start reading what the disk holds of the group's prompts beyond memory; each read,
        once done, is `post`ed (to the engine's inbox). Whether the group waits for a read."""
        group.disk_read = True
        prompts = {r.prompt_ids for r in group.requests if r.cache_prompt and not r.prompt_logprobs}
        for prompt in prompts:

            def done(read, group_id: int = group.group_id) -> None:
                post(Prefetched(group_id, read))

            group.reading += prefixes.prefetch(list(prompt), done)
        if group.reading:
            self._reading[group.group_id] = group
        return group.reading > 0

    def arrived(self, message: Prefetched) -> None:
        """A read is done: to take into memory (a cancelled group's too: it was read)."""
        self._arrived.append(message)

    def adopt(
        self,
        prefixes: PrefixKeeper,
        everything: Callable[[], bool],
        admit: Callable[[Group], None],
    ) -> None:
        """Take the oldest reads into memory, a step's share of one, or all of them while
        `everything()`; `admit` each group whose prompts are all in."""
        while self._arrived:
            message = self._arrived[0]
            if not prefixes.adopt(message.read, everything=everything()):
                return
            self._arrived.popleft()
            group = self._reading.get(message.group_id)
            if group is None:
                continue
            group.reading -= 1
            if not group.reading:
                del self._reading[message.group_id]
                admit(group)

    def drop_group(self, group_id: int) -> int:
        """Forget a cancelled group; its requests' count."""
        group = self._reading.pop(group_id, None)
        return len(group.requests) if group is not None else 0

    def fail_all(self, message: str) -> None:
        """The server stops: every group still waiting is told so."""
        for group in self._reading.values():
            group.fail(message, unavailable=True)
