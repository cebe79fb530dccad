"""llama.cpp's /tokenize and /detokenize against real servers: the tiny coder (a byte-level BPE
with special tokens, like most chat and code models) and the tiny model (SentencePiece, BOS)."""

from __future__ import annotations

import httpx
import pytest

CODE = "def área(r):\n    return 3.14 * r ** 2  # ✓\n"


@pytest.fixture
def coder_http(live_server, tiny_coder):
    with httpx.Client(base_url=live_server(tiny_coder).url, timeout=60) as client:
        yield client


def test_tokenize_then_detokenize_gives_the_text_back(coder_http):
    tokens = coder_http.post("/tokenize", json={"content": CODE}).json()["tokens"]
    assert tokens and all(isinstance(t, int) for t in tokens)
    assert coder_http.post("/detokenize", json={"tokens": tokens}).json() == {"content": CODE}


def test_pieces_are_text_or_the_bytes_of_part_of_a_character(coder_http):
    plain = coder_http.post("/tokenize", json={"content": CODE}).json()["tokens"]
    pieces = coder_http.post("/tokenize", json={"content": CODE, "with_pieces": True}).json()
    assert [p["id"] for p in pieces["tokens"]] == plain
    joined = b"".join(
        p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"])
        for p in pieces["tokens"]
    )
    assert joined.decode() == CODE
    # "✓" is three bytes; a byte-level BPE this small splits it, and those pieces are numbers
    assert any(isinstance(p["piece"], list) for p in pieces["tokens"])


def test_special_token_text_is_the_special_token_unless_parse_special_is_false(coder_http):
    parsed = coder_http.post("/tokenize", json={"content": "<fim_prefix>x"}).json()["tokens"]
    as_text = coder_http.post(
        "/tokenize", json={"content": "<fim_prefix>x", "parse_special": False}
    ).json()["tokens"]
    fim_prefix = coder_http.post("/tokenize", json={"content": "<fim_prefix>"}).json()["tokens"]
    assert len(fim_prefix) == 1 and parsed[0] == fim_prefix[0]
    assert fim_prefix[0] not in as_text and len(as_text) > len(parsed)
    detokenized = coder_http.post("/detokenize", json={"tokens": parsed}).json()["content"]
    assert detokenized == "<fim_prefix>x"


def test_add_special_puts_the_bos_first(http, tokenizer):
    without = http.post("/tokenize", json={"content": "def f():"}).json()["tokens"]
    with_bos = http.post("/tokenize", json={"content": "def f():", "add_special": True}).json()
    assert with_bos["tokens"] == [tokenizer.bos_token_id, *without]


@pytest.mark.parametrize(
    ("route", "body", "param"),
    [
        ("/tokenize", {}, "content"),
        ("/tokenize", {"content": 12}, "content"),
        ("/tokenize", {"content": "x", "with_pieces": "yes"}, "with_pieces"),
        ("/detokenize", {"tokens": [0, -1]}, "tokens"),
        ("/detokenize", {"tokens": [10**9]}, "tokens"),
        ("/detokenize", {"tokens": "1 2"}, "tokens"),
    ],
)
def test_bad_bodies_get_a_400_naming_the_field(coder_http, route, body, param):
    response = coder_http.post(route, json=body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param
