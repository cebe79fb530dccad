"""POST /v1/responses' request (OpenAI's Responses API) and its translation into the canonical
request: input items become the shared messages, flat function tools the nested ones templates
read, text.format the output constraint. This server stores nothing, so nothing may refer to an
earlier response."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt

from ...engine import StopSpec
from ...planning.defaults import SAMPLING, no_parameters
from ...planning.messages import (
    IMAGE_LEFT_OUT,
    MEDIA_PARTS,
    Call,
    Message,
    check_messages,
    image_part,
)
from ...planning.request import Chat, ContextFit, NamedTool, Request
from ...sampling.grammars import Constraint
from ..constraints import schema_constraint
from ..errors import InvalidRequest
from ..hosted_tools import leave_out
from ..protocol import MAX_TOKENS_FIELD

ROLES = ("user", "system", "developer", "assistant")
TEXT_PARTS = ("input_text", "output_text", "text")
# Parts the model is not given as they are: audio, files, and images where no image part goes
# (an assistant's turn, a tool's result)
MEDIA = (*MEDIA_PARTS, "input_image", "image", "input_file")
STATELESS = (
    "this server stores no responses or conversations: send the whole conversation in `input` "
    "(earlier outputs included) with store: false."
)


class TextFormat(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    description: str | None = None
    strict: StrictBool | None = None


class TextConfig(BaseModel):
    model_config = ConfigDict(extra="allow")
    format: TextFormat | None = None


class ReasoningConfig(BaseModel):
    model_config = ConfigDict(extra="allow")
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: str | None = None


class ResponsesRequest(BaseModel):
    """POST /v1/responses in OpenAI's names; sampling beyond temperature and top_p is chat's."""

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={
            "examples": [
                {"input": "Hello!", "temperature": 0, "max_output_tokens": 16},
                {
                    "instructions": "Answer in one word.",
                    "input": [{"role": "user", "content": "Hi"}],
                    "stream": True,
                },
            ]
        },
    )

    model: str | None = None
    input: str | list[dict[str, Any]] = Field(
        description="a user message, or a list of messages, function_call and "
        "function_call_output items"
    )
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    max_output_tokens: StrictInt | None = Field(None, ge=1, le=MAX_TOKENS_FIELD)
    temperature: StrictFloat | None = Field(None, ge=0.0, le=2.0)
    top_p: StrictFloat | None = Field(None, gt=0.0, le=1.0)
    stream: StrictBool | None = False
    store: StrictBool | None = Field(None, description="accepted; nothing is stored")
    metadata: dict[str, str] | None = None
    parallel_tool_calls: StrictBool | None = None
    user: str | None = None
    truncation: Literal["auto", "disabled"] | None = None
    previous_response_id: str | None = Field(None, description="refused: nothing is stored")
    conversation: str | dict[str, Any] | None = Field(None, description="refused")
    background: StrictBool | None = Field(None, description="false only")
    include: list[str] | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    service_tier: str | None = None
    stream_options: dict[str, Any] | None = None

    def echo(self) -> dict[str, Any]:
        """The request's settings as a response repeats them."""
        text_format = self.text.format if self.text and self.text.format else None
        return {
            "instructions": self.instructions,
            "max_output_tokens": self.max_output_tokens,
            "parallel_tool_calls": self.parallel_tool_calls is not False,
            "reasoning": {"effort": self.reasoning.effort if self.reasoning else None},
            "temperature": 1.0 if self.temperature is None else self.temperature,
            "text": {
                "format": text_format.model_dump(by_alias=True, exclude_none=True)
                if text_format
                else {"type": "text"}
            },
            "tool_choice": self.tool_choice or "auto",
            "tools": self.tools or [],
            "top_p": 1.0 if self.top_p is None else self.top_p,
            "truncation": self.truncation or "disabled",
            "user": self.user,
            "metadata": self.metadata or {},
        }


def chat_request(
    body: ResponsesRequest, strict_tools: bool = False
) -> tuple[Request, dict[str, ToolOrigin]]:
    """The request that answers `body`, or a 400 naming the invalid Responses field; and
    where each offered function that is not a plain top-level one came from (ToolOrigin)."""
    _refuse_stateful(body)
    messages = _messages(body)
    tools, origins = _tools(body.tools or [], strict_tools)
    effort = body.reasoning.effort if body.reasoning else None
    chat = Chat(
        check_messages(messages),
        tuple(tools),
        _tool_choice(body.tool_choice) if body.tool_choice is not None else None,
        body.parallel_tool_calls is not False,
        template_kwargs={"reasoning_effort": effort} if effort else None,
    )
    sampling = {"temperature": body.temperature, "top_p": body.top_p}
    request = Request(
        replace(SAMPLING, **{name: v for name, v in sampling.items() if v is not None}),
        StopSpec(),
        model=body.model,
        max_tokens=body.max_output_tokens,
        constraint=_constraint(body.text.format) if body.text and body.text.format else None,
        fit=ContextFit(truncate=body.truncation == "auto"),
        user=body.user,
        chat=chat,
    )
    return request, origins


def _refuse_stateful(body: ResponsesRequest) -> None:
    for name in ("previous_response_id", "conversation"):
        if getattr(body, name) is not None:
            raise InvalidRequest(
                f"'{name}' is not supported: {STATELESS}", param=name, code="unsupported_parameter"
            )
    if body.background:
        raise InvalidRequest(
            "background responses are not supported: this server answers while the request "
            "waits (send stream: true to see the answer as it comes).",
            param="background",
            code="unsupported_parameter",
        )


def _messages(body: ResponsesRequest) -> list[Message]:
    """`instructions` first, then the input's items as chat messages: consecutive function
    calls join the assistant turn before them, and reasoning goes to the next assistant turn."""
    out: list[dict[str, Any]] = []  # turns as they build up
    if body.instructions:
        out.append({"role": "system", "content": body.instructions})
    if isinstance(body.input, str):
        out.append({"role": "user", "content": body.input})
        return [_message(turn) for turn in out]
    if not body.input:
        raise InvalidRequest("input must hold at least one item.", param="input")
    calls: set[str] = set()
    reasoning = ""
    for i, item in enumerate(body.input):
        where = f"input[{i}]"
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "reasoning":
            reasoning += _reasoning_text(item)
            continue
        if kind in PROVIDER_ITEMS:
            continue
        if kind == "message":
            role = _role(item, where)
            message = {"role": role, "content": _content(item.get("content"), where, role)}
            if message["role"] == "assistant" and _open_calls(out):
                # text an assistant wrote beside its calls, echoed between a call and its output
                # (Codex does): it belongs to the calls' turn, which their results follow
                out[-1]["content"] = (out[-1].get("content") or "") + message["content"]
                continue
        elif kind in ("function_call", "custom_tool_call", "local_shell_call"):
            message = _call_turn(out, item, where)
            calls.add(message["tool_calls"][-1].id)
        elif kind in ("function_call_output", "custom_tool_call_output", "local_shell_call_output"):
            message = _tool_result(item, where, calls)
        elif kind == "item_reference":
            raise InvalidRequest(
                f"{where} is an item_reference: {STATELESS}",
                param=f"{where}.type",
                code="unsupported_parameter",
            )
        else:
            raise InvalidRequest(
                f"Input item type {kind!r} in {where} is not supported: send messages, "
                "function_call, custom_tool_call and their _output items.",
                param=f"{where}.type",
            )
        if message["role"] == "assistant" and reasoning:
            message["reasoning_content"], reasoning = reasoning, ""
        if not out or out[-1] is not message:
            out.append(message)
    return [_message(turn) for turn in out]


def _message(turn: dict[str, Any]) -> Message:
    return Message(**{**turn, "tool_calls": tuple(turn.get("tool_calls", ()))})


# Items of what OpenAI ran itself, or of state only OpenAI can read (a resumed Codex session
# replays them): nothing here can render them, and the conversation reads on without them.
PROVIDER_ITEMS = frozenset(
    {
        "web_search_call",
        "file_search_call",
        "code_interpreter_call",
        "image_generation_call",
        "computer_call",
        "mcp_list_tools",
        "compaction",
    }
)


def _open_calls(out: list[dict[str, Any]]) -> bool:
    """Whether the last turn is an assistant's calls whose results have not come yet."""
    return bool(out) and out[-1]["role"] == "assistant" and bool(out[-1].get("tool_calls"))


def _string(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise InvalidRequest(f"{where}.{key} must be a string.", param=f"{where}.{key}")
    return value


def _role(item: dict[str, Any], where: str) -> str:
    role = item.get("role")
    if role not in ROLES:
        raise InvalidRequest(
            f"Unknown role {role!r} in {where}; roles are {', '.join(ROLES)}.",
            param=f"{where}.role",
        )
    return role


def _content(content: Any, where: str, role: str) -> str | list[dict[str, Any]]:
    """A message's content: one string, or, where a user's message holds images
    (`input_image` with a data URL), its text and image parts in order."""
    if role != "user" or not _has_images(content):
        return _text(content, where)
    return _parts(content, where)


def _has_images(content: Any) -> bool:
    return isinstance(content, list) and any(
        isinstance(p, dict) and p.get("type") == "input_image" for p in content
    )


def _parts(content: list, where: str, tool_result: bool = False) -> list[dict[str, Any]]:
    """Text and `input_image` parts, in order, as planning reads them."""
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        param = f"{where}.content[{j}]"
        if part.get("type") == "input_image":
            url = part.get("image_url")
            if not isinstance(url, str) and tool_result:  # a file_id: resent every turn
                parts.append({"type": "text", "text": IMAGE_LEFT_OUT})
                continue
            if not isinstance(url, str):
                raise InvalidRequest(
                    f"{param}.image_url must be the image as a data URL (file_id is not "
                    "supported).",
                    param=f"{param}.image_url",
                )
            parts.append(image_part(url, f"{param}.image_url"))
        else:
            text = _text([part], where, tool_result, offset=j)
            parts.append({"type": "text", "text": text})
    return parts


def _text(content: Any, where: str, tool_result: bool = False, offset: int = 0) -> str:
    """A message's content as one string: its text parts joined. In a tool's result, a file (or
    an image not given as a data URL) stands as a line saying it was left out: a 400 there would
    come back with every later turn, which resends it."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequest(
            f"{where}.content must be a string or a list of input_text parts.",
            param=f"{where}.content",
        )
    texts = []
    for j, part in enumerate(content, start=offset):
        param = f"{where}.content[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in TEXT_PARTS and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
        elif kind in MEDIA and tool_result:
            texts.append(
                IMAGE_LEFT_OUT
                if kind in ("input_image", "image")
                else f"[{kind} left out: a tool's result is given to the model as text]"
            )
        elif kind in MEDIA:
            raise InvalidRequest(
                f"Content part type '{kind}' is not supported here: send input_text parts "
                "(images go in a user's message, as input_image).",
                param=f"{param}.type",
                code="unsupported_content_type",
            )
        else:
            raise InvalidRequest(
                f"{param} must be {{'type': 'input_text', 'text': ...}}.", param=param
            )
    return "".join(texts)


def _reasoning_text(item: dict[str, Any]) -> str:
    parts = item.get("content") or item.get("summary") or []
    if not isinstance(parts, list):
        return ""
    return "".join(
        p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)
    )


def _call_turn(out: list[dict[str, Any]], item: dict[str, Any], where: str) -> dict[str, Any]:
    """The assistant turn this call belongs to: the one just before it, or a new one. A custom
    tool's call (its raw `input`) is the call of the function it is offered as (custom_function)."""
    if item.get("type") == "custom_tool_call":
        arguments = json.dumps({"input": _string(item, "input", where)}, ensure_ascii=False)
    elif item.get("type") == "local_shell_call":  # a GPT model's shell call, in a resumed session
        item = {**item, "name": "local_shell"}
        arguments = json.dumps(item.get("action") or {}, ensure_ascii=False)
    else:
        arguments = _string(item, "arguments", where)
    try:
        parsed = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        raise InvalidRequest(
            f"{where}.arguments must be a JSON object as text.", param=f"{where}.arguments"
        )
    call = Call(_string(item, "name", where), arguments, _string(item, "call_id", where))
    if out and out[-1]["role"] == "assistant":
        out[-1].setdefault("tool_calls", []).append(call)
        return out[-1]
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def _tool_result(item: dict[str, Any], where: str, calls: set[str]) -> dict[str, Any]:
    call_id = _string(item, "call_id", where)
    if call_id not in calls:
        raise InvalidRequest(
            f"{where}.call_id {call_id!r} answers no function_call item before it: send the "
            "function_call item first.",
            param=f"{where}.call_id",
        )
    output = item.get("output")
    if _has_images(output):  # Codex's view_image: the image itself, for a vision model
        return {
            "role": "tool",
            "tool_call_id": call_id,
            "content": _parts(output, f"{where}.output", True),
        }
    text = output if isinstance(output, str) else _text(output, f"{where}.output", True)
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def _tools(
    tools: list[dict[str, Any]], strict: bool
) -> tuple[list[dict[str, Any]], dict[str, ToolOrigin]]:
    """Function tools in chat's nested form, a namespace's function tools under their own names
    (Codex groups its agent tools so), custom tools as functions; any other type (web search,
    file search, ...) is one OpenAI runs, which this server leaves out (hosted_tools). Also the
    origin of each function offered that is not a plain top-level one."""
    walk = _ToolWalk()
    for i, tool in enumerate(tools):
        walk.add(tool, f"tools[{i}]")
    leave_out(walk.hosted, strict, "/v1/responses")
    return walk.offered, walk.origins


def custom_function(tool: dict[str, Any], where: str) -> dict[str, Any]:
    """A custom tool (free-form input, Codex's apply_patch) as the function the model calls: one
    string argument, `input`, which comes back as the custom_tool_call's input. Its grammar, if
    it has one, is in the description for the model to follow."""
    description = tool.get("description") or ""
    fmt = tool.get("format")
    if isinstance(fmt, dict) and fmt.get("type") == "grammar" and fmt.get("definition"):
        description += (
            f"\n\nWrite the whole input as the `input` string, in this {fmt.get('syntax', '')} "
            f"grammar:\n{fmt['definition']}"
        )
    parameters = {
        "type": "object",
        "properties": {"input": {"type": "string"}},
        "required": ["input"],
        "additionalProperties": False,
    }
    function: dict[str, Any] = {"name": _string(tool, "name", where)}
    if description.strip():
        function["description"] = description.strip()
    function["parameters"] = parameters
    return function


def _function(flat: dict[str, Any], where: str) -> dict[str, Any]:
    """A function tool as templates read it: its name, description and parameters' schema (an
    object with none, when it declares none)."""
    function: dict[str, Any] = {"name": _string(flat, "name", where)}
    if not function["name"]:
        raise _invalid(f"{where}.name", "must be at least 1 character long", "")
    description, parameters = flat.get("description"), flat.get("parameters")
    if description is not None:
        if not isinstance(description, str):
            raise _invalid(f"{where}.description", "must be a string", description)
        function["description"] = description
    if parameters is not None and not isinstance(parameters, dict):
        raise _invalid(f"{where}.parameters", "must be an object", parameters)
    function["parameters"] = no_parameters() if parameters is None else parameters
    return function


def _invalid(param: str, requirement: str, value: Any) -> InvalidRequest:
    """A value of the wrong shape, worded as the request models word it (parsing.refusal)."""
    return InvalidRequest(
        f"Invalid value for '{param}': {requirement} (got {value!r})",
        param=param,
        code="invalid_value",
    )


@dataclass(frozen=True)
class ToolOrigin:
    """Where an offered function came from: a custom tool's, a namespace's (Codex finds a call
    by namespace and name, so the call goes back with its namespace)."""

    custom: bool = False
    namespace: str | None = None


@dataclass
class _ToolWalk:
    """One pass over a request's tools, namespaces' members included."""

    offered: list[dict[str, Any]] = field(default_factory=list)
    origins: dict[str, ToolOrigin] = field(default_factory=dict)
    hosted: list[tuple[str, str]] = field(default_factory=list)  # (param, type)

    def add(self, tool: Any, where: str, namespace: str | None = None) -> None:
        if not isinstance(tool, dict):
            raise InvalidRequest(f"{where} must be an object.", param=where)
        kind = tool.get("type")
        if kind == "namespace":
            members, name = tool.get("tools"), tool.get("name")
            if not isinstance(members, list):
                raise InvalidRequest(
                    f"{where}.tools must be a list of tools.", param=f"{where}.tools"
                )
            for j, member in enumerate(members):
                self.add(member, f"{where}.tools[{j}]", name if isinstance(name, str) else None)
            return
        if kind == "custom":
            function = custom_function(tool, where)
        elif kind == "function":
            flat = tool["function"] if isinstance(tool.get("function"), dict) else tool
            function = _function(flat, where)
        else:
            self.hosted.append((where, str(kind)))
            return
        self.offered.append({"type": "function", "function": function})
        if kind == "custom" or namespace is not None:
            self.origins[function["name"]] = ToolOrigin(kind == "custom", namespace)


def _tool_choice(choice: str | dict[str, Any]) -> str | NamedTool:
    if isinstance(choice, str):
        return choice
    if choice.get("type") not in ("function", "custom"):  # a custom tool is a function here
        raise InvalidRequest(
            f"tool_choice type {choice.get('type')!r} is not supported: send 'auto', 'none', "
            "'required' or {'type': 'function', 'name': ...}.",
            param="tool_choice.type",
        )
    return NamedTool(_string(choice, "name", "tool_choice"))


def _constraint(fmt: TextFormat) -> Constraint | None:
    """text.format as the answer's constraint (under chat's name for it, response_format)."""
    if fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return schema_constraint("response_format", {"type": "object"})
    if fmt.schema_ is None:
        raise InvalidRequest(
            "text.format json_schema needs a 'schema'.", param="text.format.schema"
        )
    return schema_constraint("response_format", fmt.schema_)
