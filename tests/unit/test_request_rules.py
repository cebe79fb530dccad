"""The shared request model owns its rules and the engine's settings: a rule that spans fields
answers with its own message, param and code, `samplers` is canonical once parsed, and
SamplingParams and StopSpec come from the canonical request it translates into."""

from __future__ import annotations

import pytest

from mlxserve.api.errors import InvalidRequest
from mlxserve.api.llamacpp.protocol import NativeCompletionRequest
from mlxserve.api.ollama.protocol import GenerateRequest
from mlxserve.api.ollama.translate import completion_request
from mlxserve.api.parsing import validate
from mlxserve.api.protocol import CompletionRequest
from mlxserve.engine import StopSpec
from mlxserve.planning.plan import sampling_for
from mlxserve.sampling.params import DEFAULT_SAMPLERS


def refusal(body, model=CompletionRequest) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        validate(model, body)
    return caught.value


@pytest.mark.parametrize(
    ("body", "param", "code", "message"),
    [
        ({"n": 3, "best_of": 2}, "best_of", None, "best_of (2) must be at least n (3)."),
        (
            {"best_of": 3, "stream": True},
            "best_of",
            None,
            "best_of > n cannot be streamed: the best choices are known only at the end.",
        ),
        (
            {"max_tokens": 3, "min_tokens": 5},
            "min_tokens",
            None,
            "min_tokens (5) must not exceed max_tokens (3).",
        ),
        (
            {"dry_multiplier": 0.8, "dry_base": 0.5},
            "dry_base",
            None,
            "dry_base must be at least 1 when DRY is on (dry_multiplier > 0), got 0.5.",
        ),
        (
            {"samplers": "kz"},
            "samplers",
            None,
            "Unknown sampler 'z' in 'samplers'; known: penalties, dry, top_n_sigma, top_k, typ_p, "
            "top_p, min_p, xtc, temperature (or llama.cpp's letters edskypmxti).",
        ),
        (
            {"use_beam_search": True},
            "use_beam_search",
            "unsupported_parameter",
            "'use_beam_search' is not supported by this server yet; remove it or send its default.",
        ),
    ],
)
def test_a_rule_spanning_fields_names_the_field_to_change(body, param, code, message):
    error = refusal({"prompt": "x", **body})
    assert (error.message, error.param, error.code, error.status) == (message, param, code, 400)


def test_a_fields_own_fault_is_named_before_rules_spanning_fields():
    assert refusal({"prompt": "x", "n": 3, "best_of": 2, "temperature": -1}).param == "temperature"


def test_a_field_not_built_yet_is_named_before_anything_else():
    body = {"prompt": "x", "temperature": -1, "prompt_logprobs": 1}
    assert refusal(body).param == "prompt_logprobs"


@pytest.mark.parametrize(
    ("samplers", "names"),
    [
        (None, DEFAULT_SAMPLERS),
        ("kt", ("top_k", "temperature")),
        (["temp", "typical", "infill"], ("temperature", "typ_p", "infill")),
        ("", ()),
    ],
)
def test_samplers_are_canonical_names_once_parsed(samplers, names):
    assert validate(CompletionRequest, {"prompt": "x", "samplers": samplers}).samplers == names


def test_sampling_params_come_from_the_request():
    body = {
        "prompt": "x",
        "temperature": 0.5,
        "top_k": -1,
        "logit_bias": {"7": 2.5},
        "samplers": "kti",
        "allowed_token_ids": [1, 2],
        "mirostat_lr": 0.2,
    }
    request = validate(CompletionRequest, body).to_request()
    params = sampling_for(request, None, (0, 9), grammar="g")
    assert (params.temperature, params.top_k, params.mirostat_eta) == (0.5, 0, 0.2)
    assert params.logit_bias == {7: 2.5} and params.allowed_token_ids == (1, 2)
    assert params.samplers == ("top_k", "temperature", "infill")
    assert params.infill_end_ids == (0, 9) and params.grammar == "g" and params.dry is None


def test_infill_ends_reach_the_sampler_only_when_it_runs():
    request = validate(CompletionRequest, {"prompt": "x"}).to_request()
    params = sampling_for(request, None, (0, 9), grammar=None)
    assert params.infill_end_ids == ()


def test_stop_spec_comes_from_the_request():
    body = {
        "prompt": "x",
        "stop": ["\n", ""],
        "stop_token_ids": [3],
        "min_tokens": 2,
        "n_indent": 4,
        "ignore_eos": True,
        "include_stop_str_in_output": True,
    }
    stop = validate(NativeCompletionRequest, body).to_request().stop
    assert stop == StopSpec(
        strings=("\n",),
        token_ids=(3,),
        include_in_output=True,
        min_tokens=2,
        ignore_eos=True,
        min_indent=4,
        max_predict_ms=None,
        deadline=None,  # the server's request timeout, which planning adds
    )


@pytest.mark.parametrize(("n_keep", "kept"), [(None, 0), (5, 5), (-1, None)])
def test_n_keep_is_what_a_cut_prompt_keeps_in_front(n_keep, kept):
    """llama.cpp's n_keep: -1 keeps every token that fits (None); unset, none."""
    body = {"prompt": "x"} if n_keep is None else {"prompt": "x", "n_keep": n_keep}
    assert validate(NativeCompletionRequest, body).to_request().fit.keep_first == kept


@pytest.mark.parametrize(("num_keep", "kept"), [(None, 4), (0, 0), (-1, None)])
def test_ollamas_num_keep_is_the_same_with_ollamas_default(num_keep, kept):
    options = {} if num_keep is None else {"num_keep": num_keep}
    body = validate(GenerateRequest, {"model": "m", "prompt": "x", "raw": True, "options": options})
    assert completion_request(body).fit.keep_first == kept
