"""The prefill pacer's arithmetic: chunks sized so a decode step plus a chunk stays within
(1 + CHUNK_COST_IN_DECODE_STEPS) decode steps. The gap itself is measured by
benchmarks/prefill_beside_streams.py."""

from __future__ import annotations

import pytest

from mlxserve.engine.mlx_lm_compat import ServerBatchGenerator
from mlxserve.engine.scheduling.pacing import (
    CHUNK_COST_IN_DECODE_STEPS,
    COST_WINDOW,
    GAP_MARGIN,
    GRANULE,
    MAX_CHUNK,
    MAX_GROWTH,
    MIN_CHUNK,
    OTHERS_MARGIN,
    SPREAD_CHUNK,
    PrefillPacer,
    chunk_cost,
    even_share,
    spare_the_join,
)
from mlxserve.settings import DEFAULT_MAX_STREAM_GAP


def test_with_nothing_decoding_prompts_go_in_the_largest_chunks():
    pacer = PrefillPacer(calibrated=128)
    assert pacer.observe(2.0, prompt_tokens=2048, prompts=1, decoded=False) == MAX_CHUNK


def test_a_stream_starts_on_the_calibrated_chunk():
    pacer = PrefillPacer(calibrated=128)
    assert pacer.observe(0.1, prompt_tokens=0, prompts=0, decoded=True) == 128


@pytest.mark.parametrize("prompts", [1, 2])
def test_chunks_follow_the_measured_cost_of_a_prompt_token(prompts):
    pacer = PrefillPacer(calibrated=128)
    for _ in range(5):
        pacer.observe(0.100, prompt_tokens=0, prompts=0, decoded=True)
    # 1024 prompt tokens cost 0.5 s beside the 0.1 s decode step: 0.49 ms a token.
    chunk = pacer.observe(0.600, prompt_tokens=1024, prompts=prompts, decoded=True)
    expected = int(CHUNK_COST_IN_DECODE_STEPS * 0.1 / (0.5 / 1024) / prompts)
    assert chunk == expected // GRANULE * GRANULE
    # Deeper into the prompt a token costs twice as much: once most of the latest steps say so,
    # the chunk halves.
    deeper = chunk
    for _ in range(COST_WINDOW // 2 + 1):
        tokens = deeper * prompts
        deeper = pacer.observe(0.100 + 2 * 0.5 * tokens / 1024, tokens, prompts, True)
    assert abs(deeper - chunk / 2) <= GRANULE


def test_one_odd_step_does_not_move_the_chunk():
    """Steps doing the same work vary (+-30 ms on the 2-core VM, and now and then one runs
    ~110 ms long): the median of the latest COST_WINDOW estimates sizes the chunk."""
    pacer = PrefillPacer(calibrated=16)
    pacer.observe(0.050, prompt_tokens=0, prompts=0, decoded=True)
    for _ in range(COST_WINDOW):
        chunk = pacer.observe(0.050 + 0.002 * 16, prompt_tokens=16, prompts=1, decoded=True)
    assert chunk == int(CHUNK_COST_IN_DECODE_STEPS * 0.050 / 0.002) // GRANULE * GRANULE
    assert pacer.observe(0.050 + 0.110, prompt_tokens=16, prompts=1, decoded=True) == chunk
    assert pacer.observe(0.050 + 0.001 * 16, prompt_tokens=16, prompts=1, decoded=True) == chunk


def test_chunks_stay_within_bounds():
    pacer = PrefillPacer(calibrated=128)
    pacer.observe(0.1, prompt_tokens=0, prompts=0, decoded=True)
    assert pacer.observe(100.0, prompt_tokens=32, prompts=1, decoded=True) == MIN_CHUNK
    chunk = 32
    for _ in range(12):  # nearly free tokens: the chunk doubles each step, up to MAX_CHUNK
        chunk = pacer.observe(0.1001, prompt_tokens=chunk, prompts=1, decoded=True)
    assert chunk == MAX_CHUNK


def test_a_chunk_at_most_doubles_on_the_one_just_measured():
    """One step's estimate of a prompt token's cost can be low (noise), and an over-long chunk is
    a gap a stream waits through: beside decoding the chunk grows by MAX_GROWTH at most."""
    pacer = PrefillPacer(calibrated=16)
    pacer.observe(0.070, prompt_tokens=0, prompts=0, decoded=True)
    # 8 tokens measured at 1 ms each would allow 70; the next chunk is 16
    assert pacer.observe(0.078, prompt_tokens=8, prompts=1, decoded=True) == MAX_GROWTH * 8
    # two prompts of 8 each: 35 tokens a prompt would fit; 16 each
    assert pacer.observe(0.086, prompt_tokens=16, prompts=2, decoded=True) == MAX_GROWTH * 8


def test_one_slow_decode_step_does_not_inflate_the_usual_gap():
    """A slow decode-only step (149 ms among 70 ms ones, on the 2-core CPU) is not the usual gap:
    taken into it, prompt tokens look cheap and chunks overrun."""
    steady, spiked = PrefillPacer(calibrated=16), PrefillPacer(calibrated=16)
    for step in [0.070] * 8:
        steady.observe(step, prompt_tokens=0, prompts=0, decoded=True)
    for step in [0.070] * 7 + [0.149]:
        spiked.observe(step, prompt_tokens=0, prompts=0, decoded=True)
    assert spiked.decode_step_s == pytest.approx(0.070)
    assert spiked.observe(0.100, 8, 1, True) == steady.observe(0.100, 8, 1, True)


def test_deep_in_a_long_prompt_chunks_go_below_the_granule():
    """SmolLM2-135M at depth 7000 on the CPU: 8 prompt tokens took ~130 ms beside a 40 ms decode
    step, over the budget; a few tokens fit it."""
    pacer = PrefillPacer(calibrated=128)
    pacer.observe(0.040, prompt_tokens=0, prompts=0, decoded=True)
    fits = int(CHUNK_COST_IN_DECODE_STEPS * 0.040 / (0.130 / 8))
    assert 1 <= fits < GRANULE
    assert pacer.observe(0.170, prompt_tokens=8, prompts=1, decoded=True) == fits
    cost = 0.130 / 8 * fits
    assert pacer.observe(0.040 + cost, prompt_tokens=fits, prompts=1, decoded=True) == fits


def test_beside_decoding_chunks_stay_within_what_a_decode_step_carries():
    pacer = PrefillPacer(calibrated=16, beside_decode_max=64)
    for _ in range(5):
        pacer.observe(0.100, prompt_tokens=0, prompts=0, decoded=True)
    # 64 prompt tokens cost 6.4 ms carried in the decode step: the bound alone would allow 1000.
    assert pacer.observe(0.1064, prompt_tokens=64, prompts=1, decoded=True) == 64
    assert pacer.observe(2.0, prompt_tokens=2048, prompts=1, decoded=False) == MAX_CHUNK


def test_a_prompts_final_chunk_is_a_single_token():
    assert spare_the_join(16, [40]) == 16  # not the final chunk yet
    assert spare_the_join(16, [16]) == 15  # would be: leave one token for a chunk of its own
    assert spare_the_join(16, [1]) == 16  # the final chunk is one token anyway
    assert spare_the_join(16, [40, 5, 9]) == 4


def test_mlx_lm_joins_a_prompt_a_step_after_its_single_token_final_chunk(tiny_lm):
    """`prompt_tails` reads mlx-lm's generator as it is: with `spare_the_join` applied each step,
    the step before a prompt joins the decode batch prefills one token of it."""
    generator = ServerBatchGenerator(tiny_lm, prefill_chunk=8, pass_tokens=8, mixed=False)
    generator.insert([[7] * 4], max_tokens=[30])  # a stream
    (uid,) = generator.insert([list(range(3, 40))], max_tokens=[2])  # 37 tokens: tail 36
    chunks = []
    while True:
        generator.prefill_step_size = spare_the_join(8, generator.prompt_tails())
        with generator.stats() as work:
            prompts, _ = generator.next()
        if any(r.uid == uid and r.end_of_prompt for r in prompts):
            break
        chunks.append(work.prompt_tokens)
    assert chunks[-1] == 1 and sum(chunks) >= 36
    generator.close()


def test_deep_in_a_long_prompt_a_chunk_goes_through_the_layers_over_several_steps():
    """Where fewer than SPREAD_CHUNK tokens fit a step (SmolLM2-135M at depth 7,000 on the CPU:
    one token costs 63 ms beside a 55 ms decode pass), a chunk goes through some of the 30
    layers a step, as wide as the budget allows over its passes; without mixed batches a step
    carries the 1-token floor."""
    for layers in (0, 30):
        pacer = PrefillPacer(calibrated=16, layers=layers)
        pacer.observe(0.055, prompt_tokens=0, prompts=0, decoded=True)
        chunk = pacer.observe(0.055 + 0.063, prompt_tokens=1, prompts=1, decoded=True)
        if not layers:
            assert (chunk, pacer.layers_per_pass) == (MIN_CHUNK, None)
            continue
        # about one token fits: the narrowest chunk through a tenth of the layers a step
        assert (chunk, pacer.layers_per_pass) == (GRANULE, 3)
        # 8 tokens through 10 layers a step share the KV reads: 20 ms each; 3.3 fit a step,
        # so 16 tokens through 6 layers a step (5 passes) carry 3.2
        for _ in range(COST_WINDOW):
            chunk = pacer.observe(0.055 + 0.020 * 8 / 3, 8 / 3, prompts=1, decoded=True)
        assert CHUNK_COST_IN_DECODE_STEPS * 0.055 / 0.020 == pytest.approx(3.3)
        assert (chunk, pacer.layers_per_pass) == (SPREAD_CHUNK, 6)
        # shallower: whole chunks
        for _ in range(COST_WINDOW):
            pacer.observe(0.055 + 0.004 * 8, prompt_tokens=8, prompts=1, decoded=True)
        assert pacer.layers_per_pass is None


def test_a_chunk_spread_over_the_layers_goes_in_even_passes():
    """The chunk carrying the most within the budget, in passes of the same share: 28 layers
    and then 2 made every other step the costliest the budget allowed."""
    assert [even_share(30, s) for s in (28, 21, 15, 14, 9, 3, 1)] == [15, 15, 15, 10, 8, 3, 1]
    pacer = PrefillPacer(calibrated=16, layers=30)
    pacer.observe(0.055, prompt_tokens=0, prompts=0, decoded=True)
    for _ in range(COST_WINDOW):  # 8.9 tokens fit a step: 32 through 8 layers a step carry 8.5
        chunk = pacer.observe(0.055 + 0.0074 * 7.5, prompt_tokens=7.5, prompts=1, decoded=True)
    assert (chunk, pacer.layers_per_pass) == (2 * SPREAD_CHUNK, 8)


def test_a_spread_chunk_always_makes_progress():
    """A stream that deepens beside the prefill spends the (stale) budget on its own attention:
    the chunk still goes through a tenth of the layers a step, never a single one."""
    pacer = PrefillPacer(calibrated=16, layers=30)
    pacer.observe(0.052, prompt_tokens=0, prompts=0, decoded=True)
    for _ in range(COST_WINDOW):  # each step's cost is nearly all the stream's own
        chunk = pacer.observe(0.100, 8 / 30, prompts=1, decoded=True)
    assert (chunk, pacer.layers_per_pass) == (GRANULE, 3)


@pytest.mark.parametrize("gap", [2.0, 3.0, 5.0])
def test_the_gap_bound_sets_the_chunks_budget(gap):
    """--max-stream-gap: a chunk may take GAP_MARGIN of the bound's room above a decode step."""
    pacer = PrefillPacer(calibrated=16, cost=chunk_cost(gap))
    pacer.observe(0.050, prompt_tokens=0, prompts=0, decoded=True)
    for _ in range(COST_WINDOW + 3):  # past MAX_GROWTH's ramp
        chunk = pacer.observe(0.050 + 0.0005 * 64, prompt_tokens=64, prompts=1, decoded=True)
        chunk = pacer.observe(0.050 + 0.0005 * chunk, prompt_tokens=chunk, prompts=1, decoded=True)
    expected = int((gap - 1) * GAP_MARGIN * 0.050 / 0.0005)
    assert chunk == min(expected // GRANULE * GRANULE, MAX_CHUNK)
    assert chunk_cost(DEFAULT_MAX_STREAM_GAP) == CHUNK_COST_IN_DECODE_STEPS


def test_without_a_gap_bound_prompts_prefill_in_the_largest_chunks():
    pacer = PrefillPacer(calibrated=16, cost=chunk_cost(None))
    assert pacer.observe(0.050, prompt_tokens=0, prompts=0, decoded=True) == MAX_CHUNK
    chunk = 64
    for _ in range(8):
        chunk = pacer.observe(0.050 + 0.0005 * chunk, chunk, prompts=1, decoded=True)
    assert chunk == MAX_CHUNK


def test_beside_another_models_streams_a_prompt_takes_its_share_of_their_wait():
    """No stream of its own, but another model's streams wait 0.1 s for their own step each
    round: the chunk's time is bounded by the same cost, in that wait (scheduling/thread.py)."""
    pacer = PrefillPacer(calibrated=128)
    assert pacer.observe(0.4, prompt_tokens=1024, prompts=1, decoded=False) == MAX_CHUNK
    # 1024 tokens took 0.4 s with nothing decoding here: 0.39 ms a token
    chunk = pacer.observe(0.4, prompt_tokens=1024, prompts=1, decoded=False, others_s=0.1)
    beside_others = CHUNK_COST_IN_DECODE_STEPS / GAP_MARGIN * OTHERS_MARGIN
    expected = int(beside_others * 0.1 / (0.4 / 1024))
    assert chunk == min(expected, MAX_GROWTH * 1024) // GRANULE * GRANULE
    assert pacer.layers_per_pass is None  # a pass of its own: nothing to carry it
    # with its own stream too, the round's wait is both models' steps
    for _ in range(5):
        pacer.observe(0.05, prompt_tokens=0, prompts=0, decoded=True, others_s=0.1)
    both = pacer.observe(0.05 + 0.4 * 64 / 1024, 64, 1, True, others_s=0.1)
    assert both >= 64 and both <= CHUNK_COST_IN_DECODE_STEPS * 0.15 / (0.4 / 1024) + GRANULE


def test_beside_another_models_streams_a_few_token_pass_does_not_shrink_the_chunk_for_good():
    """A prompt's pass of its own costs about a decode step before its tokens: a one-token
    pass (a prompt's last) must not read as one very dear token, or every later chunk is one
    token, each a whole pass (an infill prompt took 35 s that way beside a chat stream). The
    chunk may add the bound's share of a round with both models decoding, as when this model
    decodes beside them."""
    pacer = PrefillPacer(calibrated=128)
    for _ in range(5):
        pacer.observe(0.04, prompt_tokens=0, prompts=0, decoded=True)  # its own stream, before
    chunk = pacer.observe(0.04, prompt_tokens=1, prompts=1, decoded=False, others_s=0.05)
    assert chunk >= SPREAD_CHUNK
    for _ in range(10):
        chunk = pacer.observe(0.04 + chunk * 0.0004, chunk, 1, False, others_s=0.05)
    # the round the others' streams usually wait: their step and this model's decode step
    budget = CHUNK_COST_IN_DECODE_STEPS / GAP_MARGIN * OTHERS_MARGIN * (0.05 + 0.04)
    assert chunk == int(budget / 0.0004) // GRANULE * GRANULE
