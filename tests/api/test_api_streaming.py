"""Streaming (SSE), usage chunks, client disconnects, concurrency and long streams."""

from __future__ import annotations

import concurrent.futures
import json
import socket
import time
from urllib.parse import urlsplit

import httpx
import pytest

from ..conftest import LONG_STREAM_SECONDS
from ..helpers import BatchSizes, complete, stream_chunks, streamed_texts, texts, wait_until

PROMPT = "def main():\n    "


def test_stream_text_equals_the_non_streamed_text(http):
    body = dict(prompt=PROMPT, max_tokens=30, seed=42, ignore_eos=True)
    chunks = stream_chunks(http, **body)
    assert chunks[-1] == "[DONE]"
    assert all(c["object"] == "text_completion" for c in chunks[:-1])
    assert streamed_texts(chunks)[0] == texts(complete(http, **body))[0]
    finals = [ch for c in chunks[:-1] for ch in c["choices"] if ch["finish_reason"]]
    assert [f["finish_reason"] for f in finals] == ["length"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"


def test_unicode_line_breaks_in_the_text_stay_inside_their_event(http):
    """Readers that split a stream with str.splitlines (httpx's iter_lines, as here) would cut an
    event at a raw U+2028, U+2029 or U+0085; they go out \\u-escaped, as Go (Ollama) sends the
    first two. The constraint makes the model write all three."""
    text = "a\u2028b\u0085c\u2029d"
    schema = {"type": "string", "enum": [text]}
    chunks = stream_chunks(http, prompt="x", max_tokens=40, json_schema=schema)
    assert json.loads(streamed_texts(chunks)[0]) == text
    events = []
    body = {
        "input": "x",
        "max_output_tokens": 40,
        "stream": True,
        "text": {"format": {"type": "json_schema", "name": "s", "schema": schema}},
    }
    with http.stream("POST", "/v1/responses", json=body) as response:
        events = [json.loads(line[6:]) for line in response.iter_lines() if line[:6] == "data: "]
    assert json.loads(events[-1]["response"]["output"][0]["content"][0]["text"]) == text


def test_stream_with_n_and_several_prompts_finishes_every_choice(http):
    body = dict(prompt=["a = ", "b = "], n=2, max_tokens=8, seed=3, ignore_eos=True)
    chunks = stream_chunks(http, **body)
    finished = sorted(
        ch["index"] for c in chunks[:-1] for ch in c["choices"] if ch["finish_reason"]
    )
    assert finished == [0, 1, 2, 3]
    assert streamed_texts(chunks) == dict(enumerate(texts(complete(http, **body))))


def test_include_usage_adds_a_last_chunk_with_empty_choices(http):
    chunks = stream_chunks(
        http,
        prompt=PROMPT,
        max_tokens=6,
        ignore_eos=True,
        n=2,
        stream_options={"include_usage": True},
    )
    usage_chunk = chunks[-2]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["completion_tokens"] == 12
    assert usage_chunk["usage"]["total_tokens"] == (usage_chunk["usage"]["prompt_tokens"] + 12)
    assert all("usage" not in c for c in chunks[:-2])


def test_openai_client_streams(client):
    stream = client.completions.create(
        model="tiny",
        prompt=PROMPT,
        max_tokens=10,
        stream=True,
        seed=8,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert chunks[-1].usage.completion_tokens == 10
    whole = client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=10, seed=8, extra_body={"ignore_eos": True}
    )
    assert text == whole.choices[0].text


def test_streamed_logprobs_match_the_non_streamed_ones(http):
    body = dict(prompt=PROMPT, max_tokens=12, seed=4, logprobs=2, echo=True, ignore_eos=True)
    chunks = stream_chunks(http, **body)
    streamed = {"tokens": [], "token_logprobs": [], "text_offset": []}
    for chunk in chunks[:-1]:
        lp = chunk["choices"][0]["logprobs"]
        for key in streamed:
            streamed[key] += lp[key]
    whole = complete(http, **body)["choices"][0]
    for key in streamed:
        assert streamed[key] == pytest.approx(whole["logprobs"][key], abs=1e-5), key
    assert streamed_texts(chunks)[0] == whole["text"]
    assert whole["text"].startswith(PROMPT)


def test_stop_string_is_never_split_across_chunks(http):
    body = dict(prompt=PROMPT, max_tokens=40, temperature=0, ignore_eos=True)
    full = texts(complete(http, **body))[0]
    stop = full[len(full) // 2 : len(full) // 2 + 4]
    chunks = stream_chunks(http, stop=stop, **body)
    pieces = [c["choices"][0]["text"] for c in chunks[:-1]]
    # Everything streamed is the text before the stop: no chunk ever held part of it.
    assert "".join(pieces) == full[: full.index(stop)]
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"


LONG = dict(prompt=PROMPT, max_tokens=-1, ignore_eos=True, n=8)  # 8 x ~2040 tokens: seconds


def test_disconnected_stream_stops_its_sequences(server):
    stats = server.engine.stats
    cancelled = stats.cancelled_sequences
    with httpx.Client(base_url=server.url, timeout=30) as http:
        with http.stream("POST", "/v1/completions", json={**LONG, "stream": True}) as response:
            lines = response.iter_lines()
            for _ in range(5):
                next(lines)
            assert stats.active_sequences == 8
    assert wait_until(lambda: stats.active_sequences == 0)
    assert stats.cancelled_sequences == cancelled + 8
    steps = stats.decode_steps
    time.sleep(0.3)
    assert stats.decode_steps == steps  # no decode step runs for a client that left


def test_disconnected_non_streaming_request_stops_its_sequences(server):
    """The client leaves once its sequences run (a client's read timeout could fire before a
    loaded machine admits them, and the test would then see nothing to cancel)."""
    stats = server.engine.stats
    cancelled = stats.cancelled_sequences
    address = urlsplit(server.url)
    body = json.dumps(LONG).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {address.netloc}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    with socket.create_connection((address.hostname, address.port), timeout=30) as client:
        client.sendall(head.encode() + body)
        assert wait_until(lambda: stats.active_sequences == 8, 60)
    assert wait_until(lambda: stats.active_sequences == 0)
    assert stats.cancelled_sequences == cancelled + 8
    # The next request is served as usual.
    with httpx.Client(base_url=server.url, timeout=30) as http:
        assert complete(http, prompt=PROMPT, max_tokens=3)["choices"]


def test_concurrent_streams_are_batched_and_all_finish(server):
    def one(seed: int) -> str:
        with httpx.Client(base_url=server.url, timeout=60) as http:
            chunks = stream_chunks(http, prompt=PROMPT, max_tokens=64, seed=seed, ignore_eos=True)
            assert chunks[-1] == "[DONE]"
            return streamed_texts(chunks)[0]

    with BatchSizes(server.engine) as batch:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            results = list(pool.map(one, range(8)))
    assert len(set(results)) == 8
    assert batch.largest >= 4, batch.largest


@pytest.mark.slow
def test_a_stream_longer_than_a_minute_ends_with_done(smollm2_server, long_stream):
    """Quart cuts responses at 60 s by default (RESPONSE_TIMEOUT): ours must run to [DONE].
    A stream from a slow engine (conftest.py's long_stream), begun with the SmolLM2 server so
    that its minute passes beside the tests on that server."""
    stream = long_stream.join()
    elapsed = stream.elapsed_s
    assert elapsed > max(61, 0.8 * LONG_STREAM_SECONDS), f"the stream took only {elapsed:.0f} s"
    assert stream.chunks[-1] == "[DONE]"
    assert stream.chunks[-2]["choices"][0]["finish_reason"] == "length"
