"""One model over 2 local ranks (mlx.launch, ring backend on 127.0.0.1): the same answers as the
single-process server, tensor parallel and pipeline parallel; a model that splits neither way is
refused at start; a rank that dies fails requests with 503 and stops rank 0."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from mlxserve.tiny_model import build_tiny_model

from ..helpers import skip_for_missing, wait_healthy
from ..live_server import free_port

LAUNCH = Path(sys.executable).with_name("mlx.launch")
PROBE = "import mlx.core as mx; g = mx.distributed.init(strict=True); mx.eval(mx.distributed.all_sum(mx.ones(64), group=g)); print('ok', g.rank())"  # noqa: E501


def launch(command: list[str], log: Path, port_base: int) -> subprocess.Popen:
    return subprocess.Popen(
        [
            str(LAUNCH),
            "--backend",
            "ring",
            "-n",
            "2",
            "--hosts",
            "127.0.0.1",
            "--starting-port",
            str(port_base),
            "--",
            *command,
        ],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


@pytest.fixture(scope="module")
def ring(tmp_path_factory):
    """Skips, saying why, where two ring ranks cannot start here."""
    if not LAUNCH.exists() or shutil.which("bash") is None:
        skip_for_missing("mlx.launch is not installed with mlx")
    log = tmp_path_factory.mktemp("ring") / "probe.log"
    probe = launch([sys.executable, "-c", PROBE], log, free_port())
    try:
        probe.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(probe.pid, signal.SIGKILL)
        pytest.skip("the ring backend did not start 2 ranks on 127.0.0.1 within 60 s")
    if log.read_text().count("ok ") != 2:
        pytest.skip(f"the ring backend cannot run here: {log.read_text()[-300:]}")


def serve_command(port: int, model: Path, *extra: str) -> list[str]:
    """One rank's command: `mlxserve serve --distributed` on the tiny model."""
    return [
        sys.executable,
        "-m",
        "mlxserve",
        "serve",
        "--distributed",
        "--port",
        str(port),
        "--model",
        str(model),
        *extra,
    ]


THREE_HEADS = {"hidden_size": 48, "num_attention_heads": 3, "num_key_value_heads": 3}


@pytest.fixture(scope="module")
def three_heads(tmp_path_factory) -> dict[str, Path]:
    """Tiny models with 3 heads, which do not split over 2 ranks: a Qwen2 (mlx-lm has a
    pipeline for it) and a Llama (it has none)."""
    folder = tmp_path_factory.mktemp("three-heads")
    qwen2 = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]}
    return {
        "qwen2": build_tiny_model(folder / "qwen2", 0, False, THREE_HEADS | qwen2),
        "llama": build_tiny_model(folder / "llama", 0, False, THREE_HEADS),
    }


@pytest.fixture
def cluster(ring, tiny_model, tmp_path):
    with running_cluster(tiny_model, tmp_path) as running:
        yield running


@contextmanager
def running_cluster(model: Path, tmp_path: Path):
    """Two ranks serving `model`: (url, the launcher's process, its log); stopped after."""
    port = free_port()
    log = tmp_path / "cluster.log"
    process = launch(serve_command(port, model), log, free_port())
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_healthy(url)
        except AssertionError:
            pytest.fail(f"the distributed server never got ready: {log.read_text()[-2000:]}")
        yield url, process, log
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                pass
        with contextlib.suppress(ProcessLookupError):  # the launcher, and any rank left
            os.killpg(process.pid, signal.SIGKILL)


SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer"}},
    "required": ["a"],
    "additionalProperties": False,
}
BODIES = [
    {"prompt": "def main():\n", "max_tokens": 24, "temperature": 0, "ignore_eos": True},
    {"prompt": "import os\n", "max_tokens": 24, "temperature": 0.9, "seed": 7, "ignore_eos": True},
    {
        "prompt": "class A:\n",
        "max_tokens": 24,
        "temperature": 0.7,
        "top_k": 20,
        "seed": 3,
        "ignore_eos": True,
    },
    {"prompt": "x = [", "max_tokens": 24, "temperature": 0, "ignore_eos": True, "n": 2},
    {"prompt": "x", "max_tokens": 20, "temperature": 0.8, "seed": 2, "json_schema": SCHEMA},
    {"prompt": "def f():\n", "max_tokens": 4, "temperature": 0, "echo": True, "logprobs": 1},
    # Prefilled in chunks beside the streams above: the pacer sizes them from timings, and
    # every rank must run rank 0's sizes.
    {"prompt": "import sys\n" * 150, "max_tokens": 8, "temperature": 0, "ignore_eos": True},
]


def answers(url: str, stream: bool) -> list[list[str]]:
    """The 4 bodies at once; each answer's choices' texts."""
    results: list[list[str]] = [[] for _ in BODIES]

    def one(i: int) -> None:
        body = BODIES[i] | {"stream": stream}
        with httpx.Client(base_url=url, timeout=120) as client:
            response = client.post("/v1/completions", json=body)
            if response.status_code != 200 or '"error"' in response.text:
                results[i] = [f"HTTP {response.status_code}: {response.text[-500:]}"]
                return
            if not stream:
                results[i] = [c["text"] for c in response.json()["choices"]]
                return
            texts: dict[int, str] = {}
            for line in response.text.split("\n\n"):
                if line.startswith("data: {"):
                    for c in json.loads(line[6:])["choices"]:
                        texts[c["index"]] = texts.get(c["index"], "") + c["text"]
            results[i] = [texts[k] for k in sorted(texts)]

    def guarded(i: int) -> None:
        try:
            one(i)
        except Exception as e:  # noqa: BLE001
            results[i] = [f"{type(e).__name__}: {e}"]

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(len(BODIES))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return results


def test_two_ranks_answer_as_one_process(cluster, server):
    """Greedy, seeded, n, a JSON schema, echo with logprobs; then a stream the client drops."""
    url, _, _ = cluster
    for stream in (False, True):
        single = answers(server.url, stream)
        assert all(all(texts) for texts in single)
        assert answers(url, stream) == single
    body = {"prompt": "a", "max_tokens": 1000, "stream": True, "ignore_eos": True}
    with httpx.Client(base_url=url, timeout=60) as client:
        with client.stream("POST", "/v1/completions", json=body) as response:
            for n, _ in enumerate(response.iter_lines()):
                if n > 6:
                    break
        deadline = time.monotonic() + 10
        while "cancelled_sequences_total 1" not in client.get("/metrics").text:
            assert time.monotonic() < deadline, "the dropped stream was not cancelled"
            time.sleep(0.1)
        assert answers(url, False)[0] == answers(server.url, False)[0]


def test_heads_that_do_not_split_run_as_a_pipeline_and_answer_as_one_process(
    ring, three_heads, live_servers, tmp_path
):
    with running_cluster(three_heads["qwen2"], tmp_path) as (url, _, log):
        assert "pipeline parallel over 2 ranks" in log.read_text()
        with live_servers.own(three_heads["qwen2"]) as single:
            for stream in (False, True):
                alone = answers(single.url, stream)
                assert all(all(texts) for texts in alone)
                assert answers(url, stream) == alone


def test_a_model_that_splits_neither_way_is_refused_at_start(ring, three_heads, tmp_path):
    log = tmp_path / "refused.log"
    process = launch(serve_command(free_port(), three_heads["llama"]), log, free_port())
    try:
        process.wait(60)  # (mlx.launch itself exits 0 whatever its ranks did)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert "rank 0 exited with code 1" in log.read_text()
    assert (
        "its 3 attention heads (3 key/value heads) do not split evenly over 2 ranks (3 ranks "
        "would), and mlx-lm has no pipeline parallelism for llama models"
    ) in log.read_text()


def test_a_rank_that_dies_fails_requests_with_503_and_stops_rank_0(ring, tiny_model, tmp_path):
    """The ranks are started as mlx.launch starts them (MLX_RANK, MLX_HOSTFILE), without the
    launcher: it would itself terminate rank 0 as soon as rank 1 dies."""
    port = free_port()
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(json.dumps([[f"127.0.0.1:{free_port()}"], [f"127.0.0.1:{free_port()}"]]))
    command = serve_command(port, tiny_model, "--rank-timeout", "3")
    ranks = [
        subprocess.Popen(
            command,
            env=os.environ | {"MLX_RANK": str(rank), "MLX_HOSTFILE": str(hostfile)},
            stdout=(tmp_path / f"rank{rank}.log").open("wb"),
            stderr=subprocess.STDOUT,
        )
        for rank in (0, 1)
    ]
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url)
        body = {
            "prompt": "def f():\n",
            "max_tokens": 1500,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
        }
        chunks: list[str] = []
        with httpx.Client(base_url=url, timeout=60) as client:
            with client.stream("POST", "/v1/completions", json=body) as response:
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        chunks.append(line[6:])
                    if len(chunks) == 5:
                        ranks[1].kill()
        errors = [json.loads(c)["error"] for c in chunks if c.startswith('{"error"')]
        assert errors and errors[0]["type"] == "service_unavailable", chunks[-3:]
        assert "lost a rank" in errors[0]["message"]
        assert ranks[0].wait(30) != 0  # it stopped, and says it failed
    finally:
        for rank in ranks:
            if rank.poll() is None:
                rank.kill()
