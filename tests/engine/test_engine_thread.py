"""Several engines on one EngineThread (scheduling/thread.py): each model's sequences come out
exactly as they do alone, while both batches run; one engine stops without the other."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

from mlxserve.engine import Engine

from .test_engine import collect, request, token_ids


def test_two_models_on_one_thread_each_answer_as_alone(tiny_model, tiny_models_dir):
    first = Engine(str(tiny_model)).start()
    second = Engine(str(tiny_models_dir / "tiny2"), thread=first.thread).start()
    try:
        assert first.wait_ready(300) and second.wait_ready(300), (first.error, second.error)
        assert first.thread.engines == [first, second]
        long = request(max_tokens=120)

        async def alone(engine):
            return token_ids((await collect(engine, [long]))[0])

        async def together():
            return await asyncio.gather(collect(first, [long]), collect(second, [long]))

        solo = (asyncio.run(alone(first)), asyncio.run(alone(second)))
        assert solo[0] != solo[1]  # two models, two answers
        peak_before = first.stats.peak_batch, second.stats.peak_batch
        overlap, done = [], threading.Event()

        def watch() -> None:
            while not done.is_set():
                overlap.append(first.stats.active_sequences and second.stats.active_sequences)
                time.sleep(0.001)

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            both = asyncio.run(together())
        finally:
            done.set()
            watcher.join()
        assert (token_ids(both[0][0]), token_ids(both[1][0])) == solo
        assert any(overlap), "the two models' sequences never ran at the same time"
        # each engine batched its own row only: the models did not share a batch
        assert (first.stats.peak_batch, second.stats.peak_batch) == peak_before == (1, 1)
    finally:
        second.stop()
        assert second.state == "stopped"
    try:
        assert first.thread.engines == [first]
        assert token_ids(asyncio.run(collect(first, [request()]))[0])  # the thread goes on
    finally:
        first.stop()
    assert first.thread.engines == []


def test_a_running_stream_goes_on_while_another_model_loads(
    tiny_model, tiny_models_dir, monkeypatch
):
    """A load on the shared thread reads its weights a slice at a time and times its passes
    one by one; the other models' running sequences step between them."""
    from mlxserve.engine.models import host as model_host

    monkeypatch.setattr(model_host, "LOAD_SLICE_BYTES", 32 << 10)  # the tiny model in slices
    first = Engine(str(tiny_model)).start()
    second = None
    try:
        assert first.wait_ready(300), first.error
        stamps: list[float] = []
        loaded: list[float] = []  # when the second model was ready

        async def stream() -> None:
            """Streams one after another (a slow machine's load outlasts one), each a token a
            step (drafts would end it sooner), until a token comes after the load."""
            while not (loaded and stamps[-1] > loaded[0]):
                request_ = request(max_tokens=1500, num_draft_tokens=0)
                async with contextlib.aclosing(first.submit([request_])) as events:
                    async for event in events:
                        if event.token_ids:
                            stamps.append(time.monotonic())
                        if loaded and stamps and stamps[-1] > loaded[0]:
                            break

        streaming = threading.Thread(target=lambda: asyncio.run(stream()))
        streaming.start()
        assert wait_for(lambda: len(stamps) >= 10)
        began = time.monotonic()
        second = Engine(str(tiny_models_dir / "tiny2"), thread=first.thread).start()
        assert second.wait_ready(300), second.error
        loaded.append(time.monotonic())
        streaming.join(300)
        assert not streaming.is_alive()
        during = [t for t in stamps if began < t < loaded[0]]
        assert len(during) >= 10, (len(during), loaded[0] - began)
    finally:
        if second is not None:
            second.stop()
        first.stop()


def wait_for(condition, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.005)
    return condition()
