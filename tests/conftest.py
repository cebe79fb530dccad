from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

from mlxserve.platform import reexec_for_cpu
from mlxserve.tiny_model import build_tiny_coder, build_tiny_model

from .helpers import BackgroundStream

# Imported where used: pytest starts twice (pytest_configure's re-execution), and MLX, mlx-lm
# and the openai client take seconds to import.
if TYPE_CHECKING:
    import openai

# Servers the tests start (`mlxserve serve` included) keep no prefix cache on disk, unless a
# test gives them a folder: one test's prompts must not be cached for another's.
os.environ["MLXSERVE_PREFIX_CACHE_DIR"] = "none"

SHARED_MODELS = Path(__file__).resolve().parents[1].parent / "shared" / "models"
SMOLLM2 = "smollm2-135m-instruct-4bit"
SMOLLM2_ID = "SmolLM2"  # in the ids of the tests on it, for pytest_xdist_make_scheduler
# Modules whose tests share one worker under `--dist loadgroup`, by group: what they share is
# dear. The engine process's front; the default model's server, whose 4-bit weights are widened
# at load; the draft model's server.
WORKER_GROUPS = {
    "tests/system/test_engine_process.py": "engine process",  # one front, one engine process
    "tests/api/test_demo_model.py": "default model",
    "tests/api/test_editor_replays.py": "default model",
    "tests/api/test_speculation_draft_model_api.py": "draft model server",  # one server, not two
}

# Over Quart's 60 s default; MLXSERVE_LONG_STREAM_SECONDS=190 makes it the 3-minute check.
LONG_STREAM_SECONDS = float(os.environ.get("MLXSERVE_LONG_STREAM_SECONDS", "65"))
LONG_STREAM_STEP_S = 0.5  # the long stream's engine waits this long before each step
LONG_STREAM_TEST = "test_a_stream_longer_than_a_minute_ends_with_done"
# pytest-timeout's bound for a test on a real model (`slow`): SmolLM2's longest, 31 s in its
# pass, took 707 s when two passes shared a slow VM's cores (docs/benchmarks.md, "Slow machines")
SLOW_TEST_TIMEOUT_S = 900


def pytest_configure(config):
    """Run MLX as `mlxserve serve` runs it: re-executed once under OpenBLAS (and huge pages)
    where installed; nothing changes on macOS or with MLXSERVE_PORTABLE=1. Output capture is
    stopped first, so the new process writes to the terminal, not to this one's capture files.
    pytest-xdist's workers inherit the new environment, so they are not re-executed again."""
    capture = config.pluginmanager.getplugin("capturemanager")
    if capture is not None:
        capture.stop_global_capturing()
    reexec_for_cpu()
    if capture is not None:
        capture.start_global_capturing()


def pytest_report_header(config):
    """How fast this machine is (tests/machine_speed.py): a slow run's log says whether the
    machine was slow."""
    from .machine_speed import describe

    return describe()


def pytest_collection_modifyitems(items):
    """The tests that share a worker come first, the longest group first, so that under
    `--dist loadgroup` no group starts late and runs alone at the end while the other core idles:
    SmolLM2's, then WORKER_GROUPS' (in that order), then every other test as collected.

    The tests on SmolLM2 run one after the other: the engine tier's first, then the server's,
    the long stream's last, so that the minute it streams in the background (begun with the
    SmolLM2 engine, see smollm2_engine and long_stream) passes while the others run."""
    on_smollm2 = [item for item in items if "smollm2_engine" in item.fixturenames]
    on_smollm2.sort(
        key=lambda item: (
            "smollm2_server" in item.fixturenames,
            item.originalname == LONG_STREAM_TEST,
        )
    )
    groups = list(dict.fromkeys(WORKER_GROUPS.values()))
    grouped = sorted(
        (item for item in items if item.nodeid.partition("::")[0] in WORKER_GROUPS),
        key=lambda item: groups.index(WORKER_GROUPS[item.nodeid.partition("::")[0]]),
    )
    first = {id(item) for item in (*on_smollm2, *grouped)}
    items[:] = [*on_smollm2, *grouped, *(item for item in items if id(item) not in first)]
    # A real model's own answers (`slow`) outlast pytest-timeout's bound on a loaded 2-core CI
    # machine; a bound of their own, unless the test names one.
    for item in items:
        if item.get_closest_marker("slow") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(SLOW_TEST_TIMEOUT_S))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadgroup`: tests go one by one to whichever worker is free, except those that
    must share a worker: the tests on SmolLM2 (one load, and the long stream beside them), and
    WORKER_GROUPS' modules. pytest-xdist's own loadgroup reads `xdist_group` marks from the node
    ids, which pytest 9.2 no longer lets it rename (pytest-xdist issue 1386); the SmolLM2
    tests carry the model's id instead (the smollm2_server fixture's parameter)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedWorkers(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.endswith("]") and SMOLLM2_ID in nodeid.rpartition("[")[2][:-1].split("-"):
                return SMOLLM2_ID
            return WORKER_GROUPS.get(nodeid.partition("::")[0], nodeid)

    return SharedWorkers(config, log)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny", seed=0)


@pytest.fixture(scope="session")
def tiny_model_head32(tmp_path_factory) -> Path:
    """The tiny model with 2 heads of 32 (1 KV head): KV MLX can quantize (groups of 32)."""
    overrides = {"num_attention_heads": 2, "num_key_value_heads": 1}
    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-head32", 0, False, overrides)


@pytest.fixture(scope="session")
def tiny_coder(tmp_path_factory) -> Path:
    """The tiny model with StarCoder's FIM tokens (SPM, as the demo model): editors' infill
    requests end to end, fast in both passes."""
    return build_tiny_coder(tmp_path_factory.mktemp("models") / "tiny-coder", seed=0)


@pytest.fixture(scope="session")
def tiny_models_dir(tiny_model) -> Path:
    """The session's tiny model, a second one (other weights) beside it, and a broken one."""
    build_tiny_model(tiny_model.parent / "tiny2", seed=1)
    broken = tiny_model.parent / "broken"
    broken.mkdir(exist_ok=True)
    (broken / "config.json").write_text((tiny_model / "config.json").read_text())
    (broken / "model.safetensors").write_bytes(b"not safetensors")
    return tiny_model.parent


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
def live_servers():
    """Every in-process server of the session; the shared ones are stopped at its end."""
    from .live_server import LiveServers

    servers = LiveServers()
    yield servers
    servers.stop_all()


@pytest.fixture
def live_server(live_servers):
    """`live_server(model, **settings)`: the session's server for that model and those settings,
    started on first use and shared with every test asking for the same, which must leave it as
    it found it. `live_server(model, own=True, **settings)`: a fresh one for this test alone,
    stopped when it ends, for a test that switches or unloads models, drains or stops it."""
    with ExitStack() as own_servers:

        def start(model, own: bool = False, **settings):
            if own:
                return own_servers.enter_context(live_servers.own(model, **settings))
            return live_servers.shared(model, **settings)

        yield start


@pytest.fixture(scope="session")
def server(live_servers, tiny_model):
    return live_servers.shared(tiny_model)


@pytest.fixture(scope="session")
def tokenizer(server):
    return server.engine.loaded.tokenizer


@pytest.fixture
def client(server) -> openai.OpenAI:
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture
def http(server):
    """The shared server over httpx, waiting as long for an answer as pytest-timeout waits for a
    test: a loaded 2-core CI machine takes minutes for what a normal one does in seconds."""
    with httpx.Client(base_url=server.url, timeout=300) as c:
        yield c


@pytest.fixture
def faults(monkeypatch):
    """Faults on purpose for this test (tests/faults.py): FaultyRequests, and bodies whose
    `user` asks for one, fail where they say; undone when the test ends."""
    from .faults import install

    install(monkeypatch.setattr)


@pytest.fixture(scope="session")
def smollm2_engine(request):
    """SmolLM2-135M's engine, loaded once for the engine tier's tests on it and the SmolLM2
    server alike: in the portable pass a load takes ~45 s of a core (its prefill timing runs
    MLX's quantized kernels). Where the session runs the long stream, that starts now, beside
    every test on SmolLM2 (its minute is longer than the server's tests alone)."""
    from mlxserve.engine import Engine

    path = shared_model(SMOLLM2)
    if any(item.originalname == LONG_STREAM_TEST for item in request.session.items):
        request.getfixturevalue("long_stream")
    engine = Engine(str(path)).start()
    assert engine.wait_ready(300), engine.error
    yield engine
    engine.stop()


@pytest.fixture(scope="session", params=[pytest.param(SMOLLM2, id=SMOLLM2_ID)])
def smollm2_server(live_servers, smollm2_engine, request):
    """SmolLM2-135M from ../shared/models, served once for every test that needs a real model:
    a load (float32 widening, calibration) takes seconds of both cores, and several modules use
    it. The model is the fixture's parameter so that its name is in these tests' ids, where
    pytest_xdist_make_scheduler finds them."""
    return live_servers.shared(shared_model(request.param), engine=smollm2_engine)


@pytest.fixture(scope="session")
def long_stream(live_servers, tiny_model) -> Iterator[BackgroundStream]:
    """A stream of LONG_STREAM_SECONDS, from a server of its own whose engine waits before each
    step (a slow model, as a wrapper around the engine's step: the minute costs no CPU). Begun
    with the SmolLM2 engine (smollm2_engine), so that it runs beside the tests on it."""
    with live_servers.own(tiny_model) as live:
        engine, step = live.engine, live.engine.step

        def slow_step() -> None:
            time.sleep(LONG_STREAM_STEP_S)
            step()

        engine.step = slow_step
        tokens = int(LONG_STREAM_SECONDS / LONG_STREAM_STEP_S)
        body = {"prompt": "Once upon a time", "max_tokens": tokens, "ignore_eos": True}
        stream = BackgroundStream(live.url, body)
        yield stream
        stream.join()


def shared_model(name: str) -> Path:
    path = SHARED_MODELS / name
    if not (path / "config.json").exists():
        pytest.skip(f"{name} is not in {SHARED_MODELS}")
    return path
