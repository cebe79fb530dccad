"""Every architecture through the engine's features: a tiny random model a family (mlx-lm's own
classes, mlxserve/tiny_families.py), each kind of cache (plain KV, sliding windows, linear
attention and state space, MLA), held to the same answers alone, in a batch, from the prefix
cache and with drafts as a plain greedy run of the same engine gives.

One family a kind of cache runs in `make test`; the rest are marked `families` (make
test-families, after make test in .ci/run)."""

from __future__ import annotations

import asyncio

import pytest

from mlxserve.engine import Engine, GenerationRequest, StopSpec
from mlxserve.engine.mlx_lm_compat import mixed_batch
from mlxserve.families import family_of
from mlxserve.planning.model_facts import MIXED_BATCHES
from mlxserve.sampling.params import SamplingParams
from mlxserve.settings import SpeculationSettings
from mlxserve.tiny_families import FAMILIES, VOCAB_SIZE, build_tiny_family

# One family for each kind of cache mlx-lm keeps beside the plain KV the rest of the suite runs
# on (a tiny Llama): linear attention beside attention, sliding windows beside global layers,
# MLA's latent KV.
EVERY_KIND = ("qwen3_5", "gemma3_text", "deepseek_v3")
PLAIN = ("kv",)
GREEDY = SamplingParams(temperature=0.0)
ANSWER = 16
# A prompt past the sliding windows (64) and long enough to need a few chunks
LONG = [(i * 7 + 3) % 900 + 20 for i in range(300)]
EVERY_TOKEN = [(i * 389 + 5) % VOCAB_SIZE for i in range(VOCAB_SIZE)]


def family_params():
    return [
        pytest.param(f, marks=() if f in EVERY_KIND else pytest.mark.families, id=f)
        for f in FAMILIES
    ]


@pytest.fixture(scope="module", params=family_params())
def family(request, tmp_path_factory):
    """(family, its folder, an engine without prefix cache or drafts, one with both, drafting
    all it finds)."""
    name = request.param
    folder = build_tiny_family(name, tmp_path_factory.getbasetemp() / "families" / name)
    # on one thread, as the server's pool runs its models: MLX's compiled functions (the
    # state-space layers') are not to be traced on two threads at once
    plain = Engine(str(folder), prefix_cache_bytes=0, speculation=None).start()
    thread = plain.thread
    # drafting all it finds, from a single token on: whatever a random model answers, a prompt
    # holding every token (`EVERY_TOKEN`) gives its next step drafts
    drafting = SpeculationSettings(fixed_width=True, ngram_min=1)
    full = Engine(str(folder), thread=thread, speculation=drafting)
    full.start()
    for engine in (plain, full):
        assert engine.wait_ready(300), engine.error
    yield name, plain, full
    plain.stop()
    full.stop()


def request(prompt, checkpoints=()) -> GenerationRequest:
    return GenerationRequest(
        prompt_ids=tuple(prompt),
        max_tokens=ANSWER,
        sampling=GREEDY,
        seed=0,
        stop=StopSpec(ignore_eos=True),
        checkpoints=tuple(checkpoints),
    )


def run(engine: Engine, requests) -> list[dict]:
    """Each sequence's tokens, cached tokens and drafts, in order; an error fails the test."""

    async def collect():
        rows = [{"tokens": []} for _ in requests]
        async for event in engine.submit(requests):
            assert event.error is None, event.error
            rows[event.index]["tokens"] += event.token_ids
            if event.finished:
                rows[event.index]["cached"] = event.cached_tokens
                rows[event.index]["drafted"] = event.timings.draft_tokens
                rows[event.index]["kept"] = event.timings.draft_accepted
        return rows

    return asyncio.run(collect())


def tokens(rows: list[dict]) -> list[list[int]]:
    return [row["tokens"] for row in rows]


def test_its_cache_kinds_and_what_is_off_are_said(family):
    name, _, full = family
    loaded = full.loaded
    assert loaded.cache_kinds, name
    # the family home (mlxserve/families.py) names it, and what its layers may keep
    home = family_of(type(mixed_batch.language_of(loaded.model)).__module__)
    assert home is not None, f"{name}: no family in mlxserve/families.py runs it"
    assert set(loaded.cache_kinds) <= set(home.caches), (name, loaded.cache_kinds, home)
    assert (MIXED_BATCHES not in loaded.features_off) == home.mixed_batches, name
    assert "speculation" not in loaded.features_off  # rolled back by trimming, or fed again
    if loaded.cache_kinds != PLAIN:
        assert "failed-row isolation" in loaded.features_off
        assert loaded.keeps_checkpoints


# Mamba-2 hybrids whose batched rows now and then answer otherwise than alone under the CPU
# backend's vectorised attention (mlxserve/platform/attention.py), never under MLX's own kernel
# (the portable pass; and granitemoehybrid 0 in 6 runs with that kernel swapped in, 1-4 in 6
# without): not yet understood. A Mac's GPU never takes that path.
UNSTEADY_UNDER_CPU_ATTENTION = ("granitemoehybrid", "nemotron_h")


def skip_where_the_cpu_attention_moves_it(name: str, engine: Engine) -> None:
    if name in UNSTEADY_UNDER_CPU_ATTENTION and engine.policy.cpu_tricks:
        pytest.skip(f"{name}'s batches under the CPU backend's attention (portable pass only)")


def test_rows_of_unequal_lengths_in_a_batch_answer_as_alone(family):
    name, plain, _ = family
    skip_where_the_cpu_attention_moves_it(name, plain)
    prompts = [LONG, LONG[:40], LONG[100:220]]
    alone = [tokens(run(plain, [request(p)]))[0] for p in prompts]
    assert tokens(run(plain, [request(p) for p in prompts])) == alone


def test_the_prefix_cache_reuses_a_repeat_and_a_continuation_without_changing_answers(family):
    name, plain, full = family
    first = run(full, [request(LONG)])[0]
    assert first["tokens"] == tokens(run(plain, [request(LONG)]))[0]
    again = run(full, [request(LONG)])[0]
    assert again["tokens"] == first["tokens"]
    assert again["cached"] == len(LONG) - 1, name  # all but the last token, read again
    # the next turn: the prompt, its answer and more
    turn = LONG + first["tokens"] + [30, 31, 32, 33, 34]
    later = run(full, [request(turn)])[0]
    assert later["tokens"] == tokens(run(plain, [request(turn)]))[0]
    assert later["cached"] >= len(LONG) + ANSWER - 1, name


def test_a_prompt_sharing_part_of_another_resumes_from_the_mark_they_share(family):
    """Another ending after a shared part (another user message after the same system
    prompt): a model that keeps positions reuses what they share; one that keeps checkpoints,
    the mark the front set at the shared part's end."""
    name, plain, full = family
    shared = LONG[:200]
    run(full, [request(shared + [40] * 60, checkpoints=[200])])
    other = shared + [50, 51, 52] * 20
    answer = run(full, [request(other, checkpoints=[200])])[0]
    assert answer["tokens"] == tokens(run(plain, [request(other)]))[0]
    assert answer["cached"] >= 200, name


def test_choices_of_one_prompt_start_from_the_first_ones_prefill(family):
    """n / best_of: the second choice waits for the first one's prompt and starts from it."""
    name, plain, full = family
    prompt = LONG[50:250]
    choices = run(full, [request(prompt), request(prompt)])
    alone = tokens(run(plain, [request(prompt)]))[0]
    assert choices[0]["tokens"] == choices[1]["tokens"] == alone
    assert choices[1]["cached"] >= len(prompt) - 2, name


def test_a_restarted_engine_reads_a_long_prompt_back_from_disk(family, tmp_path):
    """The disk tier: a plain-KV model's segments, another's checkpoints of its whole state."""
    name, plain, _ = family
    prompt = [(i * 11 + 5) % 900 + 20 for i in range(1100)]
    disk = {"prefix_cache_dir": tmp_path, "prefix_cache_disk_bytes": 1 << 30}
    for attempt in ("writes", "reads"):
        engine = Engine(plain.model_source, thread=plain.thread, speculation=None, **disk)
        engine.start()
        assert engine.wait_ready(300), engine.error
        answer = run(engine, [request(prompt)])[0]
        engine.stop()  # what waits for the disk is written as it stops
        if attempt == "writes":
            assert answer["cached"] == 0
    assert answer["cached"] >= len(prompt) - 1, name
    assert answer["tokens"] == tokens(run(plain, [request(prompt)]))[0]


def test_drafts_never_change_a_greedy_answer(family):
    name, plain, full = family
    skip_where_the_cpu_attention_moves_it(name, plain)
    prompts = [EVERY_TOKEN, LONG[:90], [60, 61, 62, 63, 64, 65, 66, 67] * 12]
    drafted = run(full, [request(p) for p in prompts])
    assert tokens(drafted) == tokens(run(plain, [request(p) for p in prompts]))
    kept, verified = (sum(row[key] for row in drafted) for key in ("kept", "drafted"))
    # (what a verify pass that rejects some leaves a state: tests/engine/test_state_rollback.py)
    assert verified > 0, f"{name}: no drafts were verified ({kept} kept)"


def test_quantized_kv_packs_a_hybrids_attention_layers_and_leaves_its_states(tmp_path):
    """--kv-bits on Qwen3.5: its attention layers' KV packed, its linear-attention states as
    they are; batches and the prefix cache as without. gpt-oss's sinks are refused at load."""
    from mlx_lm.models.cache import make_prompt_cache

    folder = build_tiny_family("qwen3_5", tmp_path / "qwen3_5")
    engine = Engine(str(folder), kv_bits=8, kv_group_size=32, speculation=None).start()
    assert engine.wait_ready(300), engine.error
    kinds = [type(c).__name__ for c in make_prompt_cache(engine.loaded.model)]
    assert kinds == ["ArraysCache", "QuantizedRowKVCache"] * 2
    alone = [tokens(run(engine, [request(p)]))[0] for p in (LONG, LONG[:40])]
    assert tokens(run(engine, [request(LONG), request(LONG[:40])])) == alone
    again = run(engine, [request(LONG)])[0]
    assert again["tokens"] == alone[0] and again["cached"] == len(LONG) - 1
    engine.stop()
    sinks = build_tiny_family("gpt_oss", tmp_path / "gpt_oss")
    refused = Engine(str(sinks), kv_bits=8, kv_group_size=32, speculation=None).start()
    assert not refused.wait_ready(300)
    assert "sinks" in refused.error
    refused.stop()
