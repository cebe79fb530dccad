"""Tools a client asks the provider itself to run: OpenAI's web search, file search, code
interpreter, ...; Anthropic's server tools (web search, code execution, ...). This server runs
none of them, and the clients that send them by default (Codex, Claude Code) work without them:
they are left out of the model's prompt and named in the log, once per set of names, or refused
with 400 under --strict-tools."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from .errors import InvalidRequest
from .log_once import FirstSight

log = logging.getLogger("mlxserve.api")
_noted = FirstSight()


def leave_out(dropped: Sequence[tuple[str, str]], strict: bool, route: str) -> None:
    """`dropped`: (param, tool type) of each hosted tool in a request. With `strict`, a 400
    naming the first; else one INFO line naming them all (the first time these are seen)."""
    if not dropped:
        return
    if strict:
        param, kind = dropped[0]
        raise InvalidRequest(
            f"Tool type {kind!r} in {param} runs on the provider's servers, and this server runs "
            "none (--strict-tools): send function tools, which the client runs.",
            param=f"{param}.type",
            code="unsupported_tool_type",
        )
    kinds = sorted({kind for _, kind in dropped})
    if _noted.first(f"{route}:{','.join(kinds)}"):
        log.info(
            "%s: left out of the prompt, as this server runs no hosted tools: %s "
            "(--strict-tools refuses them)",
            route,
            ", ".join(kinds),
        )
