"""The command line, run as a user would: a real subprocess."""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys

import httpx

from ..helpers import start_serve, wait_healthy
from ..live_server import free_port


def mlxserve(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mlxserve", *args],
        capture_output=True,
        text=True,
        timeout=60,
        **kwargs,
    )


def test_help_documents_every_flag():
    result = mlxserve("serve", "--help")
    assert result.returncode == 0
    for flag in (
        "--model",
        "--host",
        "--port",
        "--api-key",
        "--max-body-bytes",
        "--kv-budget-mb",
        "--max-queue",
        "--prefix-cache-mb",
        "--log-level",
    ):
        assert flag in result.stdout
    assert "127.0.0.1" in result.stdout


def test_every_flag_has_help():
    from mlxserve.cli import build_parser

    (commands,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    for action in commands.choices["serve"]._actions:
        assert action.help, action.option_strings


def test_version_names_mlxserve_and_its_mlx():
    from importlib.metadata import version

    result = mlxserve("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == (
        f"mlxserve {version('mlxserve')} (mlx {version('mlx')}, mlx-lm {version('mlx-lm')})"
    )


def test_a_port_in_use_is_a_one_line_error_before_the_model_loads():
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = mlxserve("serve", "--port", str(port))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and "loading" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        f"mlxserve: error: cannot listen on 127.0.0.1:{port}: Address already in use "
        "(another server there? choose another with --port)"
    ]


def test_bad_model_path_is_a_one_line_error():
    result = mlxserve("serve", "--model", "/nonexistent/model")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        "mlxserve: error: model folder not found: /nonexistent/model"
    ]


def test_folder_without_a_model_is_a_one_line_error(tmp_path):
    result = mlxserve("serve", "--model", str(tmp_path))
    assert result.returncode == 2 and "no config.json" in result.stderr
    assert "Traceback" not in result.stderr


def test_unloadable_model_exits_nonzero_without_traceback(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "no-such-architecture"}')
    port = free_port()
    result = mlxserve("serve", "--model", str(tmp_path), "--port", str(port))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "could not load model" in result.stderr


def test_serve_answers_then_stops_on_sigint(tiny_model):
    """Also when SIGINT was ignored at start, as for a background job of a script."""
    port = free_port()
    process = start_serve(
        "--model",
        str(tiny_model),
        "--port",
        str(port),
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url)
        response = httpx.post(
            url + "/v1/completions", json={"prompt": "x", "max_tokens": 3}, timeout=60
        )
        assert response.status_code == 200
        assert response.json()["usage"]["completion_tokens"] <= 3
    finally:
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr
    assert "Traceback" not in stderr
    assert "127.0.0.1" in stderr


def test_without_a_model_it_serves_the_embedded_demo_coder():
    port = free_port()
    process = start_serve("--port", str(port))
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url)
        models = httpx.get(url + "/v1/models", timeout=60).json()["data"]
        assert models[0]["id"] == "mlxserve-demo-coder"
        answer = httpx.post(
            url + "/v1/completions",
            json={"prompt": "def add(a, b):\n", "max_tokens": 8, "temperature": 0},
            timeout=60,
        ).json()
        assert answer["usage"]["completion_tokens"] > 0
    finally:
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=30)
    assert process.returncode == 0
