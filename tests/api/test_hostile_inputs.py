"""Hostile inputs, one row each: every one gets a 4xx naming what is wrong (or, where the input
is odd but valid, a normal answer), never a 5xx, a hang or a dead server."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import httpx
import pytest

from mlxserve.settings import Limits

from ..helpers import complete, error_of, wait_until

# The HTTP contract alone: the platform policy does not change it (not in the portable pass).
pytestmark = pytest.mark.http_only

MB = 1024 * 1024


def deep(depth: int) -> dict:
    node: dict = {"type": "string"}
    for _ in range(depth):
        node = {"type": "object", "properties": {"a": node}}
    return node


# (name, raw body or JSON object, extra headers, expected status)
HOSTILE = [
    ("huge prompt of token ids", {"prompt": [5] * 100_000, "max_tokens": 1}, {}, 400),
    ("huge text prompt", {"prompt": "word " * 400_000, "max_tokens": 1}, {}, 400),
    ("deeply nested JSON", b"[" * 100_000 + b"]" * 100_000, {}, 400),
    ("deep JSON object body", b'{"a":' * 50_000 + b"1" + b"}" * 50_000, {}, 400),
    ("deep JSON schema", {"prompt": "x", "max_tokens": 4, "json_schema": deep(400)}, {}, None),
    ("NaN temperature", b'{"prompt": "x", "temperature": NaN}', {}, 400),
    ("Infinity top_p", b'{"prompt": "x", "top_p": Infinity}', {}, 400),
    ("-Infinity in logit_bias", b'{"prompt": "x", "logit_bias": {"5": -Infinity}}', {}, 400),
    ("1e999 float", b'{"prompt": "x", "temperature": 1e999}', {}, 400),
    ("negative n", {"prompt": "x", "n": -1}, {}, 400),
    ("negative max_tokens", {"prompt": "x", "max_tokens": -7}, {}, 400),
    ("enormous max_tokens", {"prompt": "x", "max_tokens": 10**30}, {}, 400),
    ("enormous n", {"prompt": "x", "n": 10**20}, {}, 400),
    ("enormous top_k", {"prompt": "x", "max_tokens": 2, "top_k": 10**30}, {}, None),
    ("enormous seed", {"prompt": "x", "seed": 10**40}, {}, 400),
    ("enormous logprobs", {"prompt": "x", "logprobs": 10**9}, {}, 400),
    (
        "enormous dry_penalty_last_n",
        {"prompt": "x", "max_tokens": 2, "dry_multiplier": 1, "dry_penalty_last_n": 10**18},
        {},
        400,
    ),
    (
        "enormous repeat_last_n",
        {"prompt": "x", "max_tokens": 2, "repetition_penalty": 1.2, "repeat_last_n": 10**18},
        {},
        400,
    ),
    (
        "the largest penalty windows",
        {
            "prompt": "x",
            "max_tokens": 2,
            "repetition_penalty": 1.2,
            "repeat_last_n": 2**31 - 1,
            "dry_multiplier": 1,
            "dry_penalty_last_n": 2**31 - 1,
        },
        {},
        200,
    ),
    # Until the context is full, from 1,900 tokens in: the tiny model's 2,048 are soon reached.
    (
        "enormous min_tokens",
        {"prompt": [1] + [401] * 1899, "max_tokens": -1, "min_tokens": 10**12},
        {},
        None,
    ),
    ("invalid UTF-8 body", b'{"prompt": "\xff\xfe\xfa"}', {}, 400),
    ("lone surrogate in the prompt", b'{"prompt": "a\\udc80b", "max_tokens": 2}', {}, 400),
    ("NUL characters in the prompt", {"prompt": "a\u0000b" * 10, "max_tokens": 2}, {}, 200),
    ("token id beyond the vocabulary", {"prompt": [1, 10**9]}, {}, 400),
    ("negative token id", {"prompt": [1, -3]}, {}, 400),
    ("stop token id beyond the vocabulary", {"prompt": "x", "stop_token_ids": [10**6]}, {}, 400),
    ("n x best_of x prompts explosion", {"prompt": ["a"] * 100, "n": 100, "best_of": 100}, {}, 400),
    ("nested regex", {"prompt": "x", "max_tokens": 8, "guided_regex": "(a*)*b"}, {}, None),
    (
        "regex with a huge repeat",
        {"prompt": "x", "max_tokens": 4, "guided_regex": "a{1000000}"},
        {},
        None,
    ),
    ("regex that does not compile", {"prompt": "x", "guided_regex": "(((("}, {}, 400),
    (
        "left-recursive GBNF",
        {"prompt": "x", "max_tokens": 4, "grammar": 'root ::= root "a" | "b"'},
        {},
        None,
    ),
    ("GBNF that does not parse", {"prompt": "x", "grammar": "root ::= ((("}, {}, 400),
    (
        "a Lark grammar of 20,000 alternatives",
        {
            "prompt": "x",
            "max_tokens": 4,
            "grammar": {
                "type": "lark",
                "value": "start: " + " | ".join(f'"w{i}"' for i in range(20_000)),
            },
        },
        {},
        None,
    ),
    ("JSON schema that is not a schema", {"prompt": "x", "json_schema": {"type": 5}}, {}, 400),
    ("a 10 MB body", {"prompt": "x" * (10 * MB)}, {}, 413),
    ("an empty body", b"", {}, 400),
    ("a JSON array body", b"[1, 2]", {}, 400),
    (
        "a form body",
        b"prompt=x&max_tokens=2",
        {"Content-Type": "application/x-www-form-urlencoded"},
        400,
    ),
    (
        "multipart content type",
        b"--b\r\n\r\nx\r\n--b--",
        {"Content-Type": "multipart/form-data; boundary=b"},
        415,
    ),
    ("XML content type", b"<prompt>x</prompt>", {"Content-Type": "application/xml"}, 415),
    ("a prompt that is an object", {"prompt": {"text": "x"}}, {}, 400),
    # Never loaded: the loaded model answers (404 under --strict-model-names).
    ("a model given as a path", {"prompt": "x", "model": "/etc/passwd"}, {}, 200),
    ("a model given as a relative path", {"prompt": "x", "model": "../../../etc"}, {}, 200),
    (
        "100,000 logit_bias entries",
        {"prompt": "x", "max_tokens": 2, "logit_bias": {str(i % 1000): 1 for i in range(100_000)}},
        {},
        200,
    ),
    ("5,000 dry breakers", {"prompt": "x", "dry_sequence_breakers": ["a"] * 5000}, {}, 400),
]


@pytest.mark.parametrize(
    ("body", "headers", "expected"),
    [pytest.param(body, headers, expected, id=name) for name, body, headers, expected in HOSTILE],
)
def test_hostile_input(http, body, headers, expected):
    """`expected` None: the input is odd but valid; any answer but a 5xx is right."""
    started = time.monotonic()
    if isinstance(body, bytes):
        response = http.post("/v1/completions", content=body, headers=headers)
    else:
        response = http.post("/v1/completions", json=body, headers=headers)
    assert response.status_code < 500, response.text[:500]
    assert time.monotonic() - started < 60
    if expected is not None:
        assert response.status_code == expected, response.text[:500]
    if response.status_code >= 400:
        error = error_of(response, response.status_code)
        assert "Traceback" not in error["message"]
    # The server is still there, answering the next request.
    assert complete(http, prompt="still alive", max_tokens=2)["choices"][0]["finish_reason"]


def test_hostile_inputs_do_not_disturb_a_stream_in_flight(server):
    """The whole table sent while another client streams: its answer is the one it gets alone."""
    body = {"prompt": "steady", "max_tokens": 200, "ignore_eos": True, "seed": 7}
    with httpx.Client(base_url=server.url, timeout=120) as http:
        alone = complete(http, **body)["choices"][0]["text"]
        with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as stream:
            lines = stream.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            with httpx.Client(base_url=server.url, timeout=120) as other:
                for _, hostile, headers, _ in HOSTILE:
                    kind = "content" if isinstance(hostile, bytes) else "json"
                    other.post("/v1/completions", headers=headers, **{kind: hostile})
            rest = [line for line in lines if line.startswith("data: ")]
    chunks = [json.loads(line[6:]) for line in [first, *rest] if line != "data: [DONE]"]
    assert "".join(c["choices"][0]["text"] for c in chunks) == alone
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_a_json_schema_ref_never_reaches_the_network_or_the_disk(http):
    """$ref to a URL or a file: refused, and nothing is fetched."""
    hits: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            hits.append(self.path)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b'{"type": "integer"}')

        def log_message(self, *args):
            pass

    with HTTPServer(("127.0.0.1", 0), Handler) as web:
        threading.Thread(target=web.serve_forever, daemon=True).start()
        for ref in (f"http://127.0.0.1:{web.server_port}/schema.json", "file:///etc/passwd"):
            schema = {"type": "object", "properties": {"a": {"$ref": ref}}, "required": ["a"]}
            response = http.post(
                "/v1/completions", json={"prompt": "x", "max_tokens": 8, "json_schema": schema}
            )
            assert response.status_code in (200, 400), response.text
            if response.status_code == 200:  # then the ref was not followed: no integer forced
                assert "passwd" not in response.text
        web.shutdown()
    assert hits == []


def test_admin_load_takes_names_not_paths(http, tiny_model):
    for name in (str(tiny_model), "/etc", "~", "../tiny"):
        error = error_of(http.post("/admin/load", json={"model": name}), 404)
        assert error["param"] == "model"
    assert http.get("/health").status_code == 200


def raw_exchange(port: int, data: bytes, wait_s: float) -> bytes:
    """Send `data` over a bare socket, then read whatever the server answers within `wait_s`."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as sock:
        sock.sendall(data)
        chunks = []
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)


@pytest.fixture
def strict(live_server, tiny_model):
    """A server with tight limits, all set the way `serve`'s flags set them."""
    limits = Limits(
        max_body_bytes=4096,
        body_timeout_s=1.0,
        max_prompt_tokens=12,
        max_tokens=8,
        max_n=2,
        max_logprobs=1,
        max_n_probs=3,
        request_timeout_s=None,
    )
    return live_server(tiny_model, limits=limits)


def test_a_slow_body_gets_408_and_frees_the_server(strict):
    port = strict.settings.port
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100\r\n\r\n"
    )
    started = time.monotonic()
    answer = raw_exchange(port, head + b'{"prompt": ', wait_s=10)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert time.monotonic() - started < 8
    assert b'"request_timeout"' in answer
    with httpx.Client(base_url=strict.url, timeout=60) as http:
        assert complete(http, prompt="x", max_tokens=1)["choices"]


def test_slow_headers_are_cut_off(strict):
    started = time.monotonic()
    answer = raw_exchange(strict.settings.port, b"POST /v1/completions HTTP/1.1\r\nHost:", 10)
    assert time.monotonic() - started < 5  # closed at --body-timeout (1 s here), not held open
    assert not answer or answer.startswith(b"HTTP/1.1 4"), answer[:200]


def test_limits_set_by_flags_are_enforced_and_named(strict):
    with httpx.Client(base_url=strict.url, timeout=60) as http:
        for field, value in (("n", 3), ("best_of", 3), ("logprobs", 2)):
            error = error_of(http.post("/v1/completions", json={"prompt": "x", field: value}), 400)
            assert error["param"] == field and "this server's limit" in error["message"]
        error = error_of(http.post("/v1/completions", json={"prompt": "x", "n_probs": 2}), 400)
        assert error["param"] == "n_probs"
        # max_tokens beyond the limit is lowered to it (as llama.cpp caps n_predict).
        for alias in ("max_tokens", "n_predict", "max_completion_tokens"):
            result = complete(http, prompt="x", ignore_eos=True, **{alias: 9})
            assert result["usage"]["completion_tokens"] == 8, alias
        # -1 (until the context is full) stops at the server's limit.
        result = complete(http, prompt="x", max_tokens=-1, ignore_eos=True)
        assert result["usage"]["completion_tokens"] == 8
        native = http.post("/completion", json={"prompt": "x", "ignore_eos": True})
        assert native.status_code == 200 and native.json()["tokens_predicted"] == 8
        # Prompts: longer than --max-prompt-tokens is refused, or cut when asked.
        long_ids = [1] + [300] * 19
        error = error_of(http.post("/v1/completions", json={"prompt": long_ids}), 400)
        assert error["code"] == "prompt_too_long" and "12" in error["message"]
        cut = complete(http, prompt=long_ids, max_tokens=1, truncate_prompt_tokens=15)
        assert cut["usage"]["prompt_tokens"] == 12
        body = json.dumps({"prompt": "x" * 5000})
        error = error_of(http.post("/v1/completions", content=body), 413)
        assert "4096" in error["message"]


def test_the_openapi_document_states_the_servers_limits(strict):
    with httpx.Client(base_url=strict.url, timeout=60) as http:
        document = http.get("/openapi.json").json()

    def maximum(path: str, name: str) -> int:
        schema = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        field = schema["schema"]["properties"][name]
        branches = field.get("anyOf", [field])
        return next(b["maximum"] for b in branches if b.get("type") == "integer")

    assert maximum("/v1/completions", "n") == maximum("/v1/completions", "best_of") == 2
    assert maximum("/v1/completions", "logprobs") == maximum("/v1/completions", "n_probs") == 1
    # llama.cpp's routes have llama.cpp's own bound on n_probs (--max-n-probs).
    for path in ("/completion", "/infill"):
        assert maximum(path, "n_probs") == maximum(path, "logprobs") == 3
        assert maximum(path, "n") == 2
    # max_tokens above the limit is lowered to it, not refused: the schema says so.
    properties = document["paths"]["/v1/completions"]["post"]["requestBody"]["content"][
        "application/json"
    ]["schema"]["properties"]
    assert maximum("/v1/completions", "max_tokens") == maximum("/v1/completions", "n_predict")
    assert maximum("/v1/completions", "n_predict") == maximum(
        "/v1/completions", "max_completion_tokens"
    )
    assert "lowered" in properties["max_tokens"]["description"]
    with httpx.Client(base_url=strict.url, timeout=60) as http:
        body = {"prompt": "x", "n_predict": 1, "n_probs": 3}
        assert http.post("/completion", json=body).status_code == 200
        error = error_of(http.post("/completion", json={**body, "n_probs": 4}), 400)
        assert error["param"] == "n_probs" and "3" in error["message"]
        error_of(http.post("/v1/completions", json={**body, "n_probs": 3}), 400)


def test_a_request_deadline_ends_generation_with_length(live_server, tiny_model):
    live = live_server(tiny_model, limits=Limits(request_timeout_s=0.3))
    with httpx.Client(base_url=live.url, timeout=60) as http:
        started = time.monotonic()
        result = complete(http, prompt="x", max_tokens=2000, ignore_eos=True, n=4)
        elapsed = time.monotonic() - started
    assert all(c["finish_reason"] == "length" for c in result["choices"])
    assert result["usage"]["completion_tokens"] < 4 * 2000
    assert elapsed < 5


@pytest.mark.parametrize("cut", ["headers", "body"])
def test_a_client_gone_mid_request_leaves_nothing_behind(server, cut):
    body = json.dumps({"prompt": "x", "max_tokens": 50}).encode()
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n"
    )
    data = head[:20] if cut == "headers" else head + body[:10]
    for _ in range(20):
        with socket.create_connection(("127.0.0.1", server.settings.port)) as sock:
            sock.sendall(data)
    with httpx.Client(base_url=server.url, timeout=60) as http:
        assert complete(http, prompt="x", max_tokens=2)["choices"]
    # The engine thread posts a sequence's last event before it drops the sequence from its
    # batch and counts again: the client may read the counter before it drops to 0.
    engine = server.engine
    assert wait_until(lambda: engine.pending_sequences == 0 and engine.stats.active_sequences == 0)


def test_binding_beyond_localhost_without_a_key_warns(caplog):
    from mlxserve.server import warn_if_exposed
    from mlxserve.settings import Settings

    warn_if_exposed(Settings(model="m", host="127.0.0.1"))
    warn_if_exposed(Settings(model="m", host="0.0.0.0", api_key="k"))
    assert not caplog.records
    warn_if_exposed(Settings(model="m", host="0.0.0.0"))
    assert "without an API key" in caplog.text
