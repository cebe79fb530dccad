"""Ollama's /api/generate and /api/chat through the official `ollama` client on a real server:
whole and streamed answers, FIM with `suffix`, `format`, seeds, tools, thinking refused where
the model has none, keep_alive, errors in Ollama's shape, and greedy answers equal to the OpenAI
routes' on the same prompt and settings."""

from __future__ import annotations

import json
import time

import httpx
import jsonschema
import ollama
import pytest

from .test_chat import PERSON, WEATHER

GREEDY = {"temperature": 0, "repeat_penalty": 1.0, "num_predict": 12}
STORY = "Once upon a time"


@pytest.fixture
def olla(server) -> ollama.Client:
    return ollama.Client(host=server.url)


@pytest.fixture
def name(server) -> str:
    return f"{server.engine.model_name}:latest"


def test_generate_streams_what_it_answers_whole(olla, name):
    whole = olla.generate(model=name, prompt=STORY, raw=True, options=GREEDY, stream=False)
    assert whole.done and whole.done_reason == "length" and whole.eval_count == 12
    assert whole.model == name and whole.created_at
    parts = list(olla.generate(model=name, prompt=STORY, raw=True, options=GREEDY, stream=True))
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    assert "".join(p.response for p in parts) == whole.response
    final = parts[-1]
    assert final.response == "" and final.done_reason == "length"
    assert final.eval_count == whole.eval_count
    assert final.prompt_eval_count == whole.prompt_eval_count > 0


def test_durations_add_up(olla, name):
    for answer in (
        olla.generate(model=name, prompt=STORY, options=GREEDY, stream=False),
        list(
            olla.chat(
                model=name,
                messages=[{"role": "user", "content": "Hi"}],
                options=GREEDY,
                stream=True,
            )
        )[-1],
    ):
        assert answer.prompt_eval_duration > 0 and answer.eval_duration > 0
        assert answer.load_duration >= 0
        assert answer.prompt_eval_duration + answer.eval_duration <= answer.total_duration
        assert answer.total_duration < 60e9  # nanoseconds, not microseconds or seconds


def test_raw_generate_equals_openai_completions(olla, name, client):
    ours = olla.generate(model=name, prompt=STORY, raw=True, options=GREEDY, stream=False)
    openai = client.completions.create(model="x", prompt=STORY, temperature=0, max_tokens=12)
    assert ours.response == openai.choices[0].text
    assert ours.prompt_eval_count == openai.usage.prompt_tokens


def test_templated_generate_equals_openai_chat(olla, name, client):
    system = "You are terse."
    ours = olla.generate(model=name, prompt="Hi", system=system, options=GREEDY, stream=False)
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Hi"}]
    openai = client.chat.completions.create(
        model="x", messages=messages, temperature=0, max_tokens=12
    )
    assert ours.response == openai.choices[0].message.content
    assert ours.prompt_eval_count == openai.usage.prompt_tokens
    # `context` continues the conversation: its tokens come first in the next prompt.
    assert len(ours.context) == ours.prompt_eval_count + ours.eval_count
    again = olla.generate(model=name, prompt="More", context=ours.context, options=GREEDY)
    assert again.prompt_eval_count > len(ours.context)


def test_chat_streams_what_it_answers_whole_and_equals_openai_chat(olla, name, client):
    messages = [{"role": "user", "content": "Tell me a story."}]
    whole = olla.chat(model=name, messages=messages, options=GREEDY, stream=False)
    assert whole.message.role == "assistant" and whole.done_reason == "length"
    parts = list(olla.chat(model=name, messages=messages, options=GREEDY, stream=True))
    assert "".join(p.message.content for p in parts) == whole.message.content
    assert parts[-1].done and parts[-1].message.content == ""
    openai = client.chat.completions.create(
        model="x", messages=messages, temperature=0, max_tokens=12
    )
    assert whole.message.content == openai.choices[0].message.content


def test_suffix_fills_in_the_middle_as_openai_completions_does(live_server, tiny_coder):
    live = live_server(tiny_coder)
    name = live.engine.model_name
    prefix, suffix = "def add(a, b):\n    ", "\n\nprint(add(1, 2))\n"
    ours = ollama.Client(host=live.url).generate(
        model=name, prompt=prefix, suffix=suffix, options=GREEDY, stream=False
    )
    openai = httpx.post(
        live.url + "/v1/completions",
        json={"prompt": prefix, "suffix": suffix, "temperature": 0, "max_tokens": 12},
        timeout=60,
    ).json()
    assert ours.response == openai["choices"][0]["text"]
    assert ours.prompt_eval_count == openai["usage"]["prompt_tokens"]


def test_a_json_schema_format_shapes_the_answer(olla, name):
    answer = olla.generate(
        model=name,
        prompt="A person as JSON:",
        format=PERSON,
        options={"seed": 1, "num_predict": 200},
        stream=False,
    )
    jsonschema.validate(json.loads(answer.response), PERSON)
    reply = olla.chat(
        model=name,
        messages=[{"role": "user", "content": "A person as JSON:"}],
        format=PERSON,
        options={"seed": 2, "num_predict": 200},
    )
    jsonschema.validate(json.loads(reply.message.content), PERSON)
    # "json": any object. The random model may not close it within num_predict.
    free = olla.generate(model=name, prompt="JSON:", format="json", options={"num_predict": 40})
    assert free.response.lstrip().startswith("{")
    if free.done_reason == "stop":
        assert isinstance(json.loads(free.response), dict)


def test_unicode_line_breaks_in_the_text_reach_the_client_whole(olla, name):
    """The `ollama` client splits its stream with httpx's iter_lines, that is str.splitlines: a
    raw U+2028, U+2029 or U+0085 in a line's text cut it in two and the client failed to parse
    it. The format makes the model write all three."""
    text = "a\u2028b\u0085c\u2029d"
    format = {"type": "string", "enum": [text]}
    options = {"num_predict": 40}
    parts = list(olla.generate(model=name, prompt="x", format=format, options=options, stream=True))
    assert json.loads("".join(p.response for p in parts)) == text
    whole = olla.chat(
        model=name, messages=[{"role": "user", "content": "x"}], format=format, options=options
    )
    assert json.loads(whole.message.content) == text


def test_seeded_options_repeat_their_answer(olla, name):
    def sample(seed: int) -> str:
        options = {"seed": seed, "temperature": 1.0, "num_predict": 12}
        return olla.generate(model=name, prompt=STORY, raw=True, options=options).response

    assert sample(7) == sample(7)
    assert len({sample(seed) for seed in range(4)}) > 1


def test_tool_calls_come_back_as_objects(olla, name):
    """The format makes the random model write a call as bare JSON; it is read back, as any
    model's call in its own syntax, into message.tool_calls with arguments as an object."""
    arguments = WEATHER["function"]["parameters"]
    call = {
        "type": "object",
        "properties": {"name": {"const": "get_weather"}, "arguments": arguments},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }
    messages = [{"role": "user", "content": "Weather in Oslo?"}]
    options = {"seed": 3, "num_predict": 100}
    whole = olla.chat(model=name, messages=messages, tools=[WEATHER], format=call, options=options)
    (made,) = whole.message.tool_calls
    assert made.function.name == "get_weather"
    jsonschema.validate(made.function.arguments, arguments)
    assert whole.message.content == "" and whole.done_reason == "stop"
    parts = list(
        olla.chat(
            model=name,
            messages=messages,
            tools=[WEATHER],
            format=call,
            options=options,
            stream=True,
        )
    )
    streamed = [c for p in parts for c in p.message.tool_calls or []]
    assert [c.function for c in streamed] == [made.function]


def test_a_tool_round_trip_renders_as_openai_chat_does(http, name, client):
    """Ollama's calls carry no ids; results name their tool. The prompt is the one OpenAI chat
    renders from the same conversation with ids: same length, same greedy answer. (Sent as
    raw JSON: the ollama client's Tool model drops and reorders schema keys.)"""
    call = {"function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
    ollama_messages = [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_name": "get_weather", "content": "Sunny, 21 C"},
    ]
    body = {"model": name, "messages": ollama_messages, "tools": [WEATHER], "options": GREEDY}
    ours = http.post("/api/chat", json={**body, "stream": False}).json()
    openai_call = {
        "id": "call_1_0",
        "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps(call["function"]["arguments"])},
    }
    openai_messages = [
        ollama_messages[0],
        {"role": "assistant", "content": "", "tool_calls": [openai_call]},
        {"role": "tool", "tool_call_id": "call_1_0", "content": "Sunny, 21 C"},
    ]
    openai = client.chat.completions.create(
        model="x", messages=openai_messages, tools=[WEATHER], temperature=0, max_tokens=12
    )
    assert ours["prompt_eval_count"] == openai.usage.prompt_tokens
    assert ours["message"]["content"] == (openai.choices[0].message.content or "")


def test_num_ctx_keeps_the_end_of_a_long_prompt(olla, name):
    long = " ".join(["word"] * 300)
    answer = olla.generate(
        model=name, prompt=long, raw=True, options={**GREEDY, "num_ctx": 64, "num_gpu": 1}
    )
    assert answer.prompt_eval_count == 64


def test_num_keep_keeps_the_start_of_a_prompt_cut_to_num_ctx(olla, name):
    """Ollama's num_keep: the cut prompt (`context` shows it) keeps its first tokens, then its
    end."""
    long = " ".join(["word", "other"] * 150)
    whole = olla.generate(model=name, prompt=long, options={**GREEDY, "num_predict": 1})
    full = whole.context[: whole.prompt_eval_count]
    cut = olla.generate(
        model=name, prompt=long, options={**GREEDY, "num_predict": 1, "num_ctx": 64, "num_keep": 6}
    )
    kept = cut.context[: cut.prompt_eval_count]
    assert len(kept) == 64 and len(full) > 64
    assert kept[:6] == full[:6] and kept[-40:] == full[-40:]


def test_errors_are_ollamas(olla, name, server):
    with pytest.raises(ollama.ResponseError) as unknown:
        olla.generate(model="nope:7b", prompt="Hi")
    assert unknown.value.status_code == 404
    assert unknown.value.error == 'model "nope:7b" not found, try pulling it first'
    with pytest.raises(ollama.ResponseError) as bad:
        olla.chat(model=name, messages=[{"role": "user", "content": "Hi"}], options={"top_p": 2})
    assert bad.value.status_code == 400 and "options.top_p" in bad.value.error
    with pytest.raises(ollama.ResponseError) as thinking:
        olla.chat(model=name, messages=[{"role": "user", "content": "Hi"}], think=True)
    assert thinking.value.status_code == 400 and "does not support thinking" in thinking.value.error
    for path, body in (
        ("/api/generate", {"model": name, "prompt": "Hi", "images": ["aGk="]}),
        ("/api/generate", {"model": name, "prompt": "Hi", "template": "{{ .Prompt }}"}),
        ("/api/generate", {"prompt": "Hi"}),
        ("/api/chat", {"model": name, "messages": [{"role": "wizard", "content": "Hi"}]}),
        ("/api/generate", {"model": name, "prompt": "Hi", "keep_alive": "5 minutes"}),
    ):
        response = httpx.post(server.url + path, json=body, timeout=60)
        assert response.status_code == 400, (body, response.text)
        assert list(response.json()) == ["error"] and response.json()["error"]


def wait_for(predicate, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_keep_alive_loads_unloads_and_sets_the_expiry(live_server, tiny_model):
    live = live_server(tiny_model, own=True)
    olla = ollama.Client(host=live.url)
    name = live.engine.model_name
    unloaded = olla.generate(model=name, prompt="", keep_alive=0)
    assert unloaded.done and unloaded.done_reason == "unload"
    assert wait_for(lambda: olla.ps().models == [])
    loaded = olla.generate(model=name, prompt="")
    assert loaded.done_reason == "load" and len(olla.ps().models) == 1
    assert olla.ps().models[0].expires_at.year > 2300  # the server unloads nothing when idle

    answer = olla.generate(model=name, prompt=STORY, options=GREEDY, keep_alive="10m")
    assert answer.done
    expires = olla.ps().models[0].expires_at.timestamp()
    assert abs(expires - (time.time() + 600)) < 30

    hi = [{"role": "user", "content": "Hi"}]
    reply = olla.chat(model=name, messages=hi, options=GREEDY, keep_alive=0)
    assert reply.done  # answered first, unloaded after
    assert wait_for(lambda: olla.ps().models == [])
    again = olla.generate(model=name, prompt=STORY, raw=True, options=GREEDY)
    assert again.load_duration > 0 and again.eval_count == 12


def test_a_known_model_not_served_is_refused_without_allow_switch(live_server, tiny_models_dir):
    live = live_server(tiny_models_dir / "tiny", models_dirs=(str(tiny_models_dir),))
    with pytest.raises(ollama.ResponseError) as refused:
        ollama.Client(host=live.url).generate(model="tiny2:latest", prompt="Hi")
    assert refused.value.status_code == 400 and "--allow-switch" in refused.value.error


def test_the_api_key_guards_ollamas_routes_and_errors_keep_its_shape(live_server, tiny_model):
    live = live_server(tiny_model, api_key="sesame")
    assert httpx.get(live.url + "/api/version", timeout=60).status_code == 200  # a probe: open
    with pytest.raises(ollama.ResponseError) as refused:
        ollama.Client(host=live.url).list()
    assert refused.value.status_code == 401 and "API key" in refused.value.error
    keyed = ollama.Client(host=live.url, headers={"Authorization": "Bearer sesame"})
    answer = keyed.generate(model=live.engine.model_name, prompt=STORY, raw=True, options=GREEDY)
    assert answer.eval_count == 12
    unknown = httpx.post(
        live.url + "/api/nothing", headers={"Authorization": "Bearer sesame"}, timeout=60
    )
    assert unknown.status_code == 404
    assert unknown.json() == {"error": "Unknown route: POST /api/nothing"}


def test_logprobs_come_per_token_with_their_alternatives(olla, name, client):
    answer = olla.generate(
        model=name, prompt=STORY, raw=True, options=GREEDY, logprobs=True, top_logprobs=2
    )
    assert len(answer.logprobs) == answer.eval_count == 12
    assert "".join(entry.token for entry in answer.logprobs) == answer.response
    openai = client.completions.create(
        model="x", prompt=STORY, temperature=0, max_tokens=12, logprobs=2
    )
    expected = openai.choices[0].logprobs.token_logprobs
    assert [entry.logprob for entry in answer.logprobs] == pytest.approx(expected, abs=1e-4)
    assert all(len(entry.top_logprobs) == 2 for entry in answer.logprobs)
    streamed = olla.generate(
        model=name, prompt=STORY, raw=True, options=GREEDY, logprobs=True, stream=True
    )
    assert sum(len(part.logprobs or []) for part in streamed) == 12
