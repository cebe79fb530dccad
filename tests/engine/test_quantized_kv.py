"""Quantized KV in the batch (--kv-bits): batches equal their solo runs, the prefix cache and
choices sharing a prompt work on it, and it takes the memory its bits say."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models.cache import KVCache

from mlxserve.engine import Engine, GenerationRequest, StopSpec
from mlxserve.engine.mlx_lm_compat.quantized_kv import Packing, QuantizedRowKVCache
from mlxserve.sampling.params import SamplingParams

from ..device_numerics import skip_without_quantized_attention
from .test_engine import run, token_ids

GREEDY = SamplingParams(temperature=0.0)
SAMPLED = SamplingParams(temperature=0.9, top_p=0.95, repetition_penalty=1.1)
PROMPTS = [tuple(3 + (i * 37 + k * 101) % 900 for i in range(20 + 13 * k)) for k in range(5)]


def request(prompt, max_tokens=16, sampling=GREEDY, seed=0, **kwargs) -> GenerationRequest:
    return GenerationRequest(
        prompt_ids=tuple(prompt),
        max_tokens=max_tokens,
        sampling=sampling,
        seed=seed,
        stop=StopSpec(ignore_eos=True),
        **kwargs,
    )


@pytest.fixture(scope="module", params=[4, 8], ids=["4-bit", "8-bit"])
def engine(request, tiny_model_head32):
    skip_without_quantized_attention(32, request.param, 32)
    engine = Engine(str(tiny_model_head32), kv_bits=request.param, kv_group_size=32).start()
    assert engine.wait_ready(300), engine.error
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def float_engine(tiny_model_head32):
    engine = Engine(str(tiny_model_head32)).start()
    assert engine.wait_ready(300), engine.error
    yield engine
    engine.stop()


def test_the_batch_holds_packed_kv_a_fraction_of_floats(engine, float_engine):
    quantized = engine.slot.loaded.kv_bytes_per_token
    full = float_engine.slot.loaded.kv_bytes_per_token
    bits = engine.slot.loaded.model.make_cache()[0].bits
    # words for head_dim * bits, plus a scale and a bias per group of 32 (float32 here)
    assert quantized == full * (bits / 32 + 2 / 32)


def test_a_batch_equals_its_solo_runs(engine):
    for sampling in (GREEDY, SAMPLED):
        alone = [
            token_ids(run(engine, [request(p, sampling=sampling, seed=i)])[0])
            for i, p in enumerate(PROMPTS)
        ]
        together = run(
            engine, [request(p, sampling=sampling, seed=i) for i, p in enumerate(PROMPTS)]
        )
        assert [token_ids(together[i]) for i in range(len(PROMPTS))] == alone


def test_the_prefix_cache_and_shared_prompts_work_on_packed_kv(engine):
    prompt = PROMPTS[4] * 3
    cold = token_ids(run(engine, [request(prompt, cache_prompt=False)])[0])
    first = run(engine, [request(prompt)])[0]
    warm = run(engine, [request(prompt)])[0]
    assert warm[-1].cached_tokens == len(prompt) - 1
    assert token_ids(warm) == token_ids(first) == cold
    # choices of one prompt share its prefill; each as it is alone
    choices = run(engine, [request(prompt, sampling=SAMPLED, seed=s) for s in (5, 6)])
    for index, seed in enumerate((5, 6)):
        alone = run(engine, [request(prompt, sampling=SAMPLED, seed=seed, cache_prompt=False)])
        assert token_ids(choices[index]) == token_ids(alone[0])


def test_greedy_mostly_agrees_with_float_kv(engine, float_engine):
    """The quality cost, as a floor: tokens before the first disagreement with float KV."""
    agreed = []
    for prompt in PROMPTS:
        quantized = token_ids(run(engine, [request(prompt, max_tokens=8)])[0])
        full = token_ids(run(float_engine, [request(prompt, max_tokens=8)])[0])
        agreed.append(next((i for i, (a, b) in enumerate(zip(quantized, full)) if a != b), 8))
    assert sum(agreed) >= 0.5 * 8 * len(PROMPTS), agreed


def test_packing_round_trips_what_quantize_makes():
    x = mx.random.normal((2, 3, 5, 64))
    packing = Packing(4, 32, x.dtype)
    words, scales, biases = packing.unpack(packing.pack(x))
    expected = mx.quantize(x, group_size=32, bits=4)
    for a, b in zip((words, scales, biases), expected):
        assert a.dtype == b.dtype and mx.array_equal(a, b).item()


def test_a_row_cache_merges_into_a_packed_batch():
    rows = [QuantizedRowKVCache(Packing(8, 32)) for _ in range(2)]
    for n, row in zip((3, 5), rows):
        row.update_and_fetch(mx.ones((1, 2, n, 32)), mx.ones((1, 2, n, 32)))
    batch = type(rows[0]).merge(rows)
    assert batch.bits == 8 and batch.keys.dtype == mx.uint32
    assert isinstance(rows[0], KVCache)
    empty = type(rows[0]).merge([QuantizedRowKVCache(Packing(8, 32))])
    assert empty.bits == 8  # an empty batch stays packed: its first prompt writes into it


def test_a_model_whose_head_size_the_group_does_not_divide_is_refused_at_load(tiny_model):
    engine = Engine(str(tiny_model), kv_bits=4).start()  # heads of 16 values, groups of 64
    try:
        assert not engine.wait_ready(300)
        assert "--kv-group-size 64 does not divide this model's head size 16" in engine.error
    finally:
        engine.stop()


@pytest.mark.parametrize("layers_per_pass", [None, 1])
@pytest.mark.parametrize(
    "name", ["beside a stream", "prompts arrive during a chunk", "a burst beside a stream"]
)
def test_chunks_carried_in_decode_passes_decode_as_mlx_lms_own_passes(
    tiny_model_head32, monkeypatch, name, layers_per_pass
):
    """Mixed batches (a prompt's chunks in the decode pass, the decode batch in KV groups) on
    packed KV: the tokens of mlx-lm's separate prefill passes on the same packed KV."""
    import mlx_lm

    from mlxserve.engine.mlx_lm_compat.quantized_kv import install

    from .test_mixed_batch import decodes_as_plain

    skip_without_quantized_attention(32, 4, 32)
    model = mlx_lm.load(str(tiny_model_head32))[0]
    install(model, 4, 32)
    assert decodes_as_plain(model, name, monkeypatch, layers_per_pass).carried_tokens > 0
