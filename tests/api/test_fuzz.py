"""Fuzzing every route from /openapi.json with schemathesis: the document's examples, then
generated requests the document calls valid and invalid, on a real server whose limits (stated
in the document) keep each request small.

Checks: no 5xx; every request the document calls invalid is refused with a 4xx; every 4xx is an
OpenAI-style error body.
"""

from __future__ import annotations

from collections import Counter

import hypothesis.strategies as st
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import negative_data_rejection, not_a_server_error

from mlxserve.settings import Limits

from ..embedding_models import build_tiny_bert, build_tiny_cross_encoder

# The HTTP contract alone: the platform policy does not change it (not in the portable pass).
pytestmark = [pytest.mark.http_only, pytest.mark.fuzz]

FUZZ_LIMITS = Limits(
    max_body_bytes=256 * 1024,
    max_tokens=16,
    max_n=2,
    max_sequences_per_request=4,
    max_logprobs=2,
    grammar_timeout_s=2.0,
    request_timeout_s=5.0,
)
EXAMPLES_PER_ROUTE = 12  # per route and mode: each route with a body gets this many
ROUTES = {
    "POST /v1/completions",
    "POST /completion",
    "POST /completions",
    "POST /infill",
    "GET /v1/models",
    "GET /models",
    "GET /v1/models/{name}",
    "GET /health",
    "GET /metrics",
    "GET /admin/status",
    "POST /admin/load",
    "POST /admin/unload",
    "POST /admin/pin",
    "POST /v1/chat/completions",
    "POST /chat/completions",
    "POST /v1/responses",
    "POST /apply-template",
    "POST /tokenize",
    "POST /detokenize",
    "GET /props",
    "GET /slots",
    "POST /slots/{id_slot}",
    "GET /",
    "GET /api/version",
    "GET /api/tags",
    "POST /api/show",
    "GET /api/ps",
    "POST /api/generate",
    "POST /api/chat",
    "POST /v1/messages",
    "POST /v1/messages/count_tokens",
    "POST /v1/embeddings",
    "POST /embedding",
    "POST /embeddings",
    "POST /api/embed",
    "POST /api/embeddings",
    "POST /v1/rerank",
    "POST /rerank",
    "POST /v1/reranking",
    "POST /reranking",
}
# Routes that name a model: fuzzed names are mostly unknown (404, or the default model's 400),
# so a well-formed name is replaced by the one each route serves for the request to reach it.
EMBEDDING_ROUTES = {
    "POST /v1/embeddings",
    "POST /embedding",
    "POST /embeddings",
    "POST /api/embed",
    "POST /api/embeddings",
}
RERANK_ROUTES = {"POST /v1/rerank", "POST /rerank", "POST /v1/reranking", "POST /reranking"}
NAMES_A_MODEL = {"POST /api/generate", "POST /api/chat", *EMBEDDING_ROUTES, *RERANK_ROUTES}
# Routes whose answer is a 5xx by design: slot save/restore/erase are 501 (not supported).
NOT_SUPPORTED = {"POST /slots/{id_slot}"}


@pytest.fixture(scope="module")
def fuzz_server(live_servers, tiny_coder, tmp_path_factory):
    """The tiny coder: it has fill-in-the-middle tokens, so `suffix` and /infill run for real;
    a tiny embedding model and a tiny reranker beside it. A server of this module's own: the
    fuzzer loads and unloads models through /admin."""
    folder = tmp_path_factory.mktemp("fuzz-embedding")
    models = (
        str(build_tiny_bert(folder / "tiny-bert")),
        str(build_tiny_cross_encoder(folder / "tiny-reranker")),
    )
    with live_servers.own(tiny_coder, limits=FUZZ_LIMITS, models=models) as live:
        yield live


@pytest.fixture(scope="module")
def api_schema(fuzz_server):
    schema = schemathesis.openapi.from_url(fuzz_server.url + "/openapi.json")
    schema.config.update(base_url=fuzz_server.url)
    return schema


def openai_error_shape(ctx, response, case):
    """A 4xx says what was wrong, in OpenAI's shape (Ollama's and Anthropic's on theirs)."""
    if 400 <= response.status_code < 500 and case.path.startswith("/v1/messages"):
        body = response.json()
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
        assert body["error"]["message"] and "Traceback" not in body["error"]["message"]
    elif 400 <= response.status_code < 500 and case.path.startswith("/api/"):
        error = response.json()
        assert set(error) == {"error"} and error["error"], error
        assert "Traceback" not in error["error"]
    elif 400 <= response.status_code < 500:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}, error
        assert error["message"] and "Traceback" not in error["message"]


def well_formed_name(body) -> bool:
    """A `model` that breaks none of its own rules (so a negative case stays negative)."""
    name = body.get("model") if isinstance(body, dict) else None
    return isinstance(name, str) and 1 <= len(name) <= 1024


def strategy(schema, operation, mode: str):
    if mode == "examples":
        return st.one_of(schema.get_strategies_from_examples(operation))
    return operation.as_strategy(generation_mode=GenerationMode(mode))


@pytest.mark.parametrize("mode", ["examples", "positive", "negative"])
def test_every_route_survives_fuzzing(api_schema, fuzz_server, mode):
    operations = [result.ok() for result in api_schema.get_all_operations()]
    served_name = fuzz_server.engine.model_name
    statuses: Counter = Counter()
    assert {op.label for op in operations} == ROUTES  # every route is in the document
    for operation in operations:
        if mode == "examples" and not api_schema.get_strategies_from_examples(operation):
            continue

        @given(case=strategy(api_schema, operation, mode))
        @settings(
            max_examples=EXAMPLES_PER_ROUTE,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
            database=None,
        )
        def fuzz(case):
            label = case.operation.label
            if label in NAMES_A_MODEL and well_formed_name(case.body):
                case.body["model"] = (
                    "tiny-bert"
                    if label in EMBEDDING_ROUTES
                    else "tiny-reranker"
                    if label in RERANK_ROUTES
                    else served_name
                )
            response = case.call(timeout=30)
            statuses[(case.operation.label, response.status_code)] += 1

            if case.operation.label in NOT_SUPPORTED and response.status_code == 501:
                return
            case.validate_response(
                response,
                checks=[not_a_server_error, negative_data_rejection],
                additional_checks=[openai_error_shape],
            )

        try:
            fuzz()
        except Unsatisfiable:
            # Nothing invalid can be sent to a route without a body (its only parameter, if
            # any, is a path segment: any string).
            assert mode == "negative" and not operation.body, operation.label
    print(mode, sorted(statuses.items()))
    sent = sum(statuses.values())
    # Each mode really sent requests: answers, and for invalid data, refusals (at least the full
    # count to five of the routes with a body, as before the chat routes came).
    assert sent >= (10 if mode == "examples" else 5 * EXAMPLES_PER_ROUTE), statuses
    completions = {s for (label, s) in statuses if label == "POST /v1/completions"}
    assert (400 in completions) if mode == "negative" else (200 in completions), statuses
