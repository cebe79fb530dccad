"""Prompts with images through the model's processor on a thread of its own, before their
prefill.

The processor decodes each image, resizes and normalises it, tens of milliseconds an image: run
on the engine thread, in the turn that admits the request, it held every stream in the batch
for all of it. Here it runs on a reader thread (MLX gives each thread a default stream of its
own, so the arrays it makes are evaluated there, beside the batch's passes), and the group comes
back through the engine's inbox (`ImagesRead`) to be prefilled a pass a turn (image_prefill.py).
A distributed engine reads them on its own thread as before: its ranks must admit in step.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from ..requests import INVALID_IMAGE
from ..scheduling.messages import Group, ImagesRead

log = logging.getLogger("mlxserve.engine")


class ImageReads:
    """The groups whose images the reader thread is reading, by id."""

    def __init__(self) -> None:
        self._reading: dict[int, Group] = {}
        self._reader: ThreadPoolExecutor | None = None  # started at the first read

    @property
    def reading(self) -> bool:
        """A group waits for its images (no model change meanwhile: the reader uses it)."""
        return bool(self._reading)

    def start(self, group: Group, vision, post: Callable[[ImagesRead], None]) -> bool:
        """Read the group's prompts with images that `vision` (the model's VisionTower) has not
        read yet, on the reader thread, then `post` them (to the engine's inbox). Whether the
        group waits for them."""
        asked = {
            (request.prompt_text, tuple(request.images))
            for request in group.requests
            if request.images
        }
        unread = [(text, images) for text, images in asked if not vision.has_read(text, images)]
        if not unread:
            return False
        self._reading[group.group_id] = group
        if self._reader is None:
            self._reader = ThreadPoolExecutor(1, thread_name_prefix="mlxserve-images")

        def read() -> None:
            try:
                done = [(text, images, vision.read(text, list(images))) for text, images in unread]
            except Exception as error:
                log.exception("could not read a request's images")
                post(ImagesRead(group.group_id, error=f"{type(error).__name__}: {error}"))
                return
            post(ImagesRead(group.group_id, done))

        self._reader.submit(read)
        return True

    def arrived(self, message: ImagesRead, vision) -> Group | None:
        """A group's images read: the tower keeps them, for its prefill and its sequences; the
        group (to admit), or None where it was cancelled meanwhile, or its images could not be
        read (it is failed)."""
        group = self._reading.pop(message.group_id, None)
        if group is None or vision is None:
            return None
        if message.error is not None:
            group.fail(
                f"the model's processor could not read the images: {message.error}",
                code=INVALID_IMAGE,
            )
            return None
        for prompt, images, prepared in message.read:
            vision.keep(prompt, images, prepared)
        return group

    def drop_group(self, group_id: int) -> int:
        """Forget a cancelled group; its requests' count."""
        group = self._reading.pop(group_id, None)
        return len(group.requests) if group is not None else 0

    def take_all(self) -> list[Group]:
        """Every group waiting for its images (to fail: the model is unloaded or the engine
        stops)."""
        groups, self._reading = list(self._reading.values()), {}
        return groups

    def close(self) -> None:
        """Stop the reader thread, after the read it is running (if any)."""
        if self._reader is not None:
            self._reader.shutdown(wait=True, cancel_futures=True)
            self._reader = None
