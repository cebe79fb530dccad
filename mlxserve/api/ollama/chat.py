"""POST /api/chat: Ollama's chat. The messages become OpenAI chat's (translate.py) and are
rendered, planned and read back (reasoning, tool calls) as /v1/chat/completions does."""

from __future__ import annotations

import asyncio

from quart import Blueprint, current_app
from quart_schema import document_request

from ...planning.chat import prepare
from ..dispatch import plan_on
from ..parsing import read_json_object, validate
from .protocol import ChatRequest
from .serving import Clock, answer, check_thinking, load_or_unload, ready
from .translate import chat_request, refuse_unsupported

blueprint = Blueprint("ollama_chat", __name__)


@blueprint.post("/api/chat")
@document_request(ChatRequest)
async def chat():
    clock = Clock()
    settings = current_app.config["SETTINGS"]
    body = validate(ChatRequest, await read_json_object(), settings.limits)
    refuse_unsupported(body)
    if not body.messages:
        return await load_or_unload(body, {"message": {"role": "assistant", "content": ""}})
    request = chat_request(body)
    engine, loaded = await ready(body, clock)
    check_thinking(body, loaded)
    prompt = await asyncio.to_thread(prepare, request, loaded, settings.chat)
    plan = await plan_on(engine, loaded, prompt.request)
    shape = {"chat": True, "output": prompt.output, "clock": clock}
    return await answer(engine, plan, body, shape)
