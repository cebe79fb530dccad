"""The mlx-lm internals this package relies on, checked by name.

Each entry is (owner, attribute, what uses it). Methods and class attributes are checked on the
class; data attributes on an empty instance built as mlx-lm builds them.
"""

from __future__ import annotations

from mlx_lm.generate import BatchGenerator, GenerationBatch, PromptProcessingBatch
from mlx_lm.models import nemotron_h
from mlx_lm.models.cache import (
    BatchKVCache,
    BatchRotatingKVCache,
    KVCache,
    LRUPromptCache,
    TokenBuffer,
)

REQUIRED: dict[str, list[tuple[str, str]]] = {
    "BatchGenerator": [
        ("_next", "generator.py: the step mixed batches wrap"),
        ("remove", "generator.py: a kept chunk runs before rows leave"),
        ("extract_cache", "generator.py: a kept chunk runs before caches are read"),
        ("insert", "engine.py: sequences join with their caches and all_tokens"),
        ("stats", "engine.py: prompt tokens computed per step"),
    ],
    "BatchGenerator()": [
        ("_prompt_batch", "mixed_batch.py, kv_reserve.py: the prompt batch"),
        ("_generation_batch", "mixed_batch.py, kv_reserve.py, generator.py: the decode batch"),
        ("_currently_processing", "pacing and mixed_batch.py: each prompt's segments"),
        ("prefill_step_size", "engine.py: the pacer's chunk"),
        ("prefill_batch_size", "mixed_batch.py: held while a chunk spans passes"),
        ("_unprocessed_sequences", "failed_step.py: prompts waiting, dropped after a failure"),
    ],
    "PromptProcessingBatch": [
        ("prompt", "mixed_batch.py: a chunk is kept for the next decode pass"),
        ("split", "batch_join.py: a whole batch moves instead of being copied"),
        ("generate", "mixed_batch.py: prompts join from carried logits"),
        ("empty", "contract.py"),
    ],
    "PromptProcessingBatch()": [
        (name, "batch_join.py: the lists a split moves")
        for name in ("uids", "prompt_cache", "tokens", "samplers", "logits_processors")
    ]
    + [("max_tokens", "batch_join.py"), ("stop_sequences", "batch_join.py")]
    + [("prefill_step_size", "generator.py: forward passes of a prompt chunk")],
    "GenerationBatch": [
        ("extend", "mixed_batch.py: joins go through batch_join"),
        ("next", "generator.py: a decode pass's responses kept in case a later pass fails"),
        ("_step", "decode_step.py: the step, with rows drawn in groups"),
    ],
    "GenerationBatch()": [
        ("model", "mixed_batch.py: the decode pass carries prompt chunks"),
        ("_next_tokens", "mixed_batch.py, lockstep_tokens.py: the sampled tokens"),
        ("_num_tokens", "mixed_batch.py: rows at their last token"),
        ("max_tokens", "mixed_batch.py: rows at their last token"),
        ("uids", "prefix_cache.py: running prompts copied"),
        ("tokens", "engine.py: a running prompt's tokens"),
        ("prompt_cache", "prefix_cache.py, kv_reserve.py: the decode batch's KV"),
        ("_next_logprobs", "failed_step.py: a paused row's sampled token's logprobs"),
        ("_token_context", "failed_step.py: processors' contexts as before a failed step"),
    ]
    + [
        (name, "decode_step.py: the step's state, as mlx-lm keeps it")
        for name in ("_current_tokens", "_current_logprobs", "fallback_sampler")
    ]
    + [
        (name, "failed_step.py: a paused row's sampling, back as it was")
        for name in ("samplers", "logits_processors", "stop_sequences")
    ],
    "BatchKVCache": [
        ("extend", "batch_join.py: one copy per join"),
        ("filter", "batch_join.py: trim before gathering"),
        ("extract", "batch_join.py: a row handed out as it is"),
    ],
    "BatchKVCache()": [
        ("_idx", "batch_join.py, kv_reserve.py: positions used"),
        ("left_padding", "batch_join.py: rows' padding"),
        ("keys", "batch_join.py"),
        ("values", "batch_join.py"),
        ("offset", "batch_join.py"),
    ],
    "KVCache()": [("keys", "prefix_cache.py"), ("values", "prefix_cache.py")],
    "TokenBuffer()": [
        ("_size", "failed_step.py, speculative_step.py: a context's length"),
        ("_buffer", "speculative_step.py: the tokens a grammar has not read"),
    ],
    "LRUPromptCache()": [("_trie", "prefix_cache.py: what a prompt would reuse, uncopied")],
    "NemotronHMamba2Mixer": [("_ssm", "ssm_lengths.py: its state stops at each row's length")],
    "nemotron_h": [("ssm_update", "ssm_lengths.py: given the rows' lengths")],
    "BatchRotatingKVCache": [
        ("_update_concat", "window_prefill.py: a padded one-token pass"),
        ("update_and_fetch", "window_prefill.py"),
    ],
}


class MlxLmContractError(RuntimeError):
    """mlx-lm no longer has an internal this server relies on."""


def _owners() -> dict[str, object]:
    return {
        "BatchGenerator": BatchGenerator,
        "BatchGenerator()": _empty_generator(),
        "PromptProcessingBatch": PromptProcessingBatch,
        "PromptProcessingBatch()": PromptProcessingBatch.empty(None, None, prefill_step_size=1),
        "GenerationBatch": GenerationBatch,
        "GenerationBatch()": GenerationBatch.empty(None, None),
        "BatchKVCache": BatchKVCache,
        "BatchKVCache()": BatchKVCache(left_padding=[0]),
        "BatchRotatingKVCache": BatchRotatingKVCache,
        "KVCache()": KVCache(),
        "TokenBuffer()": TokenBuffer(),
        "LRUPromptCache()": LRUPromptCache(),
        "NemotronHMamba2Mixer": nemotron_h.NemotronHMamba2Mixer,
        "nemotron_h": nemotron_h,
    }


def _empty_generator() -> BatchGenerator:
    """A generator without a model: its constructor only stores it."""
    return BatchGenerator(None)


def missing() -> list[str]:
    """Every required internal that is gone, as 'Owner.attribute (who uses it)'."""
    try:
        owners = _owners()
    except Exception as error:  # a constructor's signature moved
        return [f"building an empty mlx-lm batch failed: {error!r}"]
    gone = []
    for owner_name, attributes in REQUIRED.items():
        owner = owners[owner_name]
        for attribute, user in attributes:
            present = attribute in vars(owner) if not isinstance(owner, type) else None
            if not (present or hasattr(owner, attribute)):
                gone.append(f"{owner_name.rstrip('()')}.{attribute} ({user})")
    return gone


def check_contract() -> None:
    """Raise MlxLmContractError naming every internal mlx-lm no longer has."""
    gone = missing()
    if gone:
        import mlx_lm

        raise MlxLmContractError(
            f"mlx-lm {mlx_lm.__version__} moved internals mlxserve relies on: "
            + "; ".join(gone)
            + ". Pin mlx-lm to the version in pyproject.toml or update engine/mlx_lm_compat/."
        )
