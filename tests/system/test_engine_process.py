"""The engine in a process of its own (mlxserve/ipc/), as `mlxserve serve` runs it: every front
door through it, and the supervisor: a killed or aborting engine process ends what was in flight
with a 503 `engine_restarted` within 2 s, is restarted with its models, and the server answers
again; a crash loop backs off."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from ..helpers import complete
from ..live_server import FrontServer, free_port

STREAMS = 16
DEATH_TO_ERROR_S = 2.0  # the bound: from the engine's death to every stream's end
# pytest-timeout's bound for one kill, restart and reload: a slow VM's engine process takes
# half a minute to import MLX again (docs/benchmarks.md, "Slow machines").
KILL_AND_RESTART_S = 90
SOAK_KILLS = 20


@pytest.fixture(scope="module")
def front(tiny_model):
    with FrontServer(tiny_model, stable_s=0.0) as live:
        yield live


class ReadStream:
    """A streamed completion read on a thread of its own: its payloads, the time of its first
    and its last chunk."""

    def __init__(self, url: str, body: dict) -> None:
        self.chunks: list = []
        self.first = threading.Event()
        self.ended_at: float | None = None
        self.status: int | None = None
        self._leave = threading.Event()
        self._thread = threading.Thread(target=self._read, args=(url, body), daemon=True)
        self._thread.start()

    def _read(self, url: str, body: dict) -> None:
        with httpx.Client(base_url=url, timeout=60) as http:
            with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as reply:
                self.status = reply.status_code
                for line in reply.iter_lines():
                    if line.startswith("data: "):
                        payload = line[len("data: ") :]
                        self.chunks.append(payload if payload == "[DONE]" else json.loads(payload))
                        self.first.set()
                        if self._leave.is_set():
                            break
        self.ended_at = time.monotonic()
        self.first.set()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def leave(self) -> None:
        """The client disconnects at its next payload."""
        self._leave.set()
        self.join(30)

    @property
    def error(self) -> dict | None:
        last = [c for c in self.chunks if isinstance(c, dict)]
        return last[-1].get("error") if last else None


def start_streams(url: str, count: int = STREAMS) -> list[ReadStream]:
    body = {"prompt": "Once upon a time", "max_tokens": 1500, "ignore_eos": True}
    streams = [ReadStream(url, body) for _ in range(count)]
    for stream in streams:
        assert stream.first.wait(60), "a stream got no chunk"
    return streams


def assert_ended_with_restart(streams: list[ReadStream], died_at: float) -> None:
    for stream in streams:
        stream.join(DEATH_TO_ERROR_S + 5)
    ended = [s for s in streams if s.ended_at is not None]
    assert len(ended) == len(streams), f"{len(streams) - len(ended)} streams still run"
    late = [round(s.ended_at - died_at, 2) for s in streams if s.ended_at - died_at > 2.0]
    assert not late, f"streams ended later than {DEATH_TO_ERROR_S} s after the death: {late}"
    for stream in streams:
        assert stream.status == 200
        assert stream.error is not None, stream.chunks[-2:]
        assert stream.error["code"] == "engine_restarted", stream.error
        assert stream.error["type"] == "service_unavailable"


def test_every_door_through_the_engine_process(front):
    import anthropic
    import ollama
    import openai

    client = openai.OpenAI(base_url=front.url + "/v1", api_key="unused", max_retries=0)
    text = client.completions.create(
        model="tiny", prompt="Once upon", max_tokens=8, extra_body={"ignore_eos": True}
    )
    assert text.usage.completion_tokens == 8  # (sampled, it may end sooner without ignore_eos)
    pieces = list(
        client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=6,
            stream=True,
            logprobs=True,
            top_logprobs=2,
        )
    )
    assert pieces[-1].choices[0].finish_reason in ("length", "stop")
    assert any(p.choices and p.choices[0].logprobs for p in pieces)
    reply = ollama.Client(host=front.url).chat(
        model="tiny", messages=[{"role": "user", "content": "Hi"}], options={"num_predict": 5}
    )
    assert reply.done and 0 < reply.eval_count <= 5
    message = anthropic.Anthropic(base_url=front.url, api_key="unused").messages.create(
        model="tiny", max_tokens=5, messages=[{"role": "user", "content": "Hi"}]
    )
    assert 0 < message.usage.output_tokens <= 5
    with httpx.Client(base_url=front.url, timeout=60) as http:
        body = http.post("/completion", json={"prompt": "Once", "n_predict": 4}).json()
        assert body["tokens_predicted"] == 4
        tokens = http.post("/tokenize", json={"content": "Once upon"}).json()["tokens"]
        assert http.post("/detokenize", json={"tokens": tokens}).json()["content"] == "Once upon"
        schema = {
            "type": "object",
            "properties": {"a": {"type": "boolean"}},
            "required": ["a"],
            "additionalProperties": False,
        }
        constrained = http.post(
            "/completion", json={"prompt": "{", "n_predict": 40, "json_schema": schema}
        ).json()
        assert json.loads(constrained["content"])["a"] in (True, False)
        models = http.get("/v1/models").json()["data"]
        assert models[0]["id"] == front.pool.default_name
        status = http.get("/admin/status").json()
        assert status["state"] == "ready" and status["memory_bytes"] > 0
        metrics = http.get("/metrics").text
        assert "mlxserve_engine_restarts_total" in metrics
        assert 'mlxserve_generated_tokens_total{model="tiny"}' in metrics


def test_slots_show_a_stream_running_in_the_engine_process(front):
    before = cancelled_total(front.url)
    [stream] = start_streams(front.url, 1)
    slots = httpx.get(front.url + "/slots", timeout=30).json()
    stream.leave()
    busy = [s for s in slots if s["is_processing"]]
    assert len(busy) == 1 and busy[0]["params"]["n_predict"] == 1500
    wait_cancelled(front.url, before + 1)  # its client left: counted before the next test


def cancelled_total(url: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("mlxserve_cancelled_sequences_total{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no mlxserve_cancelled_sequences_total")


def test_a_client_that_leaves_cancels_its_sequence_in_the_engine_process(front):
    before = cancelled_total(front.url)
    body = {"prompt": "Once upon a time", "max_tokens": 1500, "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=front.url, timeout=60) as http:
        with http.stream("POST", "/v1/completions", json=body) as reply:
            lines = reply.iter_lines()
            assert next(lines).startswith("data: ")
    wait_cancelled(front.url, before + 1)


def wait_cancelled(url: str, total: float) -> None:
    deadline = time.monotonic() + 60
    while cancelled_total(url) < total and time.monotonic() < deadline:
        time.sleep(0.05)
    assert cancelled_total(url) == total


def generated(http: httpx.Client, prompt: str, max_tokens: int) -> int:
    """Tokens generated for a completion asked for exactly max_tokens (sampling the tiny random
    model can otherwise draw its EOS first)."""
    result = complete(http, prompt=prompt, max_tokens=max_tokens, ignore_eos=True)
    return result["usage"]["completion_tokens"]


def kill_during_streams(front: FrontServer) -> None:
    streams = start_streams(front.url)
    pid = front.supervisor.pid
    died_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    assert_ended_with_restart(streams, died_at)
    front.wait_healthy(120)
    assert front.supervisor.pid != pid
    with httpx.Client(base_url=front.url, timeout=60) as http:
        assert generated(http, "Once upon", 4) == 4


SOAK = (pytest.mark.soak, pytest.mark.timeout(SOAK_KILLS * KILL_AND_RESTART_S))


@pytest.mark.parametrize("runs", [1, pytest.param(SOAK_KILLS, marks=SOAK)])
def test_killed_engine_process_ends_streams_and_comes_back(front, runs):
    """kill -9 of the engine process during 16 streams: each ends with a 503 error event within
    2 s, the engine restarts and reloads the model, the server answers 200 again."""
    restarts = front.supervisor.restarts
    for _ in range(runs):
        kill_during_streams(front)
    assert front.supervisor.restarts == restarts + runs
    metrics = httpx.get(front.url + "/metrics", timeout=60).text
    assert f"mlxserve_engine_restarts_total {float(restarts + runs)}" in metrics


def test_request_during_a_restart_waits_for_it(front):
    """A request arriving while the engine process restarts waits, as during a first load."""
    os.kill(front.supervisor.pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    health = None
    while time.monotonic() < deadline:
        health = httpx.get(front.url + "/health", timeout=5)
        if health.status_code == 503:
            break
    assert health.status_code == 503 and health.json()["status"] == "restarting", health.text
    with httpx.Client(base_url=front.url, timeout=120) as http:
        assert generated(http, "Once upon", 3) == 3


def test_abort_inside_the_engine_step(tiny_model, tmp_path, monkeypatch):
    """SIGABRT inside the engine's step (as MLX's Metal backend aborts): the same as a kill."""
    trigger = tmp_path / "abort"
    monkeypatch.setenv("MLXSERVE_ABORT_FILE", str(trigger))
    command = (sys.executable, "-m", "tests.engine_faults")
    with FrontServer(tiny_model, engine_command=command, stable_s=0.0) as live:
        streams = start_streams(live.url, 4)
        trigger.touch()
        while trigger.exists():
            time.sleep(0.005)
        died_at = time.monotonic()
        assert_ended_with_restart(streams, died_at)
        live.wait_healthy(120)
        assert live.supervisor.restarts == 1
        with httpx.Client(base_url=live.url, timeout=60) as http:
            assert generated(http, "Once", 2) == 2


EXITS_AT_ONCE = (sys.executable, "-c", "import sys; sys.exit(3)")


def supervise_until(settings, command, done, wait_s: float) -> tuple[int, str | None]:
    """A supervisor of `command` (no front) run until `done(supervisor)` or `wait_s`: its
    restarts and the default model's error then."""
    from mlxserve.ipc.supervisor import EngineSupervisor

    async def run() -> tuple[int, str | None]:
        supervisor = EngineSupervisor(settings, command=command)
        pool = await supervisor.start()
        deadline = time.monotonic() + wait_s
        while not done(supervisor) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        restarts, error = supervisor.restarts, pool.default.error
        await supervisor.close()
        return restarts, error

    return asyncio.run(run())


def died(times: int):
    return lambda supervisor: f"died {times} times" in (supervisor.pool.default.error or "")


def test_a_crash_loop_backs_off_and_says_why(tiny_model):
    """An engine process that dies at once, again and again, is started again later each time,
    and the default model's error says so."""
    from mlxserve.settings import Settings

    # started again at once, then after 1 s; the third death waits 2 s. A generous bound:
    # each start is a Python process's start, seconds on a loaded VM.
    settings = Settings(model=str(tiny_model))
    restarts, error = supervise_until(settings, EXITS_AT_ONCE, died(3), 120)
    assert restarts == 2, (restarts, error)
    assert "died 3 times in a row (last: exit code 3); next start in 2 s" in error


def test_an_engine_process_gone_before_it_reads_its_settings_is_restarted(tiny_model):
    """The settings go to the engine process's stdin: one that dies before it reads them (here
    they outgrow the pipe's buffer, so the write meets a closed pipe every time) is a death
    like any other, restarted, not the end of the supervision (CI's loaded VM met it)."""
    from mlxserve.settings import Settings

    settings = Settings(model=str(tiny_model), api_key="k" * (1 << 20))
    restarts, _ = supervise_until(settings, EXITS_AT_ONCE, lambda s: s.restarts >= 2, 120)
    assert restarts >= 2


def test_an_engine_process_that_cannot_start_is_tried_again_and_says_why(tiny_model):
    """No process at all (out of memory or processes; here a command that is not there): a
    death like any other, tried again with the crash loop's back-off, the reason shown."""
    from mlxserve.settings import Settings

    command = ("/nonexistent/mlxserve-engine",)
    restarts, error = supervise_until(Settings(model=str(tiny_model)), command, died(2), 60)
    assert restarts == 1, (restarts, error)
    assert "(last: could not start: No such file or directory)" in error, error


def test_a_supervision_task_that_fails_says_so_in_the_log_at_once(caplog):
    from mlxserve.ipc.supervisor import supervised

    async def broken() -> None:
        raise RuntimeError("a message the supervision could not read")

    async def run_it() -> None:
        task = supervised(broken())
        await asyncio.sleep(0.05)
        assert task.done()

    asyncio.run(run_it())
    [record] = [r for r in caplog.records if r.name == "mlxserve.ipc"]
    assert record.levelname == "ERROR" and "supervisor's" in record.getMessage()
    assert "broken" in record.getMessage() and "could not read" in str(record.exc_info[1])


def running(pid: int) -> bool:
    """Whether process `pid` runs (not ended, nor a zombie left for init to reap)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc for the orphan's state")
def test_an_engine_process_whose_front_is_gone_before_it_starts_exits(tiny_model, tmp_path):
    """A front that ends right after it spawns the engine process, before the engine's imports
    are done: the engine process, whose parent is then init, exits instead of loading its
    model and serving no one."""
    pid_file = tmp_path / "engine.pid"
    script = (
        "import os, pathlib\n"
        "from mlxserve.ipc.supervisor import EngineSupervisor\n"
        "from mlxserve.settings import Settings\n"
        f"supervisor = EngineSupervisor(Settings(model={str(tiny_model)!r}))\n"
        "supervisor.spawn()\n"
        f"pathlib.Path({str(pid_file)!r}).write_text(str(supervisor.pid))\n"
        "os._exit(0)\n"
    )
    subprocess.run([sys.executable, "-c", script], stdout=subprocess.DEVNULL, timeout=60)
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 60
    try:
        while running(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not running(pid), "the engine process outlived its front"
    finally:
        if running(pid):
            os.kill(pid, signal.SIGKILL)


def test_the_front_never_imports_mlx(tiny_model):
    """The front process, serving every kind of request, never loads MLX."""
    script = Path(__file__).with_name("front_alone.py")
    done = subprocess.run(
        [sys.executable, str(script), str(tiny_model), str(free_port())],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["statuses"] == [200] * len(report["statuses"]), report
    assert report["mlx_modules"] == [], report


def test_an_embedding_model_answers_through_the_engine_process(tmp_path):
    """Vectors cross from the engine process as float32 bytes: the same as NumPy's BERT; a
    generation request to the embedding model is the front's 400, not the engine's failure."""
    import numpy as np

    from .. import numpy_bert
    from ..embedding_models import build_tiny_bert

    folder = build_tiny_bert(tmp_path / "tiny-bert")
    config = json.loads((folder / "config.json").read_text())
    weights = numpy_bert.load_weights(folder)
    with (
        FrontServer(folder, stable_s=0.0) as live,
        httpx.Client(base_url=live.url, timeout=60) as http,
    ):
        tokens = [[2, 60, 61, 3], [2, 70, 3]]
        answer = http.post("/v1/embeddings", json={"input": tokens, "encoding_format": "float"})
        assert answer.status_code == 200, answer.text
        for row, datum in zip(tokens, answer.json()["data"]):
            expected = numpy_bert.mean_pooled(weights, config, row, normalize=True)
            np.testing.assert_allclose(datum["embedding"], expected, atol=1e-4)
        refused = http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        assert refused.status_code == 400 and "embedding model" in refused.text
