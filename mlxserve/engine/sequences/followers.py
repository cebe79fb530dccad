"""Choices of one request that share a prompt (n, best_of) wait for the first one's prefill,
then start from its KV in the prefix cache instead of prefilling the same prompt again."""

from __future__ import annotations

from dataclasses import dataclass

from ..requests import GenerationRequest
from ..scheduling.messages import Group


@dataclass
class Follower:
    """A choice whose prompt another choice of its group is prefilling."""

    group: Group
    index: int
    request: GenerationRequest


class Followers:
    """Waiting choices, by the batch row (uid) of the choice prefilling their prompt."""

    def __init__(self):
        self._by_leader: dict[int, list[Follower]] = {}

    def __bool__(self) -> bool:
        return bool(self._by_leader)

    def wait(self, leader_uid: int, follower: Follower) -> None:
        self._by_leader.setdefault(leader_uid, []).append(follower)

    def waiting_for(self, leader_uid: int) -> bool:
        return leader_uid in self._by_leader

    def move(self, old_uid: int, new_uid: int) -> None:
        """The leader's prompt starts again under a new batch row (a failed step)."""
        if old_uid in self._by_leader:
            self._by_leader[new_uid] = self._by_leader.pop(old_uid)

    def release(self, leader_uid: int) -> list[Follower]:
        """The choices to start now that the leader's prompt is prefilled."""
        return self._by_leader.pop(leader_uid, [])

    def drop_group(self, group_id: int) -> int:
        """Forget a cancelled group's waiting choices; how many there were."""
        dropped = 0
        for leader, followers in list(self._by_leader.items()):
            kept = [f for f in followers if f.group.group_id != group_id]
            dropped += len(followers) - len(kept)
            if kept:
                self._by_leader[leader] = kept
            else:
                del self._by_leader[leader]
        return dropped

    def take_all(self) -> list[Follower]:
        """Every waiting choice, forgotten here (the batch failed)."""
        followers = [f for waiting in self._by_leader.values() for f in waiting]
        self._by_leader.clear()
        return followers
