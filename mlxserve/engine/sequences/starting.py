"""How a sequence enters the batch: from the prefix cache's KV, from its own scored prompt (echo
with logprobs), or as a warm-up that only prefills."""

from __future__ import annotations

from mlx_lm.generate import StopSequences
from mlx_lm.models.cache import can_trim_prompt_cache, trim_prompt_cache

from ..mlx_lm_compat import ServerBatchGenerator
from ..models.host import LoadedModel
from ..prefix.checkpoints import segments
from ..prefix.keeper import PrefixKeeper
from ..requests import GenerationEvent, GenerationRequest
from .prompt_scoring import score_prompt
from .state import SequenceState, sampling_setup


def start_sequence(
    index: int,
    request: GenerationRequest,
    post,
    loaded: LoadedModel,
    generator: ServerBatchGenerator,
    prefixes: PrefixKeeper,
) -> SequenceState:
    """The sequence's state, inserted into `generator` (its `uid` stays None when nothing is to
    be generated: its one event is posted already)."""
    prompt = list(request.prompt_ids)
    outside = [t for t in prompt if not 0 <= t < loaded.vocab_size]
    if outside:  # the model would read out of its embedding's bounds
        raise ValueError(
            f"token id {outside[0]} is outside the vocabulary [0, {loaded.vocab_size})"
        )
    seq = SequenceState.start(index, request, post, loaded.tokenizer)
    insert_sequence(seq, loaded, generator, prefixes)
    return seq


def insert_sequence(
    seq: SequenceState,
    loaded: LoadedModel,
    generator: ServerBatchGenerator,
    prefixes: PrefixKeeper,
    again: bool = False,
) -> None:
    """Give `seq` a row in `generator` (none when nothing is to be generated: its one event is
    posted then). `again`: a prompt that left the batch before its first token (a failed step)
    starts over, sampling afresh; its prompt's events are out already."""
    request, index, post = seq.request, seq.index, seq.post
    prompt = list(request.prompt_ids)
    cache, cached_tokens = None, []
    if request.prompt_logprobs:
        cache, prompt_tokens = score_prompt(loaded, prompt, seq.logprob_reader)
        cached_tokens = prompt[:-1]
        if not again:
            post(GenerationEvent(index=index, prompt_tokens=prompt_tokens))
    elif request.images:
        cache, prompt, reused, hit, seq.prefix_key = _with_images(loaded, request, prefixes)
        cached_tokens = _riding(generator, cache, prompt, prompt[:reused])
        seq.cached_tokens = min(hit, len(cached_tokens))
    elif request.cache_prompt and prefixes.enabled:
        cache, reused = prefixes.fetch(prompt)
        cached_tokens = _riding(generator, cache, prompt, prompt[:reused])
        seq.cached_tokens = len(cached_tokens)
    if request.max_tokens == 0:
        if not (request.cache_prompt and prefixes.enabled) or request.prompt_logprobs:
            post(GenerationEvent(index=index, finish_reason="length"))
            return
        # A warm-up (llama.vim's n_predict 0): prefill for the prefix cache; the one token
        # generated to get there is dropped.
        seq.prefill_only = True
    setup = sampling_setup(request, loaded)
    seq.guard = setup.guard
    if setup.sampler.keep_final:
        seq.sampler = setup.sampler
    start = len(cached_tokens)
    if prefixes.checkpointing and request.cache_prompt and not request.images:
        pieces = segments(prompt, start, request.checkpoints)
    else:
        pieces = [prompt[start:]]
    (seq.uid,) = generator.insert_segments(
        [pieces],
        max_tokens=[max(request.max_tokens, 1)],
        caches=[cache] if cache is not None else None,
        all_tokens=[cached_tokens],
        samplers=[setup.guarded_sampler],
        logits_processors=[setup.processors],
        stop_sequences=[StopSequences([[t] for t in setup.stop_ids] or None)],
    )
    if generator.planner is not None and drafts_alone(seq, setup):
        generator.planner.admit(seq.uid, request.num_draft_tokens)


def _riding(generator: ServerBatchGenerator, cache, prompt: list[int], cached: list[int]):
    """The cached tokens a sequence starts from: all of `cached`, or, for a prompt cached but
    for its last token beside running streams, one fewer. Its last token alone would join in
    a forward pass of its own (mlx-lm's) beside the decode pass; with one more token to read, it
    rides in the decode pass as a chunk, its last token with it (mixed_batch.py)."""
    if (
        cache is None
        or generator.mixed is None
        or len(prompt) - len(cached) != 1
        or len(cached) < 2
        or not len(generator.decode_batch)
        or not can_trim_prompt_cache(cache)
    ):
        return cached
    trim_prompt_cache(cache, 1)
    return cached[:-1]


def _with_images(loaded: LoadedModel, request: GenerationRequest, prefixes: PrefixKeeper):
    """A prompt with images: (the KV of its first tokens, its tokens with each image's
    placeholder expanded, how many the KV holds, how many of them came from the prefix cache,
    its prefix cache key or None). The KV comes from the
    prefix cache where it holds every image of the prompt (the rest is text, which the batch
    reads), else from the model's image side, which prefills all but the last token. Each
    layer's cache carries the row's position shift (mlx_lm_compat/rope_shift.py)."""
    from mlx_lm.models.cache import make_prompt_cache

    vision = loaded.vision
    if vision is None:
        raise ValueError(f"the model {loaded.model_id} does not take images")
    prepared = vision.prepare(request.prompt_text, list(request.images))
    keyed = request.cache_prompt and prefixes.enabled
    cache, reused, hit, shift = None, 0, 0, vision.known_shift(prepared)
    handed = vision.take_handed(prepared)  # prefilled in passes for it (image_prefill.py)
    if handed is not None:
        cache, reused, shift = handed.cache, len(prepared.tokens) - 1, handed.rope_shift
    elif keyed and shift is not None:
        cache, reused = prefixes.fetch(prepared.key)
        if cache is not None and reused < prepared.images_end:
            cache, reused = None, 0  # it ends inside the images: they are read again
        hit = reused
    if cache is None:
        prefilled = vision.prefill(prepared, lambda: make_prompt_cache(loaded.model))
        cache, reused, shift = prefilled.cache, len(prepared.tokens) - 1, prefilled.rope_shift
    for layer in cache:
        layer.rope_shift = shift
    return cache, prepared.tokens, reused, hit, prepared.key if keyed else None


def drafts_alone(seq: SequenceState, setup) -> bool:
    """Whether the sequence's tokens can be drafted and verified as the batch's verify pass
    does: its logits as the model gives them but for bans of fixed ids (ignore_eos), which hold
    at every position alike, and a grammar, whose mask at each drafted position the pass asks
    of it (no penalties, DRY or min_tokens, which change token by token); greedy, or sampled
    by a chain that speculative sampling can run at every position (not mirostat or XTC), with
    no per-draw record (post_sampling_probs). A sampled row drafts only when its request asks
    (`num_draft_tokens`): its tokens would otherwise depend on the drafts each step verifies,
    so on the batch beside it and the step timings, and a seed would no longer fix them."""
    sampler, asked = setup.sampler, seq.request.num_draft_tokens
    return (
        (sampler.params.greedy or bool(asked))
        and sampler.verifies_drafts
        and all(p.ban is not None or p.grammar is not None for p in setup.processors)
        and not seq.prefill_only
    )
