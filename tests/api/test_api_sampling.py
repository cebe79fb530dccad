"""Stops, token bans, penalties and seeds, through the HTTP API on the tiny model."""

from __future__ import annotations

import concurrent.futures
from collections import Counter

from ..device_numerics import needs_batch_invariance
from ..helpers import BatchSizes, complete, texts

PROMPT = "for i in range(10):\n   "


def greedy(http, **extra) -> dict:
    return complete(http, prompt=PROMPT, max_tokens=40, temperature=0, ignore_eos=True, **extra)


def a_generated_substring(text: str) -> str:
    """Three characters from the middle of a generated text: a stop string the model will emit."""
    for start in range(len(text) // 3, len(text) - 3):
        candidate = text[start : start + 3]
        if candidate.strip() and "\ufffd" not in candidate:
            return candidate
    raise AssertionError(f"no usable substring in {text!r}")


def test_stop_string_ends_text_before_it(http):
    full = texts(greedy(http))[0]
    stop = a_generated_substring(full)
    result = greedy(http, stop=stop)
    choice = result["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert stop not in choice["text"]
    assert choice["text"] == full[: full.index(stop)]


def test_earliest_of_several_stop_strings_wins(http):
    full = texts(greedy(http))[0]
    late = full[-3:]
    early = a_generated_substring(full)
    result = greedy(http, stop=[late, early, "never-appears-xyz"])
    assert texts(result)[0] == full[: min(full.index(early), full.index(late))]


def test_include_stop_str_in_output_keeps_the_stop(http):
    full = texts(greedy(http))[0]
    stop = a_generated_substring(full)
    result = greedy(http, stop=stop, include_stop_str_in_output=True)
    assert texts(result)[0] == full[: full.index(stop) + len(stop)]


def test_stop_token_id_stops_and_adds_no_text(http):
    forced = 300
    result = complete(
        http, prompt=PROMPT, max_tokens=10, logit_bias={str(forced): 100}, stop_token_ids=[forced]
    )
    choice = result["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["text"] == ""
    assert result["usage"]["completion_tokens"] == 1


def test_min_tokens_holds_off_stop_tokens(http):
    forced = 300
    result = complete(
        http,
        prompt=PROMPT,
        max_tokens=10,
        logit_bias={str(forced): 100},
        stop_token_ids=[forced],
        min_tokens=4,
    )
    assert result["choices"][0]["finish_reason"] == "stop"
    assert result["usage"]["completion_tokens"] == 5  # 4 other tokens, then the stop token


def test_eos_stops_unless_ignore_eos(http, tokenizer):
    eos = str(tokenizer.eos_token_id)
    stopped = complete(http, prompt=PROMPT, max_tokens=10, logit_bias={eos: 100})
    assert stopped["choices"][0]["finish_reason"] == "stop"
    assert stopped["usage"]["completion_tokens"] == 1
    ignored = complete(http, prompt=PROMPT, max_tokens=10, logit_bias={eos: 100}, ignore_eos=True)
    assert ignored["choices"][0]["finish_reason"] == "length"
    assert ignored["usage"]["completion_tokens"] == 10


def test_min_tokens_holds_off_eos(http, tokenizer):
    eos = str(tokenizer.eos_token_id)
    result = complete(http, prompt=PROMPT, max_tokens=10, logit_bias={eos: 100}, min_tokens=3)
    assert result["usage"]["completion_tokens"] == 4
    assert result["choices"][0]["finish_reason"] == "stop"


def test_logit_bias_minus_100_bans_and_plus_100_forces(http, tokenizer):
    first = greedy(http, logprobs=0)["choices"][0]["logprobs"]["tokens"][0]
    first_id = tokenizer.encode(PROMPT + first)[-1]
    banned = greedy(http, logprobs=0, logit_bias={str(first_id): -100})
    assert banned["choices"][0]["logprobs"]["tokens"][0] != first
    forced_text = tokenizer.decode([500])
    forced = complete(http, prompt=PROMPT, max_tokens=5, logit_bias={"500": 100}, ignore_eos=True)
    assert forced_text and forced_text in texts(forced)[0]


def test_allowed_token_ids_restrict_every_token(http, tokenizer):
    allowed = [400, 401, 402]
    allowed_texts = {tokenizer.decode([t]).strip() for t in allowed}
    result = complete(
        http,
        prompt=PROMPT,
        max_tokens=10,
        allowed_token_ids=allowed,
        logprobs=5,
        seed=2,
        ignore_eos=True,
    )
    lp = result["choices"][0]["logprobs"]
    assert {t.strip() for t in lp["tokens"]} <= allowed_texts
    assert all(len(top) <= 3 for top in lp["top_logprobs"])  # banned tokens are no alternatives


def count_repeats(tokens: list[str]) -> int:
    return len(tokens) - len(set(tokens))


def test_penalties_break_a_greedy_loop(http):
    """A random model's greedy output loops on one token; every penalty makes that token rarer
    (presence_penalty, charged once, may move the loop to another token: that still counts)."""
    plain = greedy(http, logprobs=0)["choices"][0]["logprobs"]["tokens"]
    assert count_repeats(plain) > 10
    looped = Counter(plain).most_common(1)[0][0]
    for penalty in (
        {"repetition_penalty": 1.8},
        {"repeat_penalty": 1.8},
        {"frequency_penalty": 2.0},
        {"presence_penalty": 2.0},
    ):
        penalised = greedy(http, logprobs=0, **penalty)["choices"][0]["logprobs"]["tokens"]
        assert penalised.count(looped) < plain.count(looped), penalty


def test_repeat_last_n_zero_turns_penalties_off(http):
    assert texts(greedy(http, repetition_penalty=1.8, repeat_last_n=0)) == texts(greedy(http))


def test_penalty_window_counts_the_prompt(http):
    """Penalties see the prompt (llama.cpp): the very first token's distribution already changes.

    Were only generated tokens counted (OpenAI's reading), nothing would be penalised yet.
    """
    body = dict(prompt=PROMPT, max_tokens=1, temperature=0, logprobs=1)
    first = complete(http, **body)["choices"][0]["logprobs"]["token_logprobs"][0]
    penalised = complete(http, **body, presence_penalty=2.0)
    assert penalised["choices"][0]["logprobs"]["token_logprobs"][0] != first
    outside = complete(http, **body, presence_penalty=2.0, repeat_last_n=0)
    assert outside["choices"][0]["logprobs"]["token_logprobs"][0] == first


def test_temperature_zero_is_greedy_and_top_k_one_matches_it(http):
    assert texts(greedy(http)) == texts(greedy(http))
    top1 = complete(
        http, prompt=PROMPT, max_tokens=40, temperature=1.0, top_k=1, seed=9, ignore_eos=True
    )
    assert texts(top1) == texts(greedy(http))


def test_same_seed_same_text_other_seed_other_text(http):
    body = dict(prompt=PROMPT, max_tokens=24, temperature=1.0, ignore_eos=True)
    a = texts(complete(http, seed=1234, **body))
    assert a == texts(complete(http, seed=1234, **body))
    assert a != texts(complete(http, seed=4321, **body))


@needs_batch_invariance
def test_seed_gives_the_same_text_alone_or_beside_other_requests(http, server):
    body = dict(prompt=PROMPT, max_tokens=48, temperature=0.9, top_p=0.95, seed=77, ignore_eos=True)
    alone = texts(complete(http, **body))
    others = [
        dict(
            prompt="import sys\n" * (i + 1),
            max_tokens=48 + 8 * i,
            temperature=1.0 + 0.1 * i,
            top_k=20 * (i + 1),
            seed=i,
            ignore_eos=True,
        )
        for i in range(3)
    ]
    with BatchSizes(server.engine) as batch:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(complete, http, **o) for o in others]
            together = pool.submit(complete, http, **body)
            concurrent.futures.wait(futures)
            assert texts(together.result()) == alone
    assert batch.largest >= 2, batch.largest


def test_requests_sampling_alike_draw_together_as_each_alone(http, server):
    """Rows with the same sampler chain run it as one graph in the batch; each still draws with
    its own seed's key, and rows banning EOS (ignore_eos) are banned together."""
    alike = dict(prompt=PROMPT, max_tokens=32, temperature=0.8, top_p=0.95, top_k=40)
    requests = [dict(alike, seed=s, ignore_eos=s % 2 == 0) for s in range(4)]
    requests += [dict(alike, temperature=0, ignore_eos=True), dict(alike, seed=9, min_p=0.1)]
    alone = [texts(complete(http, **r)) for r in requests]
    assert len({tuple(t) for t in alone[:4]}) == 4  # the seeds draw differently
    with BatchSizes(server.engine) as batch:
        with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
            together = list(pool.map(lambda r: texts(complete(http, **r)), requests))
    assert together == alone
    assert batch.largest >= 3, batch.largest


def test_top_p_and_min_p_narrow_the_choice(http):
    body = dict(prompt=PROMPT, max_tokens=30, temperature=1.5, seed=5, ignore_eos=True, logprobs=0)
    wide = complete(http, **body)["choices"][0]["logprobs"]["token_logprobs"]
    for narrowing in ({"top_p": 0.05}, {"min_p": 0.9}):
        narrow = complete(http, **body, **narrowing)["choices"][0]["logprobs"]["token_logprobs"]
        # Only the most likely tokens survive: their logprobs are higher on average.
        assert sum(narrow) / len(narrow) > sum(wide) / len(wide), narrowing
