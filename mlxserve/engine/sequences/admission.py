"""How a group of requests becomes sequences in the batch: its prefixes read from the disk cache
first, its images read by the model's processor and prefilled, then a sequence a request, where
later choices of one prompt (n, best_of) wait to start from the first one's prefill.

Each of those waits is a queue of its own (disk_reads, image_reads, image_prefill, followers);
this is the order they come in, for one engine (its host: slot, batch, prefix cache, live
sequences), on the engine thread.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..models.sources import ModelLoadError
from ..requests import INVALID_IMAGE, GenerationEvent, GenerationRequest
from ..scheduling.messages import Group
from .disk_reads import DiskReads
from .followers import Follower, Followers
from .image_prefill import ImagePrefills
from .image_reads import ImageReads
from .starting import start_sequence
from .state import SequenceState

if TYPE_CHECKING:
    from ..engine import Engine

log = logging.getLogger("mlxserve.engine")


class Admission:
    """An engine's groups on their way into its batch, and the choices waiting for a leader."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.disk_reads = DiskReads()  # groups waiting for their prefixes from disk
        self.image_reads = ImageReads()  # ...for the model's processor to read their images
        self.images = ImagePrefills()  # ...for their images' prefill
        self.followers = Followers()  # choices waiting for their leader's prefill

    @property
    def busy(self) -> bool:
        """Work for the engine's turns: followers to start, images to prefill."""
        return bool(self.followers) or bool(self.images)

    @property
    def adopting(self) -> bool:
        """Prefixes read from disk are still to come into memory, a step's share at a time."""
        return self.disk_reads.adopting

    @property
    def reading(self) -> bool:
        """A read on a thread of its own is under way (the model is in use)."""
        return self.disk_reads.reading or self.image_reads.reading

    def admit(self, group: Group) -> None:
        engine = self.engine
        if engine._failed.defer(group):  # a culprit is sought among the rows in the batch
            return
        slot = engine.slot
        if slot.loaded is None:  # unloaded (idle) while this request was on its way
            try:
                slot.load(slot.source)
            except ModelLoadError as error:
                group.fail(str(error))
                return
        if not group.disk_read and self.disk_reads.start(group, engine.prefixes, engine._inbox.put):
            return  # admitted once its prefixes are in memory; the batch steps on meanwhile
        vision = slot.loaded.vision
        if not group.images_processed and vision is not None and engine.lockstep is None:
            group.images_processed = True
            if self.image_reads.start(group, vision, engine._inbox.put):
                return  # admitted once the processor has read its images (ImagesRead)
        if not group.images_read:
            group.images_read = True
            try:
                if self.images.start(group, slot.loaded, engine.prefixes):
                    return  # admitted once its images are prefilled, a pass a turn
            except Exception as error:
                log.exception("could not read a request's images")
                group.fail(
                    f"the model's processor could not read the images: {error}",
                    code=INVALID_IMAGE,
                )
                return
        self._start_group(group)

    def adopt(self) -> None:
        """What the disk cache read for waiting groups, into memory: a step's share, or all of
        it while no stream waits; a group whose prefixes are all in is admitted."""
        engine = self.engine
        self.disk_reads.adopt(engine.prefixes, lambda: not engine.has_live_sequences, self.admit)

    def prefetched(self, message) -> None:
        """A group's prefixes read from the disk cache (a Prefetched): into memory as `adopt`
        takes them."""
        self.disk_reads.arrived(message)
        self.adopt()

    def images_read(self, message) -> None:
        """The processor's reading of a group's images (an ImagesRead): the group goes on."""
        loaded = self.engine.slot.loaded
        vision = None if loaded is None else loaded.vision
        if (group := self.image_reads.arrived(message, vision)) is not None:
            self.admit(group)

    def image_step(self, budget_s: float | None) -> None:
        """A pass of the oldest prompt with images waiting for its prefill, no longer than
        `budget_s` where streams run; the groups it completes are admitted."""
        engine = self.engine
        first = engine.slot.loaded.prefill_chunk
        for group in self.images.step(budget_s, first, engine.prefixes):
            group.images_prefilled = True
            self.admit(group)

    def release_followers(self, leader_uid: int) -> None:
        """Start the choices that waited for the leader's prompt, now in the prefix cache."""
        engine = self.engine
        for f in self.followers.release(leader_uid):
            try:
                seq = self.start_sequence(f.index, f.request, f.group.post)
            except Exception as error:
                log.exception("could not start a sequence")
                f.group.post(
                    GenerationEvent(index=f.index, error=f"could not start generation: {error}")
                )
                continue
            engine.live.add(f.group.group_id, seq)
        engine.stats.active_sequences = len(engine.live)

    def keep_running_prompt(self, uid: int) -> None:
        """A prompt just prefilled is reusable before its sequence ends: any request sharing it
        starts from a copy, taken a few layers per step, or at once when its waiting choices
        (n, best_of) start from it now."""
        engine = self.engine
        seq = engine.live.get(uid)
        if not engine.prefixes.enabled or seq is None or not seq.request.cache_prompt:
            return
        tokens = engine.generator.running_tokens(uid)
        if tokens is None:  # removed meanwhile
            return
        engine.prefixes.copy_running_prompt(
            engine.generator.decode_batch,
            uid,
            seq.keyed(tokens),
            now=self.followers.waiting_for(uid),
        )

    def keep_checkpoint(self, uid: int) -> None:
        """A prompt segment of row `uid` was read: its state into the prefix cache, where the
        model's caches are kept as checkpoints (prefix/checkpoints.py)."""
        engine = self.engine
        seq = engine.live.get(uid)
        if seq is not None and seq.request.cache_prompt:
            engine.prefixes.keep_checkpoint(engine.generator, uid, seq.keyed)

    def start_sequence(self, index: int, request: GenerationRequest, post) -> SequenceState:
        engine = self.engine
        engine.stats.prompt_tokens += len(request.prompt_ids)
        return start_sequence(
            index, request, post, engine.slot.loaded, engine.generator, engine.prefixes
        )

    def drop_group(self, group_id: int) -> int:
        """A cancelled group's requests still on their way; how many."""
        return (
            self.disk_reads.drop_group(group_id)
            + self.images.drop_group(group_id)
            + self.image_reads.drop_group(group_id)
            + self.followers.drop_group(group_id)
        )

    def fail_all(self, message: str, unavailable: bool = False) -> None:
        """Every request on its way ends with `message` (the disk cache's reads go on)."""
        for f in self.followers.take_all():
            f.group.post(GenerationEvent(index=f.index, error=message, unavailable=unavailable))
        self.fail_images(message, unavailable)

    def fail_images(self, message: str, unavailable: bool = False) -> None:
        """The groups waiting for their images (the model that reads them is gone)."""
        for group in [*self.images.take_all(), *self.image_reads.take_all()]:
            group.fail(message, unavailable)

    def close(self, message: str) -> None:
        """The engine stops: what waits on a read is told `message`, and the image reads'
        thread ends after its read in flight (it evaluates on MLX)."""
        self.disk_reads.fail_all(message)
        for group in self.image_reads.take_all():
            group.fail(message, unavailable=True)
        self.image_reads.close()

    def _start_group(self, group: Group) -> None:
        """A sequence each request (a choice of a prompt already started waits for its
        prefill), all or none."""
        engine = self.engine
        sequences = []
        leaders: dict[tuple[int, ...], SequenceState] = {}
        try:
            for index, request in enumerate(group.requests):
                leader = leaders.get(request.prompt_ids)
                if leader is not None and leader.uid is not None:
                    # Same prompt as an earlier choice (n, best_of): start from its prefill.
                    self.followers.wait(leader.uid, Follower(group, index, request))
                    continue
                seq = self.start_sequence(index, request, group.post)
                sequences.append(seq)
                if self._shares_prefill(request):
                    leaders[request.prompt_ids] = seq
        except Exception as error:
            log.exception("could not start a sequence")
            self.followers.drop_group(group.group_id)
            engine._remove([s for s in sequences if s.uid is not None])
            group.fail(f"could not start generation: {error}")
            return
        for seq in sequences:
            if group.images_prefilled:  # its KV was made for it, not found in the cache
                seq.cached_tokens = 0
            engine.live.add(group.group_id, seq)
        engine.stats.active_sequences = len(engine.live)

    def _shares_prefill(self, request: GenerationRequest) -> bool:
        """Whether later choices of the same prompt should wait for this one's prefill."""
        return (
            self.engine.prefixes.enabled
            and request.cache_prompt
            and not request.prompt_logprobs
            and request.max_tokens > 0
            and len(request.prompt_ids) > 1
        )
