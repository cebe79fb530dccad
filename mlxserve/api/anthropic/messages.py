"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API (Claude Code and
other agents), rendered, planned and read back (reasoning, tool calls) as OpenAI chat is."""

from __future__ import annotations

import asyncio
import uuid

from quart import Blueprint, current_app
from quart_schema import document_request

from ...chat.output import split_answer
from ...planning.chat import prepare
from ..dispatch import plan_on, ready_model, submit
from ..parsing import read_json_object, validate
from ..responses import SSE_HEADERS, collect
from .protocol import CountTokensRequest, MessagesRequest
from .replies import Reply, stream
from .translate import chat_request

blueprint = Blueprint("anthropic_messages", __name__)


async def rendered(model: type[CountTokensRequest]):
    """The request, the engine and model that serve it, and its messages as a chat prompt."""
    settings = current_app.config["SETTINGS"]
    body = validate(model, await read_json_object(), settings.limits)
    request = chat_request(body, settings.chat.strict_tools)
    engine, loaded = await ready_model(body.model)
    prompt = await asyncio.to_thread(prepare, request, loaded, settings.chat)
    return body, engine, loaded, prompt


@blueprint.post("/v1/messages")
@document_request(MessagesRequest)
async def create_message():
    body, engine, loaded, prompt = await rendered(MessagesRequest)
    plan = await plan_on(engine, loaded, prompt.request)
    reply = Reply(
        id=f"msg_{uuid.uuid4().hex}",
        model=body.model,
        output=prompt.output,
        plan=plan,
        stop_sequences=body.stop_sequences or [],
    )
    if body.stream:
        return stream(submit(engine, plan), reply), 200, SSE_HEADERS
    (result,) = await collect(submit(engine, plan), plan)
    return reply.message(result, split_answer(prompt.output, result.text))


@blueprint.post("/v1/messages/count_tokens")
@document_request(CountTokensRequest)
async def count_tokens():
    *_, prompt = await rendered(CountTokensRequest)
    return {"input_tokens": len(prompt.request.prompt)}
