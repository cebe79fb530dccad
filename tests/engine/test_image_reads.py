"""The model's processor reads a request's images on a thread of its own
(sequences/image_reads.py): a text stream in the batch keeps stepping while it does, and the
request with the image is answered once they are read. A processor made slow here (a sleep
before the real one, as a large image takes on a slow machine) would hold the stream for all of
it on the engine thread."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import replace

import pytest

from mlxserve.engine import Engine, GenerationRequest, StopSpec
from mlxserve.sampling.params import SamplingParams
from mlxserve.vision.folder import vision_installed

from ..helpers import skip_for_missing
from ..vision_models import build_tiny_qwen2_vl, checkerboard_png

SLOW_READ_S = 1.0  # the processor's time for the image, made long
GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    if not vision_installed():
        skip_for_missing("mlx-vlm is not installed (make install-dev installs it)")
    folder = build_tiny_qwen2_vl(tmp_path_factory.mktemp("models") / "tiny-qwen2-vl")
    engine = Engine(str(folder)).start()
    assert engine.wait_ready(300), engine.error
    yield engine
    engine.stop()


def image_request(tower, max_tokens: int = 4) -> GenerationRequest:
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]}]
    text = tower.processor.tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    return GenerationRequest(
        prompt_ids=(1,),
        max_tokens=max_tokens,
        sampling=GREEDY,
        seed=0,
        stop=StopSpec(ignore_eos=True),
        images=(checkerboard_png((96, 64)),),
        prompt_text=text,
    )


def test_a_stream_steps_while_the_processor_reads_an_image(engine, monkeypatch):
    tower = engine.loaded.vision
    real, reads = tower.read, []

    def slow_read(prompt, images):
        started = time.monotonic()
        time.sleep(SLOW_READ_S)
        prepared = real(prompt, images)
        reads.append((threading.current_thread().name, started, time.monotonic()))
        return prepared

    monkeypatch.setattr(tower, "read", slow_read)
    stream = GenerationRequest(
        prompt_ids=(1, 40, 41, 42),
        max_tokens=100_000,
        sampling=GREEDY,
        seed=0,
        stop=StopSpec(ignore_eos=True),
    )

    async def scenario():
        stamps: list[float] = []  # when each of the stream's events reached this loop

        async def text():
            async for _ in engine.submit([stream]):
                stamps.append(time.monotonic())

        streaming = asyncio.create_task(text())
        while len(stamps) < 8:
            await asyncio.sleep(0.01)
        asked = time.monotonic()
        events = [e async for e in engine.submit([image_request(tower)])]
        answered = time.monotonic()
        streaming.cancel()
        return [t for t in stamps if asked <= t <= answered], events

    stamps, events = asyncio.run(scenario())
    ((thread, started, ended),) = reads
    assert thread.startswith("mlxserve-images")
    assert ended - started >= SLOW_READ_S
    assert events[-1].finish_reason == "length" and events[-1].completion_tokens == 4
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    assert len(stamps) > 10, f"{len(stamps)} tokens while the image request was answered"
    assert max(gaps) < SLOW_READ_S / 2, f"the stream's longest gap {max(gaps):.2f} s"


def test_an_image_the_processor_cannot_read_fails_its_request_only(engine):
    tower = engine.loaded.vision
    broken = replace(image_request(tower), images=(b"\x89PNG\r\n\x1a\n broken",))

    async def scenario():
        failed = [e async for e in engine.submit([broken])]
        answered = [e async for e in engine.submit([image_request(tower)])]
        return failed, answered

    failed, answered = asyncio.run(scenario())
    assert "processor could not read the images" in (failed[-1].error or "")
    assert answered[-1].finish_reason == "length"
