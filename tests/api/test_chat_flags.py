"""The chat flags: --chat-template (a Jinja file, or ChatML by name), --tool-parser and
--reasoning-format, as the command line reads them and as a server with them answers."""

from __future__ import annotations

import httpx
import pytest

from mlxserve.chat.templates import CHATML
from mlxserve.chat.tool_calls import parser_names
from mlxserve.cli import build_parser, main
from mlxserve.flag_settings import chat_settings
from mlxserve.settings import ChatSettings

from .test_chat import CLOCK, THINKING, USER, WEATHER

BRACKETS = (
    "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant] {% endif %}"
)
# Qwen3-Coder's XML calls, which mlx-lm's qwen3_coder parser reads.
QWEN3_CODER_CALL = (
    r"<tool_call>\n<function=get_time>\n<parameter=zone>\nUTC\n</parameter>\n</function>\n"
    r"</tool_call>"
)


def parsed(*argv: str):
    return chat_settings(build_parser().parse_args(["serve", *argv]))


def test_defaults_keep_the_models_template_and_parser():
    assert parsed() == ChatSettings()


def test_chatml_by_name_and_a_template_file(tmp_path):
    assert parsed("--chat-template", "chatml").template == CHATML
    path = tmp_path / "brackets.jinja"
    path.write_text(BRACKETS)
    chat = parsed("--chat-template", str(path), "--tool-parser", "mistral")
    assert (chat.template, chat.template_source, chat.tool_parser) == (
        BRACKETS,
        str(path),
        "mistral",
    )


@pytest.mark.parametrize(
    "content, says",
    [(None, "not a readable Jinja file"), ("{% for m in messages %}", "line 1")],
    ids=["missing file", "bad Jinja"],
)
def test_a_bad_template_stops_the_server_before_loading(tmp_path, capsys, content, says):
    path = tmp_path / "template.jinja"
    if content is not None:
        path.write_text(content)
    assert main(["serve", "--chat-template", str(path)]) == 2
    error = capsys.readouterr().err
    assert f"--chat-template {path}" in error and says in error


def test_tool_parsers_are_mlx_lms_and_hermes():
    names = parser_names()
    assert {"hermes", "json_tools", "mistral", "qwen3_coder", "pythonic"} <= set(names)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--tool-parser", "nonsense"])


@pytest.fixture(scope="module")
def flagged(live_servers, tiny_model, server):
    """The tiny model served with every chat flag set (the session's engine, another front)."""
    chat = ChatSettings(
        template=BRACKETS,
        template_source="brackets.jinja",
        tool_parser="qwen3_coder",
        reasoning_format="none",
    )
    live = live_servers.shared(tiny_model, engine=server.engine, chat=chat)
    with httpx.Client(base_url=live.url, timeout=120) as http:
        yield http


def test_the_template_file_renders_the_messages(flagged):
    response = flagged.post("/apply-template", json={"messages": USER})
    assert response.json() == {"prompt": "[user] Say something.\n[assistant] "}


def test_models_name_the_flags(flagged):
    (card,) = [m for m in flagged.get("/v1/models").json()["data"] if m.get("loaded")]
    assert card["chat_template"] == "--chat-template brackets.jinja"
    assert card["tool_parser"] == "qwen3_coder"


def test_the_tool_parser_reads_its_syntax(flagged):
    body = {"messages": USER, "tools": [WEATHER, CLOCK], "guided_regex": QWEN3_CODER_CALL}
    result = flagged.post("/v1/chat/completions", json={**body, "max_tokens": 80}).json()
    (choice,) = result["choices"]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["function"] == {"name": "get_time", "arguments": '{"zone": "UTC"}'}


def test_reasoning_format_none_is_the_default_a_request_may_override(flagged):
    body = {"messages": USER, "guided_regex": THINKING, "seed": 1, "max_tokens": 80}
    inline = flagged.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
    assert inline["content"].startswith("<think>") and "reasoning_content" not in inline
    split = flagged.post("/v1/chat/completions", json={**body, "reasoning_format": "auto"})
    message = split.json()["choices"][0]["message"]
    assert message["reasoning_content"] and not message["content"].startswith("<think>")


def test_a_forced_call_is_written_in_qwen3_coders_xml(flagged):
    """qwen3_coder's calls are XML: the grammar holds a forced call to it
    (mlxserve/chat/forced_calls.py), each parameter the tool's schema names."""
    body = {"messages": USER, "tools": [WEATHER, CLOCK], "tool_choice": "required"}
    result = flagged.post(
        "/v1/chat/completions", json={**body, "seed": 1, "max_tokens": 120, "logprobs": True}
    ).json()
    (choice,) = result["choices"]
    raw = "".join(entry["token"] for entry in choice["logprobs"]["content"])
    assert raw.startswith("<tool_call>\n<function="), raw
    assert "<parameter=" in raw and raw.rstrip().endswith("</tool_call>"), raw
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["tool_calls"]


def test_strict_tools_is_off_unless_asked_for():
    assert parsed().strict_tools is False and parsed("--strict-tools").strict_tools is True


EFFORT = "{{ messages[0]['content'] }} effort={{ reasoning_effort | default('unset') }}"


def test_reasoning_effort_reaches_the_template_as_on_responses(live_servers, tiny_model, server):
    """OpenAI's chat field (opencode's effort variants, aider's --reasoning-effort, llm's -o)."""
    chat = ChatSettings(template=EFFORT, template_source="effort.jinja")
    live = live_servers.shared(tiny_model, engine=server.engine, chat=chat)

    def prompt(**body) -> str:
        answer = httpx.post(
            live.url + "/apply-template", json={"messages": USER, **body}, timeout=60
        )
        return answer.json()["prompt"]

    assert prompt() == "Say something. effort=unset"
    assert prompt(reasoning_effort="low") == "Say something. effort=low"
    kwargs = {"chat_template_kwargs": {"reasoning_effort": "high"}}
    assert prompt(reasoning_effort="low", **kwargs) == "Say something. effort=high"
