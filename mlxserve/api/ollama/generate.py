"""POST /api/generate: Ollama's completion. A `raw` prompt, or one with a `suffix` (the model's
fill-in-the-middle prompt), is planned as /v1/completions plans it; otherwise `system` and
`prompt` are rendered by the chat template and planned as chat is."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from quart import Blueprint, current_app
from quart_schema import document_request

from ...planning.chat import prepare
from ..dispatch import plan_on
from ..parsing import read_json_object, validate
from .protocol import GenerateRequest
from .serving import Clock, answer, check_thinking, load_or_unload, ready
from .translate import completion_request, generate_as_chat, refuse_unsupported

blueprint = Blueprint("ollama_generate", __name__)


@blueprint.post("/api/generate")
@document_request(GenerateRequest)
async def generate():
    clock = Clock()
    settings = current_app.config["SETTINGS"]
    body = validate(GenerateRequest, await read_json_object(), settings.limits)
    refuse_unsupported(body)
    if not (body.prompt or body.suffix or body.system):
        return await load_or_unload(body, {"response": ""})
    templated = not (body.raw or body.suffix)
    if templated:
        request = generate_as_chat(body)
    else:
        request = completion_request(body)
    output = None
    engine, loaded = await ready(body, clock)
    if templated:
        check_thinking(body, loaded)
        chat = await asyncio.to_thread(prepare, request, loaded, settings.chat)
        request, output = chat.request, chat.output
        if body.context:  # an earlier answer's tokens, then this turn
            request = replace(request, prompt=[*body.context, *request.prompt])
    plan = await plan_on(engine, loaded, request)
    shape = {"chat": False, "output": output, "clock": clock, "context": templated}
    return await answer(engine, plan, body, shape)
