"""A server with quantized KV (--kv-bits) answers as clients use it: grammars, choices sharing a
prompt, logprobs, the prefix cache in memory and on disk across a restart."""

from __future__ import annotations

import re

import httpx
import pytest

from ..device_numerics import skip_without_quantized_attention
from ..helpers import complete, texts

LONG = [3 + (i * 7919) % 900 for i in range(1500)]  # token ids: long enough for the disk


def cached(result: dict) -> int:
    return result["usage"]["prompt_tokens_details"]["cached_tokens"]


def serve(live_servers, model, folder):
    skip_without_quantized_attention(32, 4, 32)
    return live_servers.own(model, kv_bits=4, kv_group_size=32, prefix_cache_dir=folder)


def test_a_quantized_kv_server_serves_grammars_choices_logprobs_and_its_caches(
    live_servers, tiny_model_head32, tmp_path
):
    with serve(live_servers, tiny_model_head32, tmp_path) as server:
        with httpx.Client(base_url=server.url, timeout=120) as http:
            regex = complete(
                http,
                prompt="Answer: ",
                max_tokens=12,
                grammar={"type": "regex", "value": "(ab)+c"},
                seed=1,
            )
            choices = complete(
                http, prompt="Once upon", max_tokens=6, n=2, seed=3, logprobs=2, temperature=0.9
            )
            first = complete(http, prompt=LONG, max_tokens=8, temperature=0)
            again = complete(http, prompt=LONG, max_tokens=8, temperature=0)
    assert re.fullmatch(r"(ab)+c", texts(regex)[0])
    assert len(choices["choices"]) == 2
    for choice in choices["choices"]:
        logprobs = choice["logprobs"]
        assert len(logprobs["token_logprobs"]) == len(logprobs["top_logprobs"]) > 0
        for token, logprob, top in zip(
            logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"]
        ):
            assert 1 <= len(top) <= 3 and top[token] == pytest.approx(logprob)  # 2 and the pick
    assert cached(first) == 0 and cached(again) == len(LONG) - 1
    assert texts(again) == texts(first)
    with serve(live_servers, tiny_model_head32, tmp_path) as server:
        with httpx.Client(base_url=server.url, timeout=120) as http:
            restarted = complete(http, prompt=LONG, max_tokens=8, temperature=0)
    assert cached(restarted) >= 0.9 * len(LONG)
    assert texts(restarted) == texts(first)
