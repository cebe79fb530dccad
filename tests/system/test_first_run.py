"""What a new user meets starting `mlxserve serve` (issue 32): a hub model that cannot be fetched is
a one-line error before serving, a slow BLAS is warned about, a clean stop is logged."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from mlxserve.platform.blas import openblas_library

from ..helpers import start_serve, wait_healthy
from ..live_server import free_port

REPO = "mlx-community/SmolLM2-135M-Instruct-4bit"


def serve(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mlxserve", "serve", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def without_a_hub_cache(tmp_path, **settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    return {**env, "HF_HOME": str(tmp_path / "hf"), **settings}


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        ({"HF_HUB_OFFLINE": "1"}, "HF_HUB_OFFLINE is set"),
        (
            {"HF_ENDPOINT": "http://127.0.0.1:1"},
            "http://127.0.0.1:1 cannot be reached (ConnectError",
        ),
    ],
    ids=["offline", "unreachable hub"],
)
def test_a_repo_id_that_cannot_be_fetched_is_a_one_line_error_before_serving(
    tmp_path, settings, says
):
    result = serve(
        "--model", REPO, "--port", str(free_port()), env=without_a_hub_cache(tmp_path, **settings)
    )
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"mlxserve: error: model {REPO} is not a folder here nor in the local ")
    assert f"Hugging Face cache ({tmp_path / 'hf' / 'hub'})" in line
    assert says in line and line.endswith("--model /path/to/folder")


# What the server runs on: OpenBLAS's preload is the re-execution's, not this test process's.
def started_fresh(**settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MLXSERVE_PORTABLE")}
    return {**env, **settings}


BLAS_REASON = "from mlxserve.platform.blas import slow_blas_reason; print(slow_blas_reason())"


@pytest.mark.skipif(sys.platform != "linux", reason="macOS runs on Accelerate")
@pytest.mark.parametrize(
    ("settings", "reason"),
    [
        (
            {},
            "not preloaded" if openblas_library() else "sudo apt-get install libopenblas0-pthread",
        ),
        ({"MLXSERVE_NO_OPENBLAS": "1"}, "MLXSERVE_NO_OPENBLAS is set"),
        ({"MLXSERVE_PORTABLE": "1"}, "None"),
    ],
    ids=["plain python", "opted out", "portable"],
)
def test_the_slow_blas_is_named_with_the_reason(settings, reason):
    out = subprocess.run(
        [sys.executable, "-c", BLAS_REASON],
        env=started_fresh(**settings),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert reason in out


def test_serve_warns_of_a_slow_blas_and_logs_its_stop(tiny_model):
    port = free_port()
    process = start_serve(
        "--model",
        str(tiny_model),
        "--port",
        str(port),
        env=started_fresh(MLXSERVE_NO_OPENBLAS="1"),
    )
    try:
        wait_healthy(f"http://127.0.0.1:{port}")
    finally:
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr
    lines = stderr.splitlines()
    (warning,) = [line for line in lines if " WARNING " in line]
    assert warning.endswith(
        "mlxserve: MLX's CPU backend runs on its reference BLAS, 10-30x slower than OpenBLAS on "
        "prompts and batches: MLXSERVE_NO_OPENBLAS is set"
    )
    # said by the engine process before it loads the model (the front never loads MLX)
    assert lines.index(warning) < next(i for i, line in enumerate(lines) if "calibrating" in line)
    assert any(f"loading {tiny_model.name} [" in line and "calibrating" in line for line in lines)
    assert lines[-1].endswith("INFO mlxserve: stopped (SIGINT): 0 sequences were in flight")
