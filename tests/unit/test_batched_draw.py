"""Rows that sample alike are drawn in one graph (sampling/batched.py), and rows that ban the same
ids are banned in one op (decode_step.py): every row must come out exactly as it would alone,
step after step, in any company."""

from __future__ import annotations

import mlx.core as mx
import pytest

from mlxserve.engine.failures.row_guard import RowGuard
from mlxserve.sampling.batched import draw
from mlxserve.sampling.chain import Ban, SequenceSampler, banned_at_rows, shared_bans
from mlxserve.sampling.params import SamplingParams

from ..faults import Fault, Tripping

VOCAB = 300
STEPS = 4

CHAINS = {
    "greedy": SamplingParams(temperature=0.0),
    "temperature": SamplingParams(temperature=0.7),
    "llama.cpp defaults": SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
    "typical and top-n-sigma": SamplingParams(temperature=1.2, typical_p=0.9, top_n_sigma=1.5),
    "dynamic temperature": SamplingParams(temperature=0.9, dynatemp_range=0.5),
    "infill": SamplingParams(
        temperature=0.5, samplers=("top_k", "infill", "temperature"), infill_end_ids=(0, 7)
    ),
}
# Samplers whose state or randomness is their row's own: drawn alone, on their own row.
ALONE = {
    "mirostat": SamplingParams(temperature=0.8, mirostat=2),
    "xtc": SamplingParams(temperature=1.0, xtc_probability=0.5, xtc_threshold=0.05),
}


def logprobs(rows: int, step: int) -> mx.array:
    x = mx.random.normal((rows, VOCAB), key=mx.random.key(1000 + step)) * 3
    return x - mx.logsumexp(x, axis=-1, keepdims=True)


def alone(params: list[SamplingParams], seeds: list[int], **kwargs) -> list[list[int]]:
    """Each row's tokens over the steps, its sampler called on its row only."""
    samplers = [SequenceSampler(p, VOCAB, s, **kwargs) for p, s in zip(params, seeds)]
    steps = [logprobs(len(params), step) for step in range(STEPS)]
    return [[samplers[i](x[i : i + 1]).item() for x in steps] for i in range(len(samplers))]


def together(samplers: list, rows: int) -> list[list[int]]:
    tokens = [draw(samplers, logprobs(rows, step)).tolist() for step in range(STEPS)]
    return [list(row) for row in zip(*tokens)]


@pytest.mark.parametrize("name", CHAINS)
def test_a_group_draws_what_each_row_draws_alone(name):
    params, seeds = [CHAINS[name]] * 6, [3, 4, 5, 6, 9, 11]
    samplers = [SequenceSampler(p, VOCAB, s) for p, s in zip(params, seeds)]
    assert len({s.group_key for s in samplers}) == 1
    assert together(samplers, 6) == alone(params, seeds)


def test_mixed_groups_and_lone_rows_come_back_in_row_order():
    names = ["temperature", "greedy", "mirostat", "temperature", "llama.cpp defaults", "xtc"]
    names += ["greedy", "llama.cpp defaults"]
    params = [CHAINS.get(n) or ALONE[n] for n in names]
    seeds = list(range(20, 20 + len(params)))
    samplers = [SequenceSampler(p, VOCAB, s) for p, s in zip(params, seeds)]
    keys = [s.group_key for s in samplers]
    assert keys[2] is None and keys[5] is None and keys[0] == keys[3] != keys[4] == keys[7]
    assert together(samplers, len(params)) == alone(params, seeds)


@pytest.mark.parametrize("name", ["greedy", "llama.cpp defaults"])
def test_rows_keeping_their_final_logits_draw_as_the_others_do(name):
    params, seeds = [CHAINS[name]] * 2, [1, 2]
    keeping = SequenceSampler(params[0], VOCAB, seeds[0], keep_final=True)
    drawn = together([keeping, SequenceSampler(params[1], VOCAB, seeds[1])], 2)
    assert drawn == alone(params, seeds)
    assert len(keeping.finals) == STEPS
    final = keeping.finals[-1]
    assert final.shape == (1, VOCAB) and final[0, drawn[0][-1]].item() > -float("inf")


class FailsInAGroup(SequenceSampler):
    """Draws fine alone, raises when drawing a group (a failure while building the group's
    graph)."""

    def draw_rows(self, members, logprobs):
        if len(members) > 1:
            raise RuntimeError("no groups")
        return super().draw_rows(members, logprobs)


def test_a_group_that_fails_draws_each_row_alone_behind_its_guard():
    params, seeds = [CHAINS["llama.cpp defaults"]] * 3, [5, 6, 7]
    guarded = [RowGuard().sampler(FailsInAGroup(p, VOCAB, s)) for p, s in zip(params, seeds)]
    assert together(guarded, 3) == alone(params, seeds)
    assert all(g.guard.error is None and g.guard.steps == STEPS for g in guarded)


def test_a_row_with_a_fault_leaves_the_group_and_fails_alone():
    params, seeds = [CHAINS["temperature"]] * 3, [5, 6, 7]
    guards = [RowGuard(), RowGuard(), RowGuard()]
    samplers = [SequenceSampler(p, VOCAB, s) for p, s in zip(params, seeds)]
    samplers[1] = Tripping(samplers[1], "sampler", Fault("sampler", after=2), guards[1])
    guarded = [g.sampler(s) for g, s in zip(guards, samplers)]
    assert guarded[1].group_key is None and guarded[0].group_key == guarded[2].group_key
    drawn = together(guarded, 3)
    expected = alone(params, seeds)
    assert drawn[0] == expected[0] and drawn[2] == expected[2]
    assert drawn[1][:2] == expected[1][:2]
    assert guards[1].error is not None and "sampler failed" in guards[1].error
    assert guards[0].error is None and guards[0].steps == STEPS


def test_bans_of_the_same_ids_are_applied_to_all_their_rows_at_once():
    guard, faulty = RowGuard(), RowGuard()
    eos, other = Ban([0, 7]), Ban([5])
    tripping = Tripping(eos, "logits processor", Fault("logits processor", after=99), faulty)

    def bias(_tokens, logits):
        return logits + 1.0

    processors = [
        [guard.processor(eos, "logits processor")],
        [],
        [guard.processor(bias, "logits processor"), guard.processor(eos, "logits processor")],
        [guard.processor(other, "logits processor")],
        [faulty.processor(tripping, "logits processor")],  # plays its fault: stays the row's own
        None,
    ]
    logits = mx.random.normal((6, 10), key=mx.random.key(0))
    expected = mx.concatenate(
        [
            ban_alone(logits[i : i + 1], [p for p in row or () if p is not None])
            for i, row in enumerate(processors)
        ]
    )
    bans, own = shared_bans(processors)
    banned = banned_at_rows(logits, bans)
    assert [len(p) for p in own] == [0, 0, 1, 0, 1, 0]
    assert own[2][0].process is bias and own[4][0].guard is faulty
    together = mx.concatenate(
        [ban_alone(banned[i : i + 1], own[i]) for i in range(len(processors))]
    )
    assert mx.array_equal(together, expected).item()
    assert mx.isinf(banned[0, 7]).item() and not mx.isinf(banned[4, 7]).item()


def ban_alone(row: mx.array, processors: list) -> mx.array:
    for processor in processors:
        row = processor(mx.array([1, 2]), row)
    return row
