"""Prompt chunks carried in decode steps' forward passes (`engine/mixed_batch.py`): the same
tokens as mlx-lm's own separate prefill passes, and log-probabilities equal to float32 rounding."""

from __future__ import annotations

import random

import mlx.core as mx
import pytest
from mlx_lm.generate import BatchGenerator, PromptProcessingBatch

from mlxserve.engine.mlx_lm_compat import batch_join, mixed_batch
from mlxserve.platform.matmul_rows import padded_rows

from ..batch_decoding import decode_all, mixed_generator
from ..device_numerics import LOGPROB_TOLERANCE


def _prompt(rng: random.Random, length: int) -> list[int]:
    return [rng.randrange(3, 1024) for _ in range(length)]


def _scenarios() -> dict[str, dict]:
    rng = random.Random(7)
    return {
        # a stream; a long prompt prefilled beside it; two prompts prefilled together
        "beside a stream": {
            0: ([_prompt(rng, 12)], [120]),
            4: ([_prompt(rng, 400)], [40]),
            30: ([_prompt(rng, 50), _prompt(rng, 200)], [20, 20]),
        },
        # the stream ends while the prompt is still being prefilled
        "the stream ends first": {0: ([_prompt(rng, 8)], [4]), 2: ([_prompt(rng, 300)], [10])},
        # prompts arrive while a chunk is part-way through the layers (with passes > 1)
        "prompts arrive during a chunk": {
            0: ([_prompt(rng, 8)], [100]),
            2: ([_prompt(rng, 300)], [10]),
            5: ([_prompt(rng, 40)], [10]),
            6: ([_prompt(rng, 30)], [10]),
            7: ([_prompt(rng, 20)], [10]),
        },
        # the stream is removed (a client left) with a chunk kept: the chunk runs alone first
        "the stream is removed": {0: ([_prompt(rng, 8)], [100]), 2: ([_prompt(rng, 300)], [10])},
        # a burst of requests arriving spread out: prompts side by side at unequal lengths
        "a burst beside a stream": {
            0: ([_prompt(rng, 12)], [60]),
            1: ([_prompt(rng, 13)], [20]),
            2: ([_prompt(rng, 9), _prompt(rng, 15)], [20, 20]),
            3: ([_prompt(rng, 40)], [10]),
            4: ([_prompt(rng, 11), _prompt(rng, 70), _prompt(rng, 5)], [15, 15, 15]),
        },
        # prompts of unequal lengths reach an idle batch together; one more a step later
        "a burst on an idle batch": {
            0: ([_prompt(rng, 12), _prompt(rng, 7), _prompt(rng, 30)], [20, 20, 20]),
            1: ([_prompt(rng, 3)], [10]),
        },
    }


# prompts whose last token rides in the pass of their final chunk, by scenario: all of them in
# a burst, where mlx-lm would run it in a pass of its own
CARRIED_JOINS = {"a burst beside a stream": 8, "a burst on an idle batch": 4}


def _removing_the_first_at(step: int):
    steps = [0]

    def next_step(generator: BatchGenerator):
        steps[0] += 1
        if steps[0] == step:
            generator.remove([0])
        return generator.next()

    return next_step


def _decode(model, name: str, mixed: bool, layers_per_pass: int | None = None, matmul_rows=None):
    generator, carrier = BatchGenerator(model, prefill_step_size=32), None
    if mixed:
        generator, carrier = mixed_generator(model, 32, matmul_rows=matmul_rows)
        carrier.layers_per_pass = layers_per_pass
    step = BatchGenerator.next
    if name == "the stream is removed":
        step = _removing_the_first_at(6)
    logprobs = {}

    def next_step(generator: BatchGenerator):  # logprobs by sequence: the steps may differ
        result = step(generator)
        for r in result[1]:
            logprobs.setdefault(r.uid, []).append(r.logprobs)
        return result

    tokens, _ = decode_all(generator, _scenarios()[name], next_step, max_steps=500)
    return tokens, {uid: mx.stack(rows) for uid, rows in logprobs.items()}, carrier


def decodes_as_plain(model, name: str, monkeypatch, layers_per_pass=None, matmul_rows=None):
    """Decode scenario `name` with mixed batches and with mlx-lm's own prefill passes; assert
    the same tokens and log-probabilities within float rounding. Returns the carrier."""
    monkeypatch.setattr(PromptProcessingBatch, "prompt", mixed_batch._prompt)
    with_mixing = _decode(model, name, True, layers_per_pass, matmul_rows)
    monkeypatch.setattr(PromptProcessingBatch, "prompt", mixed_batch._mlx_lm_prompt)
    plain = _decode(model, name, mixed=False)
    assert with_mixing[0] == plain[0]
    for uid, expected in plain[1].items():
        assert mx.abs(with_mixing[1][uid] - expected).max().item() < LOGPROB_TOLERANCE
    return with_mixing[2]


def test_the_tiny_model_is_supported(tiny_lm):
    assert mixed_batch.supports(tiny_lm)


@pytest.mark.parametrize("layers_per_pass", [None, 1])
@pytest.mark.parametrize("name", list(_scenarios()))
def test_decoding_is_mlx_lms(tiny_lm, monkeypatch, name, layers_per_pass):
    """Chunks carried whole, or through one of the tiny model's two layers per decode pass: mlx-lm
    then takes no more of the prompt, and lets no prompt join the prompt batch, until the chunk
    is through; a prompt that joins the decode batch, or a stream removed, meanwhile waits for
    it, and a chunk left when the decode batch empties goes through its other layers alone."""
    carrier = decodes_as_plain(tiny_lm, name, monkeypatch, layers_per_pass)
    if name in CARRIED_JOINS:
        assert carrier.joins_carried == CARRIED_JOINS[name]
    else:
        assert carrier.carried_tokens >= (
            400 if name == "beside a stream" else 64 / (2 if layers_per_pass else 1)
        )
    if name == "beside a stream":  # the 400-token prompt's last token rode in a decode pass
        assert carrier.joins_carried >= 1
    # the first prompts, with no decode batch to ride in, run at once with their last tokens
    assert carrier.idle_tokens > 0
    # a chunk kept when the decode batch empties (it ended or was removed) runs on its own
    assert (carrier.flushed_tokens > 0) == name.startswith("the stream")


@pytest.mark.parametrize("layers_per_pass", [None, 1])
@pytest.mark.parametrize("name", ["beside a stream", "a burst beside a stream"])
def test_matmuls_on_padded_rows_decode_as_mlx_lm(tiny_lm, monkeypatch, name, layers_per_pass):
    """The CPU policy runs a pass's matmuls on zero rows added up to a multiple of a block
    (`platform/matmul_rows.py`): decode rows alone, with a chunk carried, with part of a chunk's
    layers, and the logits of the joining rows; nothing of the padding reaches a real row."""
    padded = []

    def matmul_rows(rows: int) -> int:
        more = padded_rows(rows)
        padded.append(more > rows)
        return more

    carrier = decodes_as_plain(tiny_lm, name, monkeypatch, layers_per_pass, matmul_rows)
    assert carrier.carried_tokens > 0
    assert any(padded)  # passes that did pad


@pytest.mark.parametrize("layers_per_pass", [None, 1])
def test_a_quantized_model_decodes_as_with_mlx_lm(tiny_model, monkeypatch, layers_per_pass):
    """On a Mac a 4-bit model stays quantized: its embedding's weight is packed, so nothing may
    read the hidden size from it."""
    import mlx.nn as nn
    import mlx_lm

    model = mlx_lm.load(str(tiny_model))[0]
    nn.quantize(model, group_size=32, bits=4)
    carrier = decodes_as_plain(model, "beside a stream", monkeypatch, layers_per_pass)
    assert carrier.carried_tokens >= 400


def test_each_step_is_charged_for_the_chunk_its_pass_carried(tiny_lm, monkeypatch):
    """The pacer sizes chunks from step times, so a step must be charged for exactly the prompt
    tokens it computed: a chunk kept in one step rides in the next step's decode pass, which
    that step waits for (mlx-lm would only wait for it a step later)."""
    monkeypatch.setattr(PromptProcessingBatch, "prompt", mixed_batch._prompt)
    generator, carrier = mixed_generator(tiny_lm, 8)
    steps = []

    def next_step(generator: BatchGenerator):
        joins_before, idle_before = carrier.joins_carried, carrier.idle_tokens
        with generator.stats() as work:
            result = generator.next()
        paid = carrier.paid_tokens(work.prompt_tokens)
        joins = carrier.joins_carried - joins_before
        kept = 0 if carrier.idle_tokens > idle_before else carrier._taken  # idle: run at once
        steps.append((work.prompt_tokens, kept, paid, joins))
        return result

    decode_all(generator, _scenarios()["beside a stream"], next_step, max_steps=500)
    assert carrier.carried_tokens >= 400
    # mlx-lm schedules a prompt's last token in no chunk: it runs it when the prompt joins the
    # decode batch; a pass that carried it is charged for it
    scheduled, joins = sum(s[0] for s in steps), sum(s[3] for s in steps)
    assert joins >= 1
    assert sum(s[2] for s in steps) == scheduled + joins
    for before, now in zip(steps, steps[1:]):
        if before[1]:  # kept last step: carried, computed and charged in this one
            assert now[2] == now[0] - now[1] + before[1] + now[3]


def test_a_prompt_with_one_token_left_joins_beside_a_carried_one(tiny_lm, monkeypatch):
    """A prompt whose last token rode in a decode pass joins without a pass of its own; a prompt
    that arrives in that same step with only one token left (its prefix cached, say) still
    gets mlx-lm's pass, and each decodes as with mlx-lm alone."""
    monkeypatch.setattr(PromptProcessingBatch, "prompt", mixed_batch._prompt)
    rng = random.Random(5)
    stream, long_prompt, one_token = _prompt(rng, 10), _prompt(rng, 150), _prompt(rng, 1)

    def run(mixed: bool, one_token_at: int | None):
        generator, carrier = BatchGenerator(tiny_lm, prefill_step_size=16), None
        if mixed:
            generator, carrier = mixed_generator(tiny_lm, 16)
        inserts = {0: ([stream], [60]), 2: ([long_prompt], [12])}
        if one_token_at is not None:
            inserts[one_token_at] = ([one_token], [12])
        steps, by_uid = [], {}

        def next_step(generator: BatchGenerator):
            joins = carrier.joins_carried if carrier else 0
            result = generator.next()
            steps.append(carrier is not None and carrier.joins_carried > joins)
            for r in result[1]:
                by_uid.setdefault(r.uid, []).append((r.token, r.logprobs))
            return result

        decode_all(generator, inserts, next_step, max_steps=500)
        # the long prompt's (the stream's own, in the idle first step, rode in its chunk's pass)
        carried = [step for step, joined in enumerate(steps) if joined and step > 2]
        return (carried[0] if carried else None), by_uid

    carried_at, _ = run(mixed=True, one_token_at=None)
    assert carried_at is not None
    joined_at = carried_at  # the step whose pass carried it moves the prompt to decoding, after
    mixed_run = run(mixed=True, one_token_at=joined_at)[1]
    monkeypatch.setattr(PromptProcessingBatch, "prompt", mixed_batch._mlx_lm_prompt)
    plain_run = run(mixed=False, one_token_at=joined_at)[1]
    assert sorted(mixed_run) == sorted(plain_run) == [0, 1, 2]
    for uid, plain in plain_run.items():
        mixed = mixed_run[uid]
        assert [t for t, _ in mixed] == [t for t, _ in plain]
        gaps = mx.stack([a for _, a in mixed]) - mx.stack([b for _, b in plain])
        assert mx.abs(gaps).max().item() < LOGPROB_TOLERANCE


def test_decoding_in_groups_is_mlx_lms(tiny_lm, monkeypatch):
    """Every prompt joins the decode batch as a group of its own (`batch_join.KVGroups`, up to
    MAX_GROUPS, then merged): each group attended apart, rows leaving from the middle of a group
    and whole groups dropped, with the same tokens as mlx-lm's single rectangular batch."""
    rng = random.Random(11)
    inserts = {
        0: ([_prompt(rng, 12)], [90]),
        3: ([_prompt(rng, 300)], [25]),  # a deep group that leaves first
        20: ([_prompt(rng, 40), _prompt(rng, 40)], [8, 30]),  # one group; a row leaves its middle
        26: ([_prompt(rng, 60), _prompt(rng, 150)], [20, 20]),  # two groups, then merges
        30: ([_prompt(rng, 20)], [10]),
    }
    monkeypatch.setattr(PromptProcessingBatch, "prompt", mixed_batch._prompt)
    monkeypatch.setattr(batch_join, "MERGE_BUDGET_BYTES", 0)
    monkeypatch.setattr(batch_join, "MERGE_SLACK_POSITIONS", 0)
    monkeypatch.setattr(batch_join, "MERGE_SLACK_SHARE", 0)
    generator, _ = mixed_generator(tiny_lm, 32)
    seen_groups = []

    def next_step(generator: BatchGenerator):
        result = generator.next()
        seen_groups.append(len(batch_join.groups_of(generator._generation_batch.prompt_cache)))
        return result

    grouped = decode_all(generator, inserts, next_step, max_steps=500)
    monkeypatch.setattr(PromptProcessingBatch, "prompt", mixed_batch._mlx_lm_prompt)
    plain = decode_all(BatchGenerator(tiny_lm, prefill_step_size=32), inserts, max_steps=500)
    assert max(seen_groups) == batch_join.MAX_GROUPS
    assert grouped[0] == plain[0]
    assert mx.abs(grouped[1] - plain[1]).max().item() < LOGPROB_TOLERANCE


def test_a_prompt_removed_with_its_last_token_pending_leaves_nothing_behind(tiny_lm, monkeypatch):
    """A client that leaves while its prompt's final chunk, last token included, waits for a
    pass (or is part-way through the layers): the chunk is run for the caches' sake, and the
    logits it leaves for the prompt's move to the decode batch go with the prompt."""
    monkeypatch.setattr(PromptProcessingBatch, "prompt", mixed_batch._prompt)
    rng = random.Random(9)
    stream, long_prompt = _prompt(rng, 10), _prompt(rng, 150)
    for layers_per_pass in (None, 1):
        generator, carrier = mixed_generator(tiny_lm, 16)
        carrier.layers_per_pass = layers_per_pass
        generator.insert([stream], [100])
        generator.next()
        (uid,) = generator.insert([long_prompt], [5])
        for _ in range(100):
            generator.next()
            if carrier.pending is not None and carrier.pending.wants_logits:
                break
        assert carrier.pending is not None and carrier.pending.wants_logits
        generator.remove([uid])
        assert carrier.pending is None and carrier._join_logits == {}
        for _ in range(3):  # the stream goes on
            assert [r.uid for r in generator.next()[1]] == [0]
        generator.close()


def test_a_sequence_at_its_last_token_sits_out_the_pass_that_would_compute_one_more(
    tiny_lm, monkeypatch
):
    """mlx-lm computes a token ahead, so a sequence's last step ran a forward pass for a token
    it never emits: beside a 7,500-token prompt answering one token, the running stream's longest
    gap. A group whose rows all end sits that pass out; its KV and `all_tokens` (the prefix
    cache's key) then both stop a token short, and the stream beside it is unaffected."""
    monkeypatch.setattr(PromptProcessingBatch, "prompt", mixed_batch._prompt)
    monkeypatch.setattr(batch_join, "MERGE_BUDGET_BYTES", 0)  # the long prompt: a group of its own
    monkeypatch.setattr(batch_join, "MERGE_SLACK_POSITIONS", 0)
    monkeypatch.setattr(batch_join, "MERGE_SLACK_SHARE", 0)
    rng = random.Random(5)
    stream, long_prompt = _prompt(rng, 10), _prompt(rng, 200)
    inserts = {0: ([stream], [40]), 2: ([long_prompt], [1])}
    finished = {}

    def next_step(generator: BatchGenerator):
        result = generator.next()
        finished.update((r.uid, r) for r in result[1] if r.finish_reason is not None)
        return result

    generator, _ = mixed_generator(tiny_lm, 32)
    tokens, logprobs = decode_all(generator, inserts, next_step, max_steps=300)
    assert len(finished[1].all_tokens) == len(long_prompt)  # its one token had no pass
    assert len(finished[0].all_tokens) == len(stream) + 40 - 1
    for r in finished.values():
        assert all(layer.offset == len(r.all_tokens) for layer in r.prompt_cache)
    monkeypatch.setattr(PromptProcessingBatch, "prompt", mixed_batch._mlx_lm_prompt)
    plain = decode_all(BatchGenerator(tiny_lm, prefill_step_size=32), inserts, max_steps=300)
    assert tokens == plain[0]
    assert mx.abs(logprobs - plain[1]).max().item() < LOGPROB_TOLERANCE


def _random_language_model(family: str):
    """A random-weight mlx-lm model of `family` the size of the tiny Llama: Qwen2 (biased QKV),
    Qwen3 (per-head q and k norms), and Qwen3-VL's wrapper of its Qwen3 language model."""
    import importlib

    text = {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rms_norm_eps": 1e-6,
        "vocab_size": 1024,
        "max_position_embeddings": 2048,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
    }
    name = {"qwen3-vl": "qwen3_vl"}.get(family, family)
    module = importlib.import_module(f"mlx_lm.models.{name}")
    if family == "qwen3-vl":
        args = module.ModelArgs.from_dict(
            {"model_type": name, "text_config": {"model_type": "qwen3", **text}}
        )
    else:
        args = module.ModelArgs.from_dict({"model_type": name, **text})
    mx.random.seed(3)
    model = module.Model(args)
    mx.eval(model.parameters())
    return model


@pytest.mark.parametrize("layers_per_pass", [None, 1])
@pytest.mark.parametrize("name", ["beside a stream", "a burst beside a stream"])
@pytest.mark.parametrize("family", ["qwen2", "qwen3", "qwen3-vl"])
def test_qwen_families_decode_as_mlx_lm(monkeypatch, family, name, layers_per_pass):
    """Qwen2's and Qwen3's layers (and a Qwen3-VL's language model, inside its wrapper) carry
    prompt chunks in decode passes as Llama's do: the same tokens and logprobs as mlx-lm's own
    prefill passes, the joining prompts' last tokens riding in them."""
    model = _random_language_model(family)
    assert mixed_batch.supports(model)
    carrier = decodes_as_plain(model, name, monkeypatch, layers_per_pass)
    assert carrier.carried_tokens > 0
    if name in CARRIED_JOINS:
        assert carrier.joins_carried == CARRIED_JOINS[name]


def test_a_prompts_last_token_goes_through_every_layer_in_one_pass(tiny_lm, monkeypatch):
    """A chunk of a few tokens (a short prompt, its last token joining) is not spread over passes
    at the pacer's layers a pass: it costs the pass a row or two, and spread, it held the
    prompt's first token for as many steps. Its tokens are still mlx-lm's."""
    monkeypatch.setattr(PromptProcessingBatch, "prompt", mixed_batch._prompt)
    rng = random.Random(11)
    stream, short = _prompt(rng, 10), _prompt(rng, 3)

    def first_token_step(one_pass_tokens: int):
        monkeypatch.setattr(mixed_batch, "ONE_PASS_TOKENS", one_pass_tokens)
        generator, carrier = mixed_generator(tiny_lm, 16)
        carrier.layers_per_pass = 1  # of the tiny model's two
        steps = [0]

        def next_step(generator: BatchGenerator):
            steps[0] += 1
            result = generator.next()
            if any(r.uid == 1 for r in result[1]) and len(steps) == 1:
                steps.append(steps[0])
            return result

        tokens, _ = decode_all(generator, {0: ([stream], [30]), 3: ([short], [4])}, next_step)
        return steps[1], tokens

    at_once, tokens = first_token_step(mixed_batch.ONE_PASS_TOKENS)
    spread, same = first_token_step(0)
    assert at_once < spread and tokens == same
    monkeypatch.setattr(PromptProcessingBatch, "prompt", mixed_batch._mlx_lm_prompt)
    plain, _ = decode_all(
        BatchGenerator(tiny_lm, prefill_step_size=16), {0: ([stream], [30]), 3: ([short], [4])}
    )
    assert tokens == plain
