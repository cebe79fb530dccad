"""`mlxserve serve`'s flags for several models: sizes, NAME=VALUE pairs, and the refusals a
user sees before anything loads."""

from __future__ import annotations

import argparse

import pytest

from mlxserve import cli
from mlxserve.settings import machine_memory_bytes


@pytest.mark.parametrize(
    ("text", "expected"),
    [("12G", 12 << 30), ("800M", 800 << 20), ("1.5GiB", int(1.5 * (1 << 30))), ("4096", 4096)],
)
def test_memory_budget_takes_sizes(text, expected):
    assert cli.memory_size(text) == expected


def test_memory_budget_takes_a_share_of_the_machine():
    assert cli.memory_size("60%") == int(machine_memory_bytes() * 0.6)


@pytest.mark.parametrize("text", ["", "G", "lots", "0", "-1G", "0%", "150%"])
def test_memory_budget_refuses_what_is_not_a_size(text):
    with pytest.raises(argparse.ArgumentTypeError):
        cli.memory_size(text)


def test_the_several_models_flags_parse():
    args = cli.build_parser().parse_args(
        [
            "serve",
            "--model", "a", "--model", "b",
            "--pin", "a",
            "--adapter", "mine=/adapters/mine",
            "--alias", "gpt-4o-mini=b",
            "--memory-budget", "8G",
        ]
    )  # fmt: skip
    assert args.model == ["a", "b"] and args.pin == ["a"] and args.memory_budget == 8 << 30
    assert args.adapter == [("mine", "/adapters/mine")]
    assert args.alias == [("gpt-4o-mini", "b")]


@pytest.mark.parametrize("pair", ["mine", "=x", "x=", " = "])
def test_pairs_need_a_name_and_a_value(pair):
    with pytest.raises(argparse.ArgumentTypeError):
        cli.name_and_value(pair)


def test_an_adapter_that_is_not_one_stops_serve_before_loading(tmp_path, capsys):
    (tmp_path / "adapter_config.json").write_text("{}")  # no adapters.safetensors
    assert cli.main(["serve", "--adapter", f"mine={tmp_path}"]) == 2
    assert "has no adapters.safetensors" in capsys.readouterr().err


def test_distributed_serves_one_model(tiny_models_dir, capsys):
    two = ["--model", str(tiny_models_dir / "tiny"), "--model", str(tiny_models_dir / "tiny2")]
    assert cli.main(["serve", *two, "--distributed"]) == 2
    assert "--distributed serves one model" in capsys.readouterr().err


def test_a_second_model_that_is_not_there_stops_serve(tiny_model, capsys):
    missing = str(tiny_model.parent / "missing")
    assert cli.main(["serve", "--model", str(tiny_model), "--model", missing]) == 2
    assert f"model folder not found: {missing}" in capsys.readouterr().err


def test_a_pin_or_an_alias_naming_nothing_served_is_said_at_start(tiny_model, caplog):
    from mlxserve.engine.models.served import new_engine, pool_for
    from mlxserve.settings import Settings

    settings = Settings(
        model=str(tiny_model),
        pins=("tyny", str(tiny_model)),
        aliases=(("gpt-4o-mini", "tiny"), ("codellama:7b", "missing")),
    )
    with caplog.at_level("WARNING", logger="mlxserve"):
        pool = pool_for(settings, new_engine(settings, settings.model))
    warned = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("--pin tyny: no such model") for m in warned)
    assert any(m.startswith("--alias codellama:7b=missing") for m in warned)
    assert not any("gpt-4o-mini" in m for m in warned)
    assert pool.resolve("gpt-4o-mini") == "tiny" and pool.is_pinned("tiny")
