"""Prompts with images prefilled a pass at a time before their group is admitted, so that the
streams in the batch step between the passes (a large image's prompt, read in one go, held them
for all of it).

A group whose requests carry images the prefix cache does not hold waits here, as a group whose
prefixes are read from disk waits (sequences/disk_reads.py). Each engine turn runs one pass of
the oldest job: the vision tower a block at a time, then the language model (mlx-vlm's, at a
cost of its own) over the prompt, as many of its layers over as many of the prompt's tokens as
fit the time a prompt chunk may take beside the streams, at what a layer cost a token in the
passes before. A finished
prompt's KV goes into the prefix cache under its images' key, and the group is admitted: its
sequences start from that KV as from any prefix. Where the prefix cache is off, or the request
asks it not to keep the prompt (`cache_prompt: false`), the KV is handed to the sequence that
starts from it (`VisionTower.hand_over`).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass

from mlx_lm.models.cache import make_prompt_cache

from ..prefix.keeper import PrefixKeeper
from ..scheduling.messages import Group
from ..scheduling.pacing import MAX_CHUNK

log = logging.getLogger("mlxserve.engine")
TIMED_PASSES = 8  # a layer's cost a token is the median over the language model's last passes


@dataclass
class _Job:
    group: Group
    run: object  # vision/tower.PrefillJob
    key: list[int]
    keyed: bool  # its KV goes to the prefix cache (else it is handed to its sequence)


class ImagePrefills:
    """The groups waiting for their images' prefill, oldest first."""

    def __init__(self) -> None:
        self._jobs: deque[_Job] = deque()
        self._waiting: dict[int, int] = {}  # group id -> its jobs not done
        self._layer_costs: deque[float] = deque(maxlen=TIMED_PASSES)  # seconds a layer a token
        self._ready: list[Group] = []  # prefilled, admitted at the next turn

    def __len__(self) -> int:
        return len(self._jobs) + len(self._ready)

    def start(self, group: Group, loaded, prefixes: PrefixKeeper) -> bool:
        """Queue a job for each of the group's prompts with images not yet in the prefix cache
        (one for choices sharing a prompt). Whether the group waits for any."""
        vision = loaded.vision
        if vision is None:
            return False
        seen: set[tuple[int, ...]] = set()
        for request in group.requests:
            if not request.images or request.prompt_logprobs:
                continue
            prepared = vision.prepare(request.prompt_text, list(request.images))
            keyed = request.cache_prompt and prefixes.enabled
            if tuple(prepared.key) in seen or (keyed and vision.known_shift(prepared) is not None):
                continue  # prefilled before: the prefix cache may hold it
            seen.add(tuple(prepared.key))
            job = vision.prefill_in_passes(prepared, lambda: make_prompt_cache(loaded.model))
            self._jobs.append(_Job(group, job, prepared.key, keyed))
            self._waiting[group.group_id] = self._waiting.get(group.group_id, 0) + 1
        return group.group_id in self._waiting

    def step(self, budget_s: float | None, first: int, prefixes: PrefixKeeper) -> list[Group]:
        """One pass of the oldest job: as many layers over as many prompt tokens as fit
        `budget_s` at the cost a layer took a token in the passes before (before any was timed:
        the whole model over `first`, the calibrated chunk, fits it; None: no bound); the
        groups whose jobs are all done (to admit now). A job that raises fails its group. A group
        whose last pass ran is admitted at the next turn, in place of a pass: the step it joins
        in reads its last token beside the decode, and the two in one turn held the streams
        for both."""
        if self._ready:
            ready, self._ready = self._ready, []
            return ready
        if not self._jobs:
            return []
        job = self._jobs[0]
        tokens, layers = MAX_CHUNK, None
        if budget_s is not None:
            tokens, layers = self._pass_size(job.run, budget_s, first)
        started = time.perf_counter()
        try:
            done = job.run.advance(tokens, layers)
        except Exception as error:
            log.exception("prefilling a prompt with images failed")
            self.drop_group(job.group.group_id)
            job.group.fail(f"reading the images failed: {type(error).__name__}: {error}")
            return []
        took = time.perf_counter() - started
        if job.run.last_pass is not None:  # a pass of the language model: what a layer costs
            passed, over = job.run.last_pass
            self._layer_costs.append(took / (passed * over))
        log.debug(
            "image prefill pass: %s layers x prompt tokens, %.1f ms (budget %s)",
            job.run.last_pass,
            took * 1000,
            "none" if budget_s is None else f"{budget_s * 1000:.1f} ms",
        )
        if not done:
            return []
        self._jobs.popleft()
        prefilled = job.run.result
        if job.keyed:
            prefixes.keep(job.key[: len(prefilled.tokens) - 1], prefilled.cache)
        else:  # no prefix cache to find it in: its sequence takes it from the tower
            job.run.tower.hand_over(job.key, prefilled)
        group_id = job.group.group_id
        self._waiting[group_id] -= 1
        if self._waiting[group_id]:
            return []
        del self._waiting[group_id]
        self._ready.append(job.group)
        return []

    def _pass_size(self, run, budget_s: float, first: int) -> tuple[int, int]:
        """(the tokens of a new chunk, the layers of this pass) that fit `budget_s`: a chunk as
        long as one layer over it fits, then as many of its layers as fit."""
        costs = sorted(self._layer_costs)
        layer_s = costs[len(costs) // 2] if costs else budget_s / (max(1, first) * run.layer_count)
        tokens = run.chunk_tokens or max(1, min(MAX_CHUNK, int(budget_s / layer_s)))
        return tokens, max(1, int(budget_s / (layer_s * tokens)))

    def drop_group(self, group_id: int) -> int:
        """Forget a cancelled (or failed) group's jobs; its requests' count."""
        ready = [g for g in self._ready if g.group_id == group_id]
        if ready:
            self._ready = [g for g in self._ready if g.group_id != group_id]
            return len(ready[0].requests)
        jobs = [j for j in self._jobs if j.group.group_id == group_id]
        if not jobs:
            return 0
        self._jobs = deque(j for j in self._jobs if j.group.group_id != group_id)
        self._waiting.pop(group_id, None)
        return len(jobs[0].group.requests)

    def take_all(self) -> list[Group]:
        """Every waiting group (to fail: the engine restarts or stops)."""
        groups = list({id(g): g for g in [*self._ready, *(j.group for j in self._jobs)]}.values())
        self._jobs.clear()
        self._waiting.clear()
        self._ready.clear()
        return groups
