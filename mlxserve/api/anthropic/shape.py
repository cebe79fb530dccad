"""Anthropic's wire details: its error shape, `{"type": "error", "error": {"type", "message"}}`,
with its error types by status (the app's handlers use it on /v1/messages paths). Its stream's
events, each named on an `event:` line, are `responses.named_sse`'s."""

from __future__ import annotations

from typing import Any

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
}


def is_anthropic_path(path: str) -> bool:
    return path == "/v1/messages" or path.startswith("/v1/messages/")


CONTEXT_ERRORS = ("context_length_exceeded", "prompt_too_long")


def anthropic_error(body: dict[str, Any], status: int) -> dict[str, Any]:
    """An OpenAI-shaped error body in Anthropic's shape (same status). A prompt that does not fit
    is worded as Anthropic words it, `prompt is too long: N tokens > M maximum`: Claude Code
    reads that to compact its conversation and try again."""
    kind = ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    error = body["error"]
    message = error["message"]
    prompt, context = error.get("n_prompt_tokens"), error.get("n_ctx")
    if error.get("code") in CONTEXT_ERRORS and prompt is not None and context is not None:
        if error["code"] == "prompt_too_long" or prompt >= context:
            message = f"prompt is too long: {prompt} tokens > {context} maximum"
    return {"type": "error", "error": {"type": kind, "message": message}}
