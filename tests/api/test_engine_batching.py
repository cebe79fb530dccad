"""Continuous batching: concurrent requests with their own seeds and settings, each as if alone."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx

from ..device_numerics import needs_batch_invariance
from ..helpers import BatchSizes, stream_chunks, streamed_texts

SETTINGS = [
    {"temperature": 0.9, "top_k": 40},
    {"temperature": 0.7, "top_p": 0.9},
    {"temperature": 1.1, "min_p": 0.05},
    {"temperature": 0.8, "repetition_penalty": 1.2, "repeat_last_n": 16},
    {"temperature": 0.8, "presence_penalty": 0.5, "frequency_penalty": 0.3},
    {"temperature": 0.8, "dry_multiplier": 0.8},
    {"temperature": 0.8, "mirostat": 2, "mirostat_tau": 4.0},
    {"temperature": 0.8, "typical_p": 0.8},
    {"temperature": 0.0},
    {"temperature": 0.8, "logprobs": 2},
    {"temperature": 0.8, "xtc_probability": 0.5, "xtc_threshold": 0.05},
    {"temperature": 0.8, "top_n_sigma": 1.5},
    {"temperature": 0.8, "guided_regex": "[a-z]{3,12}"},
    {"temperature": 0.8, "n": 2},
    {"temperature": 0.8, "logit_bias": {"5": 5}},
    {"temperature": 0.8, "samplers": "kt", "top_k": 5},
]


def run(url: str, i: int) -> dict[int, str]:
    body = {
        "prompt": f"def concurrent_{i}(x):\n",
        "max_tokens": 24,
        "seed": 100 + i,
        "ignore_eos": True,
        **SETTINGS[i],
    }
    with httpx.Client(base_url=url, timeout=120) as http:
        return streamed_texts(stream_chunks(http, **body))


@needs_batch_invariance
def test_sixteen_concurrent_streams_match_their_solo_runs(server):
    solo = [run(server.url, i) for i in range(len(SETTINGS))]
    with BatchSizes(server.engine) as batch:
        with ThreadPoolExecutor(len(SETTINGS)) as pool:
            together = list(pool.map(lambda i: run(server.url, i), range(len(SETTINGS))))
    for i, (alone, batched) in enumerate(zip(solo, together)):
        assert batched == alone, f"request {i} ({SETTINGS[i]}) differs in a batch"
    assert batch.largest >= 4, batch.largest  # they did run side by side
