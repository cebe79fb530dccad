"""The prefix KV cache: later prompts sharing a token prefix start from stored KV."""

from __future__ import annotations

import json

from ..helpers import complete, stream_chunks, streamed_texts, texts

# Long enough that reuse matters, unique to this file so other tests' requests cannot warm it.
LONG_PREFIX = "".join(
    f"def prefix_cache_case_{i}(value):\n    return value * {i}\n\n" for i in range(40)
)


def cached(result: dict) -> int:
    return result["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_a_repeated_prompt_reuses_its_prefix_and_writes_the_same(http):
    body = {"prompt": LONG_PREFIX + "x = 1\n", "max_tokens": 12, "temperature": 0}
    first = complete(http, **body)
    cold = complete(http, **body, cache_prompt=False)
    warm = complete(http, **body)
    assert cached(first) < 10 and cached(cold) == 0  # (other tests' prompts share a few tokens)
    prompt_tokens = warm["usage"]["prompt_tokens"]
    assert cached(warm) == prompt_tokens - 1  # all but the last prompt token
    assert texts(warm) == texts(cold) == texts(first)


def test_a_prompt_sharing_only_a_prefix_reuses_that_part(http, tokenizer):
    complete(http, prompt=LONG_PREFIX + "y = 2\n", max_tokens=4, temperature=0)
    other = LONG_PREFIX + "def something_else():\n    pass\n"
    result = complete(http, prompt=other, max_tokens=4, temperature=0, seed=3)
    shared = len(tokenizer.encode(LONG_PREFIX)) - 2  # the tokens at the seam may differ
    assert cached(result) >= shared
    fresh = complete(http, prompt=other, max_tokens=4, temperature=0, seed=3, cache_prompt=False)
    assert cached(fresh) == 0
    assert texts(fresh) == texts(result)


def test_seeded_sampling_is_the_same_from_cache(http):
    body = {"prompt": LONG_PREFIX + "z = 3\n", "max_tokens": 16, "seed": 11, "n": 3}
    cold = complete(http, **body)
    warm = complete(http, **body)
    assert cached(warm) > 0
    assert texts(warm) == texts(cold)


def test_streamed_usage_reports_cached_tokens(http):
    body = {"prompt": LONG_PREFIX + "w = 4\n", "max_tokens": 6, "temperature": 0}
    complete(http, **body)
    chunks = stream_chunks(http, **body, stream_options={"include_usage": True})
    usage = [c for c in chunks if isinstance(c, dict) and c.get("usage")][-1]["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] > 0
    assert streamed_texts(chunks)[0] == texts(complete(http, **body, cache_prompt=False))[0]


def test_engine_counts_hits(server, http):
    before = server.engine.stats.prefix_hits
    body = {"prompt": LONG_PREFIX + "v = 5\n", "max_tokens": 2, "temperature": 0}
    complete(http, **body)
    complete(http, **body)
    assert server.engine.stats.prefix_hits > before
    assert server.engine.stats.prefix_cache_bytes > 0


def test_choices_of_one_prompt_share_its_prefill(server, http):
    prompt = "".join(f"shared_prefill_{i} = {i} * {i}\n" for i in range(60))  # seen nowhere else
    body = {"prompt": prompt, "max_tokens": 8, "seed": 5, "n": 4}
    reused = server.engine.stats.prefix_reused_tokens
    shared = complete(http, **body)
    alone = complete(http, **body, cache_prompt=False)
    prompt_tokens = shared["usage"]["prompt_tokens"]
    # Choices 2-4 started from choice 1's KV: all but the last prompt token each, or all but the
    # last two, read again beside choice 1's decoding so that they ride in its decode pass
    assert cached(shared) in (prompt_tokens - 1, prompt_tokens - 2)
    assert server.engine.stats.prefix_reused_tokens - reused >= 3 * (prompt_tokens - 1)
    assert texts(shared) == texts(alone)


def test_a_running_sequences_prompt_is_reused_before_it_ends(server, http):
    prompt = "".join(f"running_prefix_{i} = {i} + {i}\n" for i in range(50))  # seen nowhere else
    body = {"prompt": prompt, "max_tokens": 1000, "ignore_eos": True, "temperature": 0}
    with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as running:
        assert running.status_code == 200, running.read()
        events = (
            json.loads(line[6:]) for line in running.iter_lines() if line.startswith("data: ")
        )
        next(events)  # decoding now
        result = complete(http, prompt=prompt + "tail = 0\n", max_tokens=2, temperature=0)
        assert next(events)["choices"][0]["finish_reason"] is None  # and still going
    assert cached(result) >= len(server.engine.loaded.tokenizer.encode(prompt)) - 2
