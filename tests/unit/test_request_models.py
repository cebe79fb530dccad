"""Property tests (hypothesis) on the request models: what the JSON schema in /openapi.json says
is exactly what the server accepts, every alias means its field, and any body at all ends in a
request or an InvalidRequest naming a field, never another exception."""

from __future__ import annotations

import copy
import json

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings
from jsonschema import Draft202012Validator

from mlxserve.api.errors import InvalidRequest
from mlxserve.api.llamacpp.protocol import InfillRequest, NativeCompletionRequest
from mlxserve.api.openapi import _set_integer_maximum, limited_model, limited_names
from mlxserve.api.parsing import parse_json_object, validate
from mlxserve.api.protocol import CompletionRequest
from mlxserve.settings import Limits

MODELS = (CompletionRequest, NativeCompletionRequest, InfillRequest)
# Rules a one-field body cannot show: `prompt` ids are checked against the vocabulary later,
# min_tokens against max_tokens.
CROSS_CHECKED = {"prompt", "min_tokens"}
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)
# Values near the fields' bounds (0, 1, 2, 5, 10, 100, 128, 2^31, 2^64...) and typical shapes.
NEAR_BOUNDS = (
    st.integers(-3, 140)
    | st.sampled_from([2**31 - 1, 2**31, 2**63, 2**64 - 1, 2**64, 10_000, 10_001, 32_768, 32_769])
    | st.floats(-3, 12)
    | st.lists(st.integers(-2, 5) | st.sampled_from(["top_k", "min_p", "x", ""]), max_size=3)
    | st.sampled_from(["kmpt", "xyz", "auto", "text", "json_object", "truncate", "regex"])
)
FAST = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))


def documented_schema(model) -> dict:
    """The model's JSON schema as /openapi.json serves it: the default limits written in."""
    schema = copy.deepcopy(model.model_json_schema())
    limits = Limits()
    for name, limit in limited_names(limited_model(schema)).items():
        if name in schema["properties"]:
            _set_integer_maximum(schema["properties"][name], getattr(limits, limit))
    return schema


def parse(body, model=CompletionRequest):
    """As the server does: from the JSON text."""
    return validate(model, parse_json_object(json.dumps(body).encode()))


def parses(model, body) -> bool:
    try:
        parse(body, model)
        return True
    except InvalidRequest as error:
        assert error.message
        return False


def field_cases():
    for model in MODELS:
        schema = documented_schema(model)
        for name, prop in schema["properties"].items():
            if name not in CROSS_CHECKED:
                yield pytest.param(model, schema, name, prop, id=f"{model.__name__}.{name}")


@pytest.mark.parametrize(("model", "schema", "name", "prop"), list(field_cases()))
def test_the_schema_says_exactly_what_is_accepted(model, schema, name, prop):
    validator = Draft202012Validator({**schema, "$defs": schema.get("$defs", {})})
    values = st.one_of(JSON, NEAR_BOUNDS, st.just(prop.get("default")))

    @given(value=values)
    @FAST
    def check(value):
        body = {"prompt": "x", name: value}
        documented = validator.is_valid(body)
        assert parses(model, body) == documented, (body, documented)

    check()


def aliased_fields():
    for name, info in CompletionRequest.model_fields.items():
        if info.validation_alias is not None:
            for alias in info.validation_alias.choices:
                if alias != name:
                    yield pytest.param(name, alias, id=f"{alias}->{name}")


@pytest.mark.parametrize(("name", "alias"), list(aliased_fields()))
@given(value=JSON | st.integers(min_value=-2, max_value=40) | st.floats(0, 12))
@FAST
def test_an_alias_means_its_field(name, alias, value):
    def canonical(key):
        try:
            return getattr(parse({"prompt": "x", key: value}), name)
        except InvalidRequest as error:
            return ("error", error.param)

    by_name, by_alias = canonical(name), canonical(alias)
    if isinstance(by_name, tuple):
        assert by_alias == ("error", alias)
    else:
        assert by_alias == by_name


KNOWN = sorted({n for m in MODELS for n in documented_schema(m)["properties"]})


@given(body=st.dictionaries(st.sampled_from(KNOWN) | st.text(max_size=6), JSON, max_size=8))
@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
def test_any_body_parses_or_names_its_fault(body):
    for model in MODELS:
        try:
            parse(body, model)
        except InvalidRequest as error:
            assert error.message and error.status == 400
