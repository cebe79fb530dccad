"""llama.cpp's GET /slots: one entry per row of the batch, what it runs and how far it got, for
dashboards and for clients that look for a free slot (`?fail_on_no_slot=1`).

Slot save, restore and erase (POST /slots/<id>?action=...) are refused with a 501: the prefix
cache keeps prompts by their tokens, not by slot, and outlives any one slot's request.
"""

from __future__ import annotations

from typing import Any

from quart import Blueprint, request
from quart_schema import document_querystring

from ...engine import MAX_BATCH, GenerationRequest, RunningSlot
from ...planning.defaults import DRY
from ..dispatch import ready_model
from ..errors import APIError, NotSupported, ServiceUnavailable
from .protocol import SlotActionQuery, SlotsQuery

blueprint = Blueprint("llamacpp_slots", __name__)


@blueprint.get("/slots")
@document_querystring(SlotsQuery)
async def get_slots():
    engine, loaded = await ready_model(request.args.get("model"))  # llama.cpp's router mode
    if fail_on_no_slot() and engine.pending_sequences >= MAX_BATCH:
        raise ServiceUnavailable("no slot available", code="no_slot_available")
    running = {r.slot: r for r in await engine.running_slots()}
    return [slot_view(i, running.get(i), loaded.context_length) for i in range(MAX_BATCH)]


def fail_on_no_slot() -> bool:
    raw = request.args.get("fail_on_no_slot")
    if raw is None:
        return False
    try:
        return int(raw) != 0
    except ValueError:
        raise APIError(
            f"fail_on_no_slot must be an integer, got {raw!r}", param="fail_on_no_slot"
        ) from None


@blueprint.post("/slots/<id_slot>")
@document_querystring(SlotActionQuery)
async def act_on_slot(id_slot: str):
    action = request.args.get("action", "")
    if action not in ("save", "restore", "erase"):
        raise APIError(f"Invalid action: {action!r} (save, restore or erase)", param="action")
    raise NotSupported(
        f"slot {action} is not supported: the prefix cache keeps every prompt's KV by its "
        "tokens, so a request that repeats a prompt reuses it without a saved slot"
    )


def slot_view(slot: int, running: RunningSlot | None, n_ctx: int) -> dict[str, Any]:
    """llama.cpp's slot object: idle, or the sequence in it."""
    view: dict[str, Any] = {
        "id": slot,
        "id_task": -1,
        "n_ctx": n_ctx,
        "speculative": False,
        "is_processing": running is not None,
    }
    if running is None:
        view["next_token"] = next_token(has_new_line=False, remain=-1, decoded=0)
        return view
    request_ = running.request
    view["id_task"] = running.group_id
    view["params"] = slot_params(request_)
    view["next_token"] = next_token(
        has_new_line=running.seen_newline,
        remain=request_.max_tokens - running.generated,
        decoded=running.generated,
    )
    return view


def next_token(has_new_line: bool, remain: int, decoded: int) -> dict[str, Any]:
    return {
        "has_next_token": True,
        "has_new_line": has_new_line,
        "n_remain": remain,
        "n_decoded": decoded,
    }


def slot_params(request_: GenerationRequest) -> dict[str, Any]:
    """The settings a sequence runs with, in llama.cpp's names (its slot `params`)."""
    sampling, stop = request_.sampling, request_.stop
    dry = sampling.dry or DRY
    return {
        "n_predict": request_.max_tokens,
        "seed": request_.seed,
        "temperature": sampling.temperature,
        "dynatemp_range": sampling.dynatemp_range,
        "dynatemp_exponent": sampling.dynatemp_exponent,
        "top_k": sampling.top_k,
        "top_p": sampling.top_p,
        "min_p": sampling.min_p,
        "top_n_sigma": sampling.top_n_sigma,
        "xtc_probability": sampling.xtc_probability,
        "xtc_threshold": sampling.xtc_threshold,
        "typical_p": sampling.typical_p,
        "repeat_last_n": sampling.repeat_last_n,
        "repeat_penalty": sampling.repetition_penalty,
        "presence_penalty": sampling.presence_penalty,
        "frequency_penalty": sampling.frequency_penalty,
        "dry_multiplier": dry.multiplier,
        "dry_base": dry.base,
        "dry_allowed_length": dry.allowed_length,
        "dry_penalty_last_n": dry.penalty_last_n,
        "mirostat": sampling.mirostat,
        "mirostat_tau": sampling.mirostat_tau,
        "mirostat_eta": sampling.mirostat_eta,
        "max_tokens": request_.max_tokens,
        "ignore_eos": stop.ignore_eos,
        "n_probs": request_.logprobs or 0,
        "stop": list(stop.strings),
        "n_indent": stop.min_indent,
        "samplers": list(sampling.samplers),
        "cache_prompt": request_.cache_prompt,
    }
