"""llama.cpp's sampler set through the API: each changes output, works in a batch, is seeded."""

from __future__ import annotations

import concurrent.futures
import math

import httpx
import pytest

from ..conftest import SLOW_TEST_TIMEOUT_S
from ..device_numerics import needs_batch_invariance
from ..helpers import BatchSizes, complete, texts

PROMPT = "for i in range(10):\n   "
SAMPLED = dict(prompt=PROMPT, max_tokens=40, temperature=1.0, seed=21, ignore_eos=True)

SETTINGS = {
    "typical_p": {"typical_p": 0.3},
    "top_n_sigma": {"top_n_sigma": 0.5},
    "xtc": {"xtc_probability": 1.0, "xtc_threshold": 0.01},
    "dynatemp": {"dynatemp_range": 0.9, "dynatemp_exponent": 2.0},
    "mirostat_v1": {"mirostat": 1, "mirostat_tau": 3.0},
    "mirostat_v2": {"mirostat": 2, "mirostat_tau": 3.0, "mirostat_eta": 0.2},
    "fireworks_mirostat": {"mirostat": 2, "mirostat_target": 3.0, "mirostat_lr": 0.2},
    "samplers_letters": {"samplers": "kt", "top_k": 3},
}


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_each_sampler_changes_output_and_repeats_with_its_seed(http, name):
    plain = texts(complete(http, **SAMPLED))
    first = texts(complete(http, **SAMPLED, **SETTINGS[name]))
    assert first != plain
    assert texts(complete(http, **SAMPLED, **SETTINGS[name])) == first


def test_dry_changes_output_and_repeats_with_its_seed(http):
    """DRY lowers only the tokens that would extend a repeat: a draw changes where one of them
    would have won, which a given seed may never meet in 40 tokens of the tiny model."""
    dry = {"dry_multiplier": 0.8, "dry_allowed_length": 1}
    changed = []
    for seed in range(21, 29):
        body = dict(SAMPLED, seed=seed)
        first = texts(complete(http, **body, **dry))
        assert texts(complete(http, **body, **dry)) == first
        changed.append(first != texts(complete(http, **body)))
    assert any(changed), "DRY changed no seed's output"


def test_fireworks_names_are_mirostat_tau_and_eta(http):
    llamacpp = complete(http, **SAMPLED, mirostat=2, mirostat_tau=3.0, mirostat_eta=0.2)
    fireworks = complete(http, **SAMPLED, mirostat=2, mirostat_target=3.0, mirostat_lr=0.2)
    assert texts(llamacpp) == texts(fireworks)


def test_mirostat_ignores_truncation_samplers(http):
    miro = dict(SAMPLED, mirostat=2, mirostat_tau=3.0)
    assert texts(complete(http, **miro)) == texts(
        complete(http, **miro, top_k=2, top_p=0.1, min_p=0.5, typical_p=0.2)
    )


def test_samplers_list_leaves_out_what_it_does_not_name(http):
    """llama.cpp: a sampler missing from `samplers` does not run (here: top_k)."""
    no_top_k = complete(http, **SAMPLED, top_k=1, samplers=["temperature"])
    assert texts(no_top_k) == texts(complete(http, **SAMPLED))
    names_and_letters = complete(http, **SAMPLED, top_k=3, samplers=["top_k", "temperature"])
    assert texts(names_and_letters) == texts(complete(http, **SAMPLED, top_k=3, samplers="kt"))


def test_samplers_order_matters_for_temperature_before_top_p(http):
    """top_p after a hot temperature keeps more tokens than before it."""
    hot = dict(SAMPLED, temperature=3.0, top_p=0.3, logprobs=0)
    before = complete(http, **hot, samplers=["top_p", "temperature"])
    after = complete(http, **hot, samplers=["temperature", "top_p"])
    assert texts(before) != texts(after)


def test_dry_cuts_repeats_in_greedy_output(http):
    greedy = dict(prompt=PROMPT, max_tokens=60, temperature=0, ignore_eos=True, logprobs=0)
    plain = complete(http, **greedy)["choices"][0]["logprobs"]["tokens"]
    dry = complete(
        http, **greedy, dry_multiplier=2.0, dry_allowed_length=1, dry_sequence_breakers=[]
    )["choices"][0]["logprobs"]["tokens"]
    assert repeated_ngrams(dry, 3) < repeated_ngrams(plain, 3)


def test_dry_penalty_last_n_zero_is_off(http):
    greedy = dict(prompt=PROMPT, max_tokens=30, temperature=0, ignore_eos=True)
    off = complete(http, **greedy, dry_multiplier=2.0, dry_penalty_last_n=0)
    assert texts(off) == texts(complete(http, **greedy))


@needs_batch_invariance
def test_every_sampler_together_in_one_batch_equals_each_alone(http, server):
    requests = [dict(SAMPLED, seed=s, **SETTINGS[name]) for s, name in enumerate(sorted(SETTINGS))]
    alone = [texts(complete(http, **r)) for r in requests]
    with BatchSizes(server.engine) as batch:
        with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
            together = list(pool.map(lambda r: texts(complete(http, **r)), requests))
    assert together == alone
    assert batch.largest >= 3, batch.largest


def repeated_ngrams(tokens: list[str], n: int) -> int:
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return len(grams) - len(set(grams))


@pytest.fixture(scope="module")
def smollm2(smollm2_server):
    with httpx.Client(base_url=smollm2_server.url, timeout=SLOW_TEST_TIMEOUT_S) as http:
        yield http


REPETITIVE = (
    "The cat sat on the mat. The dog sat on the log. The cat sat on the mat. "
    "The dog sat on the log. The cat sat on the mat. The dog sat on the log."
)


@pytest.mark.slow
def test_dry_measurably_cuts_repeated_ngrams_on_a_real_model(smollm2):
    body = dict(prompt=REPETITIVE, max_tokens=40, temperature=0.7, ignore_eos=True, logprobs=0)
    seeds = (8, 9, 10)  # a seed alone may or may not fall into a loop: these three do, undamped

    def repeats(extra: dict) -> int:
        tokens = complete(smollm2, **body, **extra)["choices"][0]["logprobs"]["tokens"]
        return repeated_ngrams(tokens, 4)

    # Side by side: one batch (a sequence's tokens are its own in a batch or alone).
    extras = [{"seed": s} for s in seeds] + [{"seed": s, "dry_multiplier": 0.8} for s in seeds]
    with concurrent.futures.ThreadPoolExecutor(len(extras)) as pool:
        counts = list(pool.map(repeats, extras))
    plain, dry = sum(counts[: len(seeds)]), sum(counts[len(seeds) :])
    print(f"repeated 4-grams in {body['max_tokens']} tokens, seeds {seeds}: {counts}")
    assert plain >= 5, counts  # the prompt makes the model repeat itself
    assert dry < 0.7 * plain, counts


@pytest.mark.slow
def test_mirostat_v2_holds_the_surprise_near_tau_on_a_real_model(smollm2):
    # tau below the model's own surprise on this text (2.7 bits with mu unbounded), so that the
    # truncation is what holds it there.
    tau = 2.5
    body = dict(
        prompt="Once upon a time,",
        max_tokens=50,
        mirostat=2,
        mirostat_tau=tau,
        mirostat_eta=0.1,
        seed=3,
        ignore_eos=True,
        logprobs=0,
    )
    logprobs = complete(smollm2, **body)["choices"][0]["logprobs"]["token_logprobs"]
    surprise = [-lp / math.log(2) for lp in logprobs]
    print(f"mirostat v2, tau {tau}: mean surprise {sum(surprise) / len(surprise):.2f} bits")
    assert abs(sum(surprise) / len(surprise) - tau) <= 1.0, sum(surprise) / len(surprise)
