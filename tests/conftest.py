from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest

from mlxserve.platform import reexec_for_cpu
from mlxserve.tiny_model import build_tiny_model

from .live_server import LiveServer

SHARED_MODELS = Path(__file__).resolve().parents[1].parent / "shared" / "models"


def pytest_configure(config):
    """Run MLX as `mlxserve serve` runs it: re-executed once under OpenBLAS (and huge pages)
    where installed; nothing changes on macOS or with MLXSERVE_PORTABLE=1. Output capture is
    stopped first, so the new process writes to the terminal, not to this one's capture files."""
    capture = config.pluginmanager.getplugin("capturemanager")
    if capture is not None:
        capture.stop_global_capturing()
    reexec_for_cpu()
    if capture is not None:
        capture.start_global_capturing()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny", seed=0)


@pytest.fixture(scope="session")
def tiny_model_4bit(tiny_model, tmp_path_factory) -> Path:
    """The tiny model quantized to 4 bits, as most models users run on a Mac are."""
    import mlx_lm

    path = tmp_path_factory.mktemp("models") / "tiny-4bit"
    mlx_lm.convert(str(tiny_model), str(path), quantize=True, q_bits=4, q_group_size=32)
    return path


@pytest.fixture(scope="session")
def tiny_lm(tiny_model):
    """The tiny model loaded by mlx-lm, for tests that drive mlx-lm directly (unpatched)."""
    import mlx_lm

    return mlx_lm.load(str(tiny_model))[0]


@pytest.fixture(scope="session")
def server(tiny_model):
    with LiveServer(str(tiny_model)) as live:
        yield live


@pytest.fixture(scope="session")
def tokenizer(server):
    return server.engine.loaded.tokenizer


@pytest.fixture
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


@pytest.fixture(scope="session")
def smollm2_server():
    """SmolLM2-135M from ../shared/models, served once for every test that needs a real model:
    a load (float32 widening, calibration) took ~33 s of a CI run, and four modules use it."""
    with LiveServer(str(shared_model("smollm2-135m-instruct-4bit"))) as live:
        yield live


def shared_model(name: str) -> Path:
    path = SHARED_MODELS / name
    if not (path / "config.json").exists():
        pytest.skip(f"{name} is not in {SHARED_MODELS}")
    return path
