"""Sampler pieces vs REFERENCE §1 vectors and slow, obviously correct numpy references."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest

from mlxserve.sampling.breakers import Breakers
from mlxserve.sampling.dry import DryPenalty
from mlxserve.sampling.mirostat import Mirostat
from mlxserve.sampling.params import DryParams
from mlxserve.sampling.truncation import (
    apply_infill,
    apply_top_n_sigma,
    apply_typical_p,
    apply_xtc,
    dynamic_temperature,
)

RNG = np.random.default_rng(0)


def random_logits(vocab: int = 50) -> np.ndarray:
    return RNG.normal(0, 2, size=vocab).astype(np.float32)


def kept(result: mx.array) -> set[int]:
    return set(np.flatnonzero(np.isfinite(np.array(result[0]))).tolist())


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x[np.isfinite(x)].max())
    e[~np.isfinite(x)] = 0
    return e / e.sum()


# ---- numpy references, written the way llama.cpp loops -----------------------------------------


def infill_reference(logits: np.ndarray, ends: set[int], fallback: int) -> set[int]:
    """llama.cpp's llama_sampler_infill_apply, without its merging of prefix tokens."""
    p = softmax(logits.astype(np.float64))
    cur = [i for i in range(len(p)) if np.isfinite(logits[i])]
    p_end = sum(p[i] for i in cur if i in ends)
    p_text = sum(p[i] for i in cur if i not in ends)
    if 3 * p_end * len(cur) > p_text:
        return {i for i in cur if i in ends}
    kept = [i for i in cur if i in ends or p[i] >= 0.2]
    n_text = sum(i not in ends for i in kept)
    if n_text == 0:
        return {fallback}
    total = sum(p[i] for i in kept)
    return {i for i in kept if i in ends or p[i] / total >= 1 / (n_text + 1)}


def typical_reference(logits: np.ndarray, typical_p: float) -> set[int]:
    p = softmax(logits.astype(np.float64))
    entropy = -sum(pi * math.log(pi) for pi in p if pi > 0)
    shifted = [abs(-math.log(pi) - entropy) if pi > 0 else math.inf for pi in p]
    order = sorted(range(len(p)), key=lambda i: shifted[i])
    cum, keep = 0.0, []
    for i in order:
        keep.append(i)
        cum += p[i]
        if cum > typical_p:
            break
    return {i for i in keep if p[i] > 0}


def top_n_sigma_reference(logits: np.ndarray, n: float) -> set[int]:
    finite = logits[np.isfinite(logits)].astype(np.float64)
    mean = finite.mean()
    std = math.sqrt(((finite - mean) ** 2).mean())
    return {i for i, x in enumerate(logits) if x >= finite.max() - n * std}


def xtc_reference(logits: np.ndarray, threshold: float) -> set[int]:
    """XTC when it fires."""
    p = softmax(logits.astype(np.float64))
    above = [i for i in range(len(p)) if p[i] >= threshold]
    if len(above) < 2:
        return set(range(len(p)))
    least = min(above, key=lambda i: p[i])
    return set(range(len(p))) - (set(above) - {least})


@pytest.mark.parametrize("typical_p", [0.2, 0.5, 0.9, 0.99])
def test_typical_p_matches_reference(typical_p):
    for _ in range(10):
        logits = random_logits()
        got = kept(apply_typical_p(mx.array(logits)[None], typical_p))
        assert got == typical_reference(logits, typical_p)


@pytest.mark.parametrize("n", [0.5, 1.0, 2.0])
def test_top_n_sigma_matches_reference(n):
    for _ in range(10):
        logits = random_logits()
        logits[RNG.integers(0, 50, size=5)] = -np.inf  # banned tokens are not counted
        got = kept(apply_top_n_sigma(mx.array(logits)[None], n))
        assert got == top_n_sigma_reference(logits, n)


@pytest.mark.parametrize("threshold", [0.05, 0.1, 0.3])
def test_xtc_matches_reference_when_it_fires_and_keeps_all_when_not(threshold):
    for seed in range(10):
        logits = random_logits()
        key = mx.random.key(seed)
        assert kept(apply_xtc(mx.array(logits)[None], 1.0, threshold, key)) == xtc_reference(
            logits, threshold
        )
        assert kept(apply_xtc(mx.array(logits)[None], 0.0, threshold, key)) == set(range(50))


@pytest.mark.parametrize("case", range(40))
def test_infill_sampler_matches_reference(case):
    """Random and peaked distributions, the end tokens likely or not, some tokens cut before."""
    logits = random_logits(30) * (1 + case % 4)
    ends = {0, 7}
    if case % 3 == 0:
        logits[7] += 6  # ending likely
    if case % 5 == 0:
        logits[np.argsort(logits)[:10]] = -np.inf  # an earlier top-k
    mask = mx.array(np.isin(np.arange(30), list(ends)))
    result = apply_infill(mx.array(logits)[None], mask, fallback=0)
    assert kept(result) == infill_reference(logits, ends, 0)


def test_dynamic_temperature_matches_llamacpp_formula():
    logits = random_logits()
    temperature, spread, exponent = 1.0, 0.5, 1.3
    p = softmax(logits.astype(np.float64))
    entropy = -(p * np.log(p)).sum()
    t = 0.5 + 1.0 * (entropy / math.log(len(p))) ** exponent
    got = np.array(dynamic_temperature(mx.array(logits)[None], temperature, spread, exponent)[0])
    assert got == pytest.approx(logits / t, rel=1e-5)


# ---- mirostat ------------------------------------------------------------------------------------


def test_mirostat_v1_zipf_vector():
    """REFERENCE §1: Zipf p_i ~ (i+1)^-1.2 over N=1000, mu=10 -> s_hat = 1.2, k = 107.35."""
    p = np.arange(1, 1001, dtype=np.float64) ** -1.2
    p /= p.sum()
    miro = Mirostat(1, tau=5.0, eta=0.1, vocab_size=1000)
    miro.mu = mx.array(10.0)
    k = miro.v1_k(mx.array(p, dtype=mx.float32)[None])
    assert k.item() == pytest.approx(107.35, abs=0.05)
    keep = miro._truncate_v1(mx.array(p, dtype=mx.float32)[None])
    assert int(mx.sum(keep).item()) == 107


def test_mirostat_v2_truncation_vector():
    """REFERENCE §1: mu=3, p=[.5,.25,.125,.0625,...] keeps [.5,.25,.125]."""
    p = np.array([0.5 ** (i + 1) for i in range(12)])
    p[-1] += 1 - p.sum()
    miro = Mirostat(2, tau=5.0, eta=0.1, vocab_size=12)
    miro.mu = mx.array(3.0)
    keep = np.array(miro._truncate_v2(mx.array(np.sort(p)[::-1].copy(), dtype=mx.float32)[None]))
    assert keep.sum() == 3


def test_mirostat_update_vector():
    """REFERENCE §1: tau=5, eta=0.1, mu=10, a choice of probability 0.5 -> mu = 10.4."""
    miro = Mirostat(2, tau=5.0, eta=0.1, vocab_size=2)
    miro.mu = mx.array(10.0)
    token = miro.sample(mx.log(mx.array([[0.5, 0.5]])), mx.random.key(0))
    mx.eval(token)
    assert miro.mu.item() == pytest.approx(10.4, abs=1e-5)


def mirostat_reference_step(version: int, p_sorted: np.ndarray, mu: float, n_vocab: int) -> int:
    """How many sorted tokens llama.cpp keeps."""
    if version == 2:
        for i, pi in enumerate(p_sorted):
            if -math.log2(pi) > mu:
                return max(i, 1)
        return len(p_sorted)
    m = min(100, len(p_sorted))
    num = den = 0.0
    for i in range(m - 1):
        t = math.log((i + 2) / (i + 1))
        b = math.log(p_sorted[i] / p_sorted[i + 1])
        num += t * b
        den += t * t
    s_hat = num / den
    eps = s_hat - 1
    k = ((eps * 2**mu) / (1 - n_vocab ** (-eps))) ** (1 / s_hat)
    return max(int(k), 1)


@pytest.mark.parametrize("version", [1, 2])
def test_mirostat_k_and_mu_follow_the_reference_for_50_steps(version):
    vocab, tau, eta = 200, 3.0, 0.1
    miro = Mirostat(version, tau=tau, eta=eta, vocab_size=vocab)
    mu = 2 * tau
    key = mx.random.key(version)
    for _ in range(50):
        logits = random_logits(vocab) * 1.5
        p = softmax(logits.astype(np.float64))
        order = np.argsort(-p, kind="stable")
        k = mirostat_reference_step(version, p[order], mu, vocab)
        key, draw = mx.random.split(key)
        token = miro.sample(mx.array(logits)[None], draw).item()
        rank = int(np.flatnonzero(order == token)[0])
        assert rank < k  # only kept tokens are drawn
        p_kept = p[token] / p[order[:k]].sum()
        mu = mu - eta * (-math.log2(p_kept) - tau)
        assert miro.mu.item() == pytest.approx(mu, abs=1e-3)


# ---- DRY ----------------------------------------------------------------------------------------


NO_BREAKERS = Breakers(frozenset(), ())


def dry_probs(p, history, breakers=NO_BREAKERS, **params):
    params.setdefault("penalty_last_n", 64)
    dry = DryPenalty(DryParams(**params), breakers, len(p), context=4096)
    logits = mx.log(mx.array([p], dtype=mx.float32))
    out = dry(mx.array(history, dtype=mx.int32), logits)
    return np.array(mx.softmax(out, axis=-1)[0])


def test_dry_vectors_from_llamacpp():
    """REFERENCE §1 (llama.cpp tests/test-sampling.cpp)."""
    q, f = [0.25] * 4, [0.2] * 5
    h = [0, 1, 2, 0, 1]
    got = dry_probs(q, h, multiplier=1, base=1.1, allowed_length=2, penalty_last_n=5)
    assert got == pytest.approx([0.296923, 0.296923, 0.109232, 0.296923], abs=1e-5)
    got = dry_probs(f, h, multiplier=2, base=1.1, allowed_length=2, penalty_last_n=5)
    assert got == pytest.approx([0.241818, 0.241818, 0.032727, 0.241818, 0.241818], abs=1e-5)
    breaker_3 = Breakers(frozenset({3}), ())
    got = dry_probs(
        f, [0, 1, 3, 4, 0, 1], breaker_3, multiplier=2, base=1.1, allowed_length=2, penalty_last_n=6
    )
    assert got == pytest.approx(f, abs=1e-6)
    got = dry_probs(
        f, [0, 1, 2, 3, 4, 0, 1], multiplier=2, base=1.1, allowed_length=4, penalty_last_n=7
    )
    assert got == pytest.approx(f, abs=1e-6)
    got = dry_probs(q, [0, 1], multiplier=2, base=1.1, allowed_length=2, penalty_last_n=4)
    assert got == pytest.approx(q, abs=1e-6)


def test_dry_penalty_vector_token_9():
    """history [5,6,7,8,9,1,5,6,7,8], m=0.8, b=1.75, A=2 -> token 9 loses 0.8 * 1.75**2 = 2.45."""
    dry = DryPenalty(DryParams(multiplier=0.8, base=1.75, allowed_length=2), NO_BREAKERS, 12, 4096)
    penalty = np.array(dry.penalties(mx.array([5, 6, 7, 8, 9, 1, 5, 6, 7, 8], dtype=mx.int32)))
    assert penalty[9] == pytest.approx(2.45, abs=1e-5)
    assert np.count_nonzero(penalty) == 1


def dry_reference(history, vocab, params: DryParams, single=(), multi=()):
    """llama.cpp's DRY written as plain loops (O(N^2) match scan instead of its Z-algorithm)."""
    h = list(history)[-params.penalty_last_n :] if params.penalty_last_n > 0 else list(history)
    length, allowed = len(h), params.allowed_length
    out = np.zeros(vocab)
    if length <= allowed:
        return out
    rep_limit = length
    for i in range(length):
        pos, longest = length - 1 - i, -1
        if h[pos] in single:
            longest = 0
        for tail, heads in multi:
            span = len(tail)
            if (
                h[pos] in heads
                and longest < span <= i
                and h[pos + 1 : pos + 1 + span] == list(tail)
            ):
                longest = span
        if longest >= 0:
            rep_limit = i - longest
            break
    if rep_limit < allowed:
        return out
    best: dict[int, int] = {}
    for j in range(length - 1):
        n = 0
        while n < rep_limit and j - n >= 0 and h[j - n] == h[length - 1 - n]:
            n += 1
        if n >= allowed:
            best[h[j + 1]] = max(best.get(h[j + 1], 0), n)
    for token, n in best.items():
        if token not in single:
            out[token] = params.multiplier * params.base ** (n - allowed)
    return out


def test_dry_matches_the_reference_on_random_repetitive_histories():
    rng = np.random.default_rng(3)
    vocab = 8
    for trial in range(200):
        history = rng.integers(0, vocab, size=rng.integers(2, 40)).tolist()
        single = frozenset(rng.choice(vocab, size=rng.integers(0, 2), replace=False).tolist())
        multi = ()
        if trial % 2:
            tail = tuple(rng.integers(0, vocab, size=rng.integers(1, 3)).tolist())
            multi = ((tail, frozenset({int(rng.integers(0, vocab))})),)
        params = DryParams(
            multiplier=0.8,
            base=1.5,
            allowed_length=int(rng.integers(1, 4)),
            penalty_last_n=int(rng.integers(3, 50)),
        )
        dry = DryPenalty(params, Breakers(single, multi), vocab, 4096)
        got = np.array(dry.penalties(mx.array(history[-params.penalty_last_n :], dtype=mx.int32)))
        want = dry_reference(history, vocab, params, single, multi)
        assert got == pytest.approx(want, rel=1e-5), (history, single, multi, params)


def test_breakers_resolve_single_and_multi_token(tiny_model):
    from transformers import AutoTokenizer

    from mlxserve.sampling.breakers import resolve_breakers, token_texts

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
    texts = token_texts(tokenizer)
    resolved = resolve_breakers(tokenizer, ["\n", "return"])
    newline = [i for i, t in enumerate(texts) if "\n" in t]
    assert newline and set(newline) <= resolved.single
    assert all("return" in texts[i] or "\n" in texts[i] for i in resolved.single)
    # Tokens ending in a proper prefix of "return" ("re", "ret", ...) start a multi-token breaker.
    heads = {h for _, hs in resolved.multi for h in hs}
    assert heads and all(
        any("return".startswith(texts[h][k:]) for k in range(len(texts[h]))) for h in heads
    )
