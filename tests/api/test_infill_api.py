"""Editors' infill requests replayed as they send them (REFERENCE §3), against real servers: the
tiny coder (StarCoder's FIM tokens, SPM like the default model) for the infill paths, the tiny
model and SmolLM2 (no FIM tokens) for the 400s. The default model's own fills:
tests/api/test_demo_model.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import openai
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from replay_llama_vim import fim_request, warmup_request  # noqa: E402

PREFIX = "import math\n\n\ndef area(radius):\n"
SUFFIX = "\n\n\nprint(area(2.0))\n"
EXTRA = [
    {
        "text": "def circumference(radius):\n    return 2 * math.pi * radius\n",
        "filename": "geometry/circle.py",
        "time": 1700000000,
    }
]


@pytest.fixture
def coder(live_server, tiny_coder):
    return live_server(tiny_coder)


@pytest.fixture
def coder_http(coder):
    with httpx.Client(base_url=coder.url, timeout=60) as client:
        yield client


def llama_vim_warmup(extra):
    """llama.vim's ring-buffer update (scripts/replay_llama_vim.py sends it too)."""
    return warmup_request(extra)


def llama_vim_fim(prefix, middle, suffix, extra, indent, n_predict=128):
    """llama.vim's FIM request, its answers held short (t_max_predict_ms 250, not its 1000)."""
    return fim_request(prefix, middle, suffix, extra, indent, n_predict, t_max_predict_ms=250)


def test_llama_vim_warmup_then_fim_reuses_the_warmed_context(coder_http):
    extra = [
        {"filename": f"pkg/m{i}.py", "text": f"def helper_{i}(x):\n    return x + {i}\n" * 4}
        for i in range(4)
    ]
    warm = coder_http.post("/infill", json=llama_vim_warmup(extra))
    assert warm.status_code == 200 and warm.json() == {}  # response_fields [""]: nothing asked
    answer = coder_http.post("/infill", json=llama_vim_fim(PREFIX, "    ", SUFFIX, extra, 4))
    assert answer.status_code == 200
    body = answer.json()
    assert set(body) == set(llama_vim_fim("", "", "", [], 0)["response_fields"])
    assert isinstance(body["content"], str) and body["truncated"] is False
    # The warm-up left the extra context's KV in the prefix cache; the FIM request starts there.
    assert body["tokens_cached"] >= 60
    assert body["timings/prompt_n"] > 0 and body["timings/predicted_n"] >= 1


def test_the_infill_prompt_is_the_models_template_with_repo_context(coder_http):
    body = llama_vim_fim(PREFIX, "    ", SUFFIX, EXTRA, 4) | {"response_fields": None}
    answer = coder_http.post("/infill", json=body).json()
    # StarCoder's tokens in SPM order, as the model's config.json names them.
    assert answer["prompt"] == (
        "<repo_name>project\n<file_sep>geometry/circle.py\n"
        + EXTRA[0]["text"]
        + "<file_sep>filename\n"
        "<fim_suffix>" + SUFFIX + "<fim_prefix>" + PREFIX + "<fim_middle>"
    )  # the cursor's indentation, a token of spaces, is healed: the model writes it again
    assert answer["stop"] is True and answer["stop_type"] in ("eos", "word", "limit")
    for key in ("tokens_predicted", "tokens_evaluated", "tokens_cached", "timings", "truncated"):
        assert key in answer
    # n_indent 4: no line of the answer after the first is indented less than the cursor's line.
    for line in answer["content"].split("\n")[1:]:
        assert not line.strip() or len(line) - len(line.lstrip()) >= 4


def test_llama_vscode_request(coder_http):
    body = {
        "top_k": 40,
        "top_p": 0.99,
        "stream": False,
        "samplers": ["top_k", "top_p", "infill"],
        "cache_prompt": True,
        "input_prefix": PREFIX,
        "input_suffix": SUFFIX,
        "input_extra": EXTRA,
        "prompt": "    return ",
        "n_predict": 32,
        "t_max_prompt_ms": 500,
        "t_max_predict_ms": 1000,
        "n_indent": 4,
    }
    answer = coder_http.post("/infill", json=body).json()
    assert isinstance(answer["content"], str)
    assert isinstance(answer["tokens_cached"], int) and isinstance(answer["truncated"], bool)
    timings = answer["timings"]
    for key in ("prompt_n", "prompt_ms", "prompt_per_second", "predicted_n", "predicted_ms"):
        assert key in timings
    assert answer["prompt"].endswith(
        "<fim_suffix>" + SUFFIX + "<fim_prefix>" + PREFIX + "    return<fim_middle>"
    )


def test_the_space_after_the_cursor_is_healed_and_not_sent_back(coder, coder_http):
    """`return ` ends in a token of one space; the model writes it again as the start of its
    next token (`" x"`), and the client gets what follows it."""
    body = llama_vim_fim(PREFIX, "    return ", SUFFIX, [], 0, n_predict=6)
    # Greedy: on random weights llama.vim's infill sampler finds no confident token and ends.
    body |= {"response_fields": None, "return_tokens": True, "temperature": 0}
    answer = coder_http.post("/infill", json=body).json()
    assert answer["prompt"].endswith("    return<fim_middle>")
    tokenizer = coder.engine.loaded.tokenizer
    written = tokenizer.decode(answer["tokens"])
    assert tokenizer.decode(answer["tokens"][:1]).startswith(" ")
    assert answer["content"] == written[1:]
    assert answer["tokens_predicted"] >= len(answer["tokens"]) >= 1


def test_repeated_infill_in_the_same_file_reuses_the_prefix_cache(coder_http):
    body = llama_vim_fim(PREFIX * 3, "    r", SUFFIX, [], 4) | {"response_fields": None}
    coder_http.post("/infill", json=body)
    again = coder_http.post("/infill", json=body | {"prompt": "    re"}).json()
    assert again["tokens_cached"] >= len(again["prompt"]) // 8  # most of the prefix
    assert again["timings"]["cache_n"] == again["tokens_cached"]


def test_tabby_suffix_on_v1_completions(coder):
    """Tabby's openai/completion kind: prompt + suffix, streamed; the server builds the FIM."""
    body = {
        "model": coder.engine.model_name,
        "prompt": PREFIX + "    return ",
        "suffix": SUFFIX,
        "max_tokens": 24,
        "temperature": 0.1,
        "stream": True,
        "presence_penalty": 0.0,
    }
    with httpx.Client(base_url=coder.url, timeout=60) as client:
        lines = client.post("/v1/completions", json=body).text.strip().split("\n\n")
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")


def test_suffix_prompt_is_the_template_echo_is_the_users_and_usage_counts_tokens(coder):
    client = openai.OpenAI(base_url=coder.url + "/v1", api_key="unused", max_retries=0)
    completion = client.completions.create(
        model=coder.engine.model_name,
        prompt=PREFIX,
        suffix=SUFFIX,
        max_tokens=8,
        temperature=0,
        echo=True,
        extra_body={"return_token_ids": True},
    )
    choice = completion.choices[0]
    tokenizer = coder.engine.loaded.tokenizer
    seen = tokenizer.decode(choice.prompt_token_ids, skip_special_tokens=False)
    assert seen == "<fim_suffix>" + SUFFIX + "<fim_prefix>" + PREFIX + "<fim_middle>"  # SPM
    assert choice.text.startswith(PREFIX) and "<fim_" not in choice.text
    assert completion.usage.prompt_tokens == len(choice.prompt_token_ids)
    # A stop token (EOS, a FIM token) counts as generated but is neither text nor in token_ids.
    stopped_by_token = choice.finish_reason == "stop"
    assert completion.usage.completion_tokens == len(choice.token_ids) + stopped_by_token


def test_continue_raw_fim_prompt_on_v1_completions(coder):
    client = openai.OpenAI(base_url=coder.url + "/v1", api_key="unused", max_retries=0)
    stream = client.completions.create(
        model=coder.engine.model_name,
        prompt=f"<fim_prefix>{PREFIX}<fim_suffix>{SUFFIX}<fim_middle>",
        max_tokens=48,
        temperature=0.01,
        stop=[
            "<fim_prefix>",
            "<fim_suffix>",
            "<fim_middle>",
            "<file_sep>",
            "<|endoftext|>",
            "\n\n",
            "\r\n\r\n",
            "/src/",
            "#- coding: utf-8",
            "```",
            "\ndef",
            "\nclass",
        ],
        stream=True,
    )
    chunks = list(stream)
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert "<fim_" not in "".join(c.choices[0].text for c in chunks)


def test_continue_llama_cpp_provider_on_completion(coder_http):
    """Continue's llama.cpp provider: POST /completion, streamed, llama.cpp's field names."""
    body = {
        "prompt": f"<fim_prefix>{PREFIX}<fim_suffix>{SUFFIX}<fim_middle>",
        "stream": True,
        "n_predict": 24,
        "temperature": 0.01,
        "top_p": 0.95,
        "top_k": 40,
        "min_p": 0.05,
        "stop": ["<fim_prefix>", "\n\n"],
        "cache_prompt": True,
    }
    lines = coder_http.post("/completion", json=body).text.strip().split("\n\n")
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines]
    assert all("content" in c and "stop" in c for c in chunks)
    assert [c["stop"] for c in chunks].count(True) == 1 and chunks[-1]["stop"] is True
    assert chunks[-1]["tokens_evaluated"] > 0 and "timings" in chunks[-1]
    not_streamed = coder_http.post("/completion", json=body | {"stream": False}).json()
    assert not_streamed["stop"] is True and isinstance(not_streamed["content"], str)


@pytest.mark.parametrize("chunk", [{}, {"filename": "x.py"}])
def test_an_extra_chunk_without_text_is_a_400_as_in_llama_cpp(coder_http, chunk):
    body = llama_vim_fim(PREFIX, "    ", SUFFIX, [chunk], 4)
    response = coder_http.post("/infill", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["param"].startswith("input_extra")


def test_models_without_fim_tokens_refuse_infill_by_name(server, http):
    assert server.engine.loaded.fim is None
    response = http.post("/v1/completions", json={"prompt": "def f(", "suffix": ")\n"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "suffix" and error["code"] == "fim_not_supported"
    assert "fill-in-the-middle" in error["message"]
    assert "<fim_prefix>/<fim_suffix>/<fim_middle>" in error["message"]  # what is missing
    response = http.post("/infill", json={"input_prefix": "def f(", "input_suffix": ")"})
    assert response.status_code == 400 and response.json()["error"]["param"] == "input_suffix"
    # No suffix: the prefix is continued (tests/api/test_lenient_requests.py).


@pytest.mark.slow  # SmolLM2's load, in the portable pass (test_engine_models.py)
def test_smollm2_has_no_fim_tokens_so_suffix_is_a_400(smollm2_server):
    with httpx.Client(base_url=smollm2_server.url, timeout=300) as client:
        response = client.post("/v1/completions", json={"prompt": "def f(", "suffix": ")\n"})
        assert response.status_code == 400
        assert response.json()["error"]["code"] == "fim_not_supported"
        body = {"input_prefix": "x", "input_suffix": "y"}
        assert client.post("/infill", json=body).status_code == 400
        assert client.post("/infill", json={"input_prefix": "x", "n_predict": 2}).status_code == 200
        # Plain completions still work on it.
        assert client.post("/completion", json={"prompt": "x", "n_predict": 2}).status_code == 200


def newline_id(tokenizer) -> int:
    return tokenizer.encode("a\nb", add_special_tokens=False)[1]


def test_n_indent_stops_at_a_line_indented_less(http, tokenizer):
    """Only line breaks are allowed: the line after the first one is indented 0 < 4."""
    body = {
        "prompt": "def f():\n",
        "n_predict": 50,
        "n_indent": 4,
        "temperature": 0,
        "logit_bias": {str(newline_id(tokenizer)): 100},
    }
    answer = http.post("/completion", json=body).json()
    assert answer["content"] == "\n" and answer["stop_type"] == "limit"
    assert answer["tokens_predicted"] == 2  # the second line break decided it
    assert http.post("/completion", json=body | {"n_indent": 0}).json()["tokens_predicted"] == 50


def test_t_max_predict_ms_stops_once_a_line_break_was_generated(http, tokenizer):
    body = {
        "prompt": "x",
        "n_predict": 400,
        "t_max_predict_ms": 1,
        "temperature": 0,
        "logit_bias": {str(newline_id(tokenizer)): 100},
    }
    answer = http.post("/completion", json=body).json()
    assert answer["stop_type"] == "limit" and answer["tokens_predicted"] < 400
    assert set(answer["content"]) == {"\n"}
