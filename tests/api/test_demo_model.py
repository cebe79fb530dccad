"""The embedded default model: shipped in the package, served, completing and filling in.

Its answers are checked once, in the CPU pass (`slow`): the portable pass runs the same requests'
paths on the tiny coder (tests/api/test_infill_api.py), where 4-bit weights stay fast."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest

from mlxserve.settings import DEFAULT_MODEL

FIM_TOKENS = ("<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<file_sep>")
BEFORE = "def add(a, b):\n"
AFTER = "\n\n\nprint(add(1, 2))\n"
# An editor's single-line infill ends at the newline (the model's quality is eval.json's job).
INFILL = {"max_tokens": 64, "temperature": 0, "stop": ["\n"]}


@pytest.fixture
def demo_server(live_server):
    return live_server(DEFAULT_MODEL)


@pytest.fixture
def demo_client(demo_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=demo_server.url + "/v1", api_key="unused", max_retries=0)


def test_it_ships_in_the_package_within_budget():
    files = {f.name: f.stat().st_size for f in DEFAULT_MODEL.iterdir()}
    shipped = ("config.json", "model.safetensors", "tokenizer.json", "README.md", "eval.json")
    for name in (*shipped, "LICENSE", "training.json"):
        assert name in files, name
    assert sum(files.values()) <= 100 * 1024 * 1024
    config = json.loads((DEFAULT_MODEL / "config.json").read_text())
    assert config["model_type"] == "llama" and config["max_position_embeddings"] >= 2048
    assert config["quantization"]["bits"] == 4
    assert config["quantization"]["model.embed_tokens"]["bits"] == 8
    assert config["fim_template"] == "starcoder-spm"  # the order it was fine-tuned on last
    assert "Apache License" in (DEFAULT_MODEL / "LICENSE").read_text()


def test_the_model_card_quotes_its_evaluation_and_training():
    card = (DEFAULT_MODEL / "README.md").read_text()
    evaluation = json.loads((DEFAULT_MODEL / "eval.json").read_text())
    training = json.loads((DEFAULT_MODEL / "training.json").read_text())
    assert evaluation["tasks"] == 200 and Path(evaluation["model"]).name == DEFAULT_MODEL.name
    assert str(evaluation["validation_loss_nats_per_token"]) in card
    for infill in (evaluation["model_infill"], evaluation["reference_infill"]):
        assert f"{infill['exact_match']:.1%}" in card and f"{infill['parse_rate']:.1%}" in card
    assert f"{training['steps']:,} steps" in card and str(training["base_val_loss"]) in card
    assert "Apache License 2.0" in card


@pytest.mark.slow
def test_fim_tokens_are_single_special_tokens(demo_server):
    tokenizer = demo_server.engine.loaded.tokenizer
    for token in FIM_TOKENS:
        ids = tokenizer.encode(token + "x = 1", add_special_tokens=False)
        assert ids[0] == tokenizer.convert_tokens_to_ids(token), token
    # A FIM middle ends at <|endoftext|>, whatever a chat turn ends at.
    end_of_text = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert end_of_text in demo_server.engine.loaded.eos_token_ids
    text = "def f(x):\n    return x  # ünïcode ✓\n"
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


@pytest.mark.slow
def test_served_under_its_name(demo_client):
    first = demo_client.models.list().data[0]
    assert first.id == "mlxserve-demo-coder" and first.loaded and first.fim == "starcoder-spm"


@pytest.mark.slow
def test_a_completion_writes_python_and_stops(demo_client):
    choice = demo_client.completions.create(
        model="mlxserve-demo-coder",
        prompt="def fib(n):\n",
        max_tokens=64,
        temperature=0,
        stop=["\n\n"],
    ).choices[0]
    assert choice.text.strip()
    assert choice.finish_reason == "stop"


@pytest.mark.slow
def test_a_raw_fim_infill_fills_the_line_and_stops(demo_client):
    choice = demo_client.completions.create(
        model="mlxserve-demo-coder",
        prompt=f"<fim_prefix>{BEFORE}<fim_suffix>{AFTER}<fim_middle>",
        **INFILL,
    ).choices[0]
    assert choice.text.strip()
    assert choice.finish_reason == "stop"


@pytest.mark.slow
def test_a_streamed_infill_stops(demo_client):
    chunks = list(
        demo_client.completions.create(
            model="mlxserve-demo-coder",
            prompt=f"<fim_prefix>{BEFORE}<fim_suffix>{AFTER}<fim_middle>",
            stream=True,
            **INFILL,
        )
    )
    assert "".join(c.choices[0].text for c in chunks).strip()
    assert chunks[-1].choices[0].finish_reason == "stop"


@pytest.mark.slow
def test_infill_inside_a_function_fills_one_line_and_stops(demo_server):
    """The default model fills a line of a small function as llama.vscode asks for it: the
    cursor after the line's indentation (`prompt`), single-line, greedy."""
    prefix = "import os\n\n\ndef list_files(path):\n    result = []\n"
    prefix += "    for name in os.listdir(path):\n"
    suffix = "\n    return result\n"
    body = {
        "input_prefix": prefix,
        "input_suffix": suffix,
        "input_extra": [],
        "prompt": "        ",
        "n_predict": 32,
        "n_indent": 8,
        "top_k": 40,
        "top_p": 0.99,
        "temperature": 0,
        "stop": ["\n"],
        "stream": False,
        "samplers": ["top_k", "top_p", "infill"],
        "cache_prompt": True,
        "t_max_prompt_ms": 500,
        "t_max_predict_ms": 1000,
    }
    with httpx.Client(base_url=demo_server.url, timeout=60) as http:
        answer = http.post("/infill", json=body).json()
    assert answer["content"].strip() and "\n" not in answer["content"]
    assert answer["stop_type"] in ("eos", "word")  # it stopped by itself, not at n_predict
    # Whether the line is right is the model's quality: eval.json measures it over 200 tasks.
