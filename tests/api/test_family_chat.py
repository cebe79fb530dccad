"""A multi-turn chat on each kind of cache, over HTTP with the official `openai` client: every
turn after the first reuses the previous turn's prompt from the prefix cache, and answers as a
server without a prefix cache does. Qwen3.5's hybrid (linear attention beside attention),
Gemma 3's and gpt-oss's sliding windows (shorter than the prompt) keep checkpoints of their
state (engine/prefix/checkpoints.py); Llama's plain KV is cut to the shared prefix. Under a
template that renders history unchanged (ChatML) and under Qwen3's, which drops earlier turns'
`<think>` blocks; with a JSON schema, the answer parses."""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest

from mlxserve.settings import ChatSettings
from mlxserve.tiny_families import build_tiny_family

from ..helpers import skip_for_missing

CHAT_TEMPLATES = Path(__file__).resolve().parents[2].parent / "shared" / "chat-templates"
QWEN3_TEMPLATE = CHAT_TEMPLATES / "Qwen-Qwen3-0.6B.jinja"
FAMILIES = ("qwen3_5", "gemma3_text", "gpt_oss", "llama")
# ~1,500 tokens of the tiny models' vocabulary
SYSTEM = "You are a careful assistant for a team of Python developers. " + " ".join(
    f"Rule {i}: keep the function named handler_{i} returning {i * 3} and document it."
    for i in range(60)
)
QUESTIONS = ("What does handler_3 return?", "And handler_7?", "Name one rule.", "Thanks. Bye?")
REUSED_SHARE = 0.9


# make test runs the hybrid under the template that drops earlier reasoning (the hardest case:
# the turn resumes from its last message's end); every other pair is in the families tier
IN_MAKE_TEST = {("qwen3_5", "qwen3-drops-thinking")}
TEMPLATES = {"chatml": None, "qwen3-drops-thinking": QWEN3_TEMPLATE}


def family_templates():
    for family in FAMILIES:
        for name, template in TEMPLATES.items():
            marks = () if (family, name) in IN_MAKE_TEST else pytest.mark.families
            yield pytest.param(family, template, id=f"{family}-{name}", marks=marks)


@pytest.fixture(scope="module")
def family_folders(tmp_path_factory):
    """Each family's tiny model, built on first use."""

    def folder(family: str) -> Path:
        return build_tiny_family(family, tmp_path_factory.getbasetemp() / "families" / family)

    return folder


def chat_settings(template: Path | None) -> ChatSettings:
    if template is None:
        return ChatSettings()
    if not template.exists():
        skip_for_missing(f"the shared chat templates ({template}) are not beside the repository")
    return ChatSettings(template=template.read_text(), template_source=str(template))


def turns(client: openai.OpenAI, thinking: bool, **extra) -> list:
    """Four turns; each answer goes back into the history (with a reasoning block in front where
    the template drops earlier ones)."""
    messages = [{"role": "system", "content": SYSTEM}]
    answers = []
    for question in QUESTIONS:
        messages.append({"role": "user", "content": question})
        answer = client.chat.completions.create(
            model="m", messages=messages, max_tokens=12, temperature=0, **extra
        )
        answers.append(answer)
        said = answer.choices[0].message.content or ""
        if thinking:
            said = f"<think>\nThe user asks: {question}\n</think>\n\n{said}"
        messages.append({"role": "assistant", "content": said})
    return answers


def openai_client(live) -> openai.OpenAI:
    return openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0)


@pytest.mark.parametrize(("family", "template"), family_templates())
def test_each_turn_reuses_the_last_one_and_answers_as_a_cold_server(
    live_servers, family_folders, family, template
):
    family_folder = family_folders(family)
    settings = chat_settings(template)
    thinking = template is not None
    with live_servers.own(family_folder, chat=settings) as warm:
        answers = turns(openai_client(warm), thinking)
    with live_servers.own(family_folder, chat=settings, prefix_cache_bytes=0) as cold:
        cold_answers = turns(openai_client(cold), thinking)
    said = [a.choices[0].message.content for a in answers]
    assert said == [a.choices[0].message.content for a in cold_answers]
    for before, after in zip(answers, answers[1:]):
        reused = after.usage.prompt_tokens_details.cached_tokens
        share = reused / before.usage.prompt_tokens
        assert share >= REUSED_SHARE, f"{family_folder.name}: reused {reused} tokens"
    assert all(a.usage.prompt_tokens_details.cached_tokens == 0 for a in cold_answers)


@pytest.mark.parametrize(
    "family",
    [pytest.param(f, marks=() if f == "qwen3_5" else pytest.mark.families) for f in FAMILIES],
)
def test_a_json_schema_answer_parses(live_servers, family_folders, family):
    family_folder = family_folders(family)
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 8}, "ok": {"type": "boolean"}},
        "required": ["name", "ok"],
        "additionalProperties": False,
    }
    response_format = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    live = live_servers.shared(family_folder)
    answer = openai_client(live).chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "A name and a yes or no, as JSON."}],
        max_tokens=60,
        temperature=0,
        response_format=response_format,
    )
    parsed = json.loads(answer.choices[0].message.content)
    assert set(parsed) == {"name", "ok"} and isinstance(parsed["ok"], bool)
