"""What a new user meets first (issue 32): /docs offline, misspelled fields named back, errors in
our words, the accepted content types, and an access log line per request."""

from __future__ import annotations

import logging
import re
import uuid

import httpx
import pytest

from ..helpers import complete, error_of, stream_chunks, wait_until

# The HTTP contract alone: the platform policy does not change it (not in the portable pass).
pytestmark = pytest.mark.http_only

ASSET_TYPES = {".js": "javascript", ".css": "text/css"}


def test_the_docs_page_loads_every_asset_from_this_server(http):
    page = http.get("/docs")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    urls = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert urls and all(url.startswith("/") and not url.startswith("//") for url in urls), urls
    assert not re.search(r"https?://", page.text)
    assert '"/openapi.json"' in page.text
    for url in urls:
        asset = http.get(url)
        assert asset.status_code == 200, url
        assert ASSET_TYPES[url[url.rindex(".") :]] in asset.headers["content-type"], url
        assert len(asset.content) > 10_000  # the real Swagger UI, not a stub


def test_docs_serves_only_its_assets_and_no_cdn_pages(http):
    assert error_of(http.get("/docs/static/swagger-editor.js"), 404)["code"] == "not_found"
    assert http.get("/docs/static/..%2F__init__.py").status_code == 404
    for page in ("/redocs", "/redoc", "/scalar"):
        assert http.get(page).status_code == 404
    assert not any(path.startswith("/docs") for path in http.get("/openapi.json").json()["paths"])


def test_a_misspelled_field_is_named_in_a_header_and_logged_once(http, caplog):
    caplog.set_level(logging.INFO, logger="mlxserve.api")
    misspelled = f"temprature_{uuid.uuid4().hex[:8]}"  # a name no earlier test logged
    for _ in range(2):
        response = http.post(
            "/v1/completions", json={"prompt": "x", "max_tokens": 1, misspelled: 0}
        )
        assert response.status_code == 200
        assert response.headers["X-Unknown-Fields"] == misspelled
    logged = [r for r in caplog.records if misspelled in r.getMessage()]
    assert len(logged) == 1 and logged[0].levelno == logging.INFO


@pytest.mark.parametrize(
    ("route", "body", "status"),
    [
        ("/v1/completions", {"prompt": "x"}, 200),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}, 200),
        ("/completion", {"prompt": "x"}, 200),
        ("/apply-template", {"messages": [{"role": "user", "content": "x"}]}, 200),
        # The tiny model has no FIM tokens: a 400 after the body was read still names them.
        ("/infill", {"input_prefix": "def f(", "input_suffix": ")"}, 400),
    ],
)
def test_every_json_route_names_unknown_fields_and_no_dialects_own(http, route, body, status):
    body = {**body, "max_tokens": 1, "temprature": 0, "topk": 1}
    named = http.post(route, json=body)
    assert named.status_code == status, named.text
    assert named.headers["X-Unknown-Fields"] == "temprature, topk"
    # Other dialects' names (llama.cpp's, vLLM's, chat's) are fields, not misspellings.
    dialects = {"response_fields": ["content"], "n_predict": 1, "top_logprobs": None}
    plain = http.post(route, json={**body, "temprature": None, **dialects})
    assert plain.headers["X-Unknown-Fields"] == "temprature, topk"
    known = {k: v for k, v in {**body, **dialects}.items() if k not in ("temprature", "topk")}
    assert "X-Unknown-Fields" not in http.post(route, json=known).headers


def test_unknown_names_that_are_not_plain_are_encoded_in_the_header(http):
    response = http.post(
        "/v1/completions", json={"prompt": "x", "max_tokens": 1, "bad\r\nname": 1, "é": 2}
    )
    assert response.status_code == 200
    assert response.headers["X-Unknown-Fields"] == "bad%0D%0Aname, %C3%A9"


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        (
            {"temperature": "hot"},
            "temperature",
            "Invalid value for 'temperature': must be a number (got 'hot')",
        ),
        ({"n": 0}, "n", "Invalid value for 'n': must be greater than or equal to 1 (got 0)"),
        ({"top_p": 1.5}, "top_p", "Invalid value for 'top_p': must be less than or equal to 1"),
        ({"n": 1000}, "n", "must be less than or equal to 128 (this server's limit) (got 1000)"),
        (
            {"context_length_exceeded_behavior": "explode"},
            "context_length_exceeded_behavior",
            "must be one of 'truncate', 'error' (got 'explode')",
        ),
        (
            {"logit_bias": [[1, 2, 3]]},
            "logit_bias.0",
            "Invalid value for 'logit_bias.0': must hold at most 2 items (got [1, 2, 3])",
        ),
        ({"stop": 5}, "stop", "Invalid value for 'stop': must be a string or a list (got 5)"),
        (
            {"logit_bias": {"abc": True}},
            "logit_bias.abc",
            "Invalid value for 'logit_bias.abc': must be a number or false (got true)",
        ),
        (
            {"stream_options": {"include_usage": "maybe"}},
            "stream_options.include_usage",
            "must be true or false (got 'maybe')",
        ),
        ({"guided_choice": []}, "guided_choice", "must hold at least 1 item (got [])"),
        ({"tool_choice": "x"}, "tool_choice", "must be one of 'none', 'auto', 'required' or an"),
    ],
)
def test_validation_errors_are_in_our_words_naming_the_field(http, body, param, message):
    error = error_of(http.post("/v1/completions", json={"prompt": "x", **body}), 400)
    assert error["param"] == param
    assert message in error["message"]
    assert "Value error" not in error["message"] and "Input should" not in error["message"]


def test_a_missing_field_is_named(http):
    error = error_of(http.post("/v1/chat/completions", json={"model": "x"}), 400)
    assert (error["param"], error["code"]) == ("messages", "missing_field")
    assert error["message"] == "Missing required field 'messages'."


@pytest.mark.parametrize(
    "content_type",
    [
        None,
        "application/json",
        "application/json; charset=utf-8",
        "application/vnd.api+json",
        "text/plain;charset=UTF-8",  # fetch() with a string body
        "application/x-www-form-urlencoded",  # curl -d, urllib
    ],
)
def test_json_is_read_under_the_documented_content_types(http, content_type):
    headers = {"Content-Type": content_type} if content_type else {}
    response = http.post(
        "/v1/completions", content=b'{"prompt": "x", "max_tokens": 1}', headers=headers
    )
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("content_type", ["multipart/form-data; boundary=x", "application/xml"])
def test_other_content_types_are_415(http, content_type):
    response = http.post(
        "/v1/completions",
        content=b'{"prompt": "x", "max_tokens": 1}',
        headers={"Content-Type": content_type},
    )
    assert error_of(response, 415)["code"] == "unsupported_media_type"


def access_lines(caplog, marker: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "mlxserve.access" and r.levelno == logging.INFO and marker in r.getMessage()
    ]


def test_each_request_gets_one_access_line_with_its_tokens(server, caplog):
    caplog.set_level(logging.INFO, logger="mlxserve.access")
    agent = f"first-run-test/{uuid.uuid4().hex[:8]}"
    with httpx.Client(base_url=server.url, timeout=60, headers={"User-Agent": agent}) as http:
        whole = complete(http, prompt="Hello", max_tokens=3, ignore_eos=True)
        stream_chunks(http, prompt="Hello", max_tokens=4, ignore_eos=True)
        error_of(http.post("/v1/completions", json={"prompt": "x", "temperature": -1}), 400)
    assert wait_until(lambda: len(access_lines(caplog, agent)) == 3)
    plain, streamed, refused = access_lines(caplog, agent)
    prompt = whole["usage"]["prompt_tokens"]
    line = r'127\.0\.0\.1 "POST /v1/completions" {} \d+\.\d{{3}}s {}"{}"'
    tokens = f"prompt_tokens={prompt} completion_tokens={{}} cached_tokens=\\d+ "
    assert re.fullmatch(line.format(200, tokens.format(3), re.escape(agent)), plain), plain
    assert re.fullmatch(line.format(200, tokens.format(4), re.escape(agent)), streamed), streamed
    assert re.fullmatch(line.format(400, "", re.escape(agent)), refused), refused


def test_polls_that_succeed_are_logged_at_debug_only(server, caplog):
    """The menubar polls /admin/status every second: INFO stays the requests' own."""
    caplog.set_level(logging.DEBUG, logger="mlxserve.access")
    agent = f"first-run-test/{uuid.uuid4().hex[:8]}"
    with httpx.Client(base_url=server.url, timeout=60, headers={"User-Agent": agent}) as http:
        for path in ("/health", "/admin/status", "/metrics", "/v1/models"):
            assert http.get(path).status_code == 200

    def lines() -> list[logging.LogRecord]:  # not the DEBUG header lines, which name it too
        return [r for r in caplog.records if r.getMessage().endswith(f'"{agent}"')]

    assert wait_until(lambda: len(lines()) == 4)
    levels = {r.getMessage().split('"')[1]: r.levelname for r in lines()}
    assert levels == {
        "GET /health": "DEBUG",
        "GET /admin/status": "DEBUG",
        "GET /metrics": "DEBUG",
        "GET /v1/models": "INFO",
    }


def test_a_stream_the_client_leaves_is_logged_when_it_stops(server, caplog):
    caplog.set_level(logging.INFO, logger="mlxserve.access")
    agent = f"first-run-test/{uuid.uuid4().hex[:8]}"
    body = {"prompt": "x", "max_tokens": 2000, "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=server.url, timeout=60, headers={"User-Agent": agent}) as http:
        with http.stream("POST", "/v1/completions", json=body) as response:
            next(response.iter_lines())
    assert wait_until(lambda: access_lines(caplog, agent), timeout=30)
    (line,) = access_lines(caplog, agent)
    assert " 200 " in line and "stream cut short" in line
    assert "completion_tokens=2000" not in line


def test_debug_logs_bodies_cut_short_and_never_the_api_key(server, caplog):
    caplog.set_level(logging.DEBUG, logger="mlxserve.access")
    secret = f"sk-{uuid.uuid4().hex}"
    user = "y" * 3000  # a long body of few tokens
    body = {"prompt": "x", "max_tokens": 1, "user": user}
    with httpx.Client(base_url=server.url, timeout=60) as http:
        for headers in ({"Authorization": f"Bearer {secret}"}, {"X-Api-Key": secret}):
            response = http.post("/v1/completions", json=body, headers=headers)
            assert response.status_code == 200
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert not any(secret in message for message in debug)
    assert sum("'<redacted>'" in m for m in debug if "headers:" in m) == 2
    bodies = [m for m in debug if "body:" in m and "yyyy" in m]
    assert len(bodies) == 2 and all(user not in m and "characters)" in m for m in bodies)
