"""One model over 2 local ranks (mlx.launch, ring backend on 127.0.0.1): the same answers as the
single-process server, tensor parallel and pipeline parallel; a model that splits neither way is
refused at start; a rank that dies fails requests with 503 and stops rank 0.

The ranks start as mlx.launch starts them (MLX_RANK, MLX_HOSTFILE) but without it (one process
fewer), except in the one test that shows mlx.launch itself works. mlx.launch is given an open
pipe for its stdin: at end of file (pytest's) its loop that forwards stdin to the ranks spins,
1.4 cores while the ranks idle (4.2 CPU-s in 3 s, measured; 0.0 with the pipe)."""

from __future__ import annotations

import contextlib
import json
import os
import re
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

from mlxserve.engine.stats import RATE_WINDOW_S
from mlxserve.settings import SpeculationSettings
from mlxserve.tiny_families import build_tiny_family
from mlxserve.tiny_model import build_tiny_model

from ..helpers import skip_for_missing, wait_healthy
from ..live_server import free_port

# Starting ranks is a minute of the two cores: a tier of its own (make test-ranks), after make test.
pytestmark = pytest.mark.ranks

LAUNCH = Path(sys.executable).with_name("mlx.launch")
# Each rank writes a file of its own: both ranks print to one log at once, and their lines
# interleave ("okok 0"), so counting words in it misreads a ring that works.
PROBE = (
    "import sys, pathlib, mlx.core as mx; g = mx.distributed.init(strict=True); "
    "mx.eval(mx.distributed.all_sum(mx.ones(64), group=g)); "
    "pathlib.Path(sys.argv[1], f'rank{g.rank()}').write_text('ok')"
)


def launch(command: list[str], log: Path, port_base: int, ranks: int = 2) -> subprocess.Popen:
    return subprocess.Popen(
        [
            str(LAUNCH),
            "--backend",
            "ring",
            "-n",
            str(ranks),
            "--hosts",
            "127.0.0.1",
            "--starting-port",
            str(port_base),
            "--",
            *command,
        ],
        stdin=subprocess.PIPE,  # never written: see the module's docstring
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


@pytest.fixture(scope="module")
def ring(tmp_path_factory):
    """Skips, saying why, where two ring ranks cannot start here (fails under .ci/run)."""
    if not LAUNCH.exists() or shutil.which("bash") is None:
        skip_for_missing("mlx.launch is not installed with mlx")
    folder = tmp_path_factory.mktemp("ring")
    done = run_on_ranks(PROBE, folder, ranks=2, timeout=60)
    if done is None:
        cannot_run("the ring backend did not start 2 ranks on 127.0.0.1 within 60 s")
    if sorted(done) != ["rank0", "rank1"]:
        log = (folder / "probe.log").read_text()[-300:]
        cannot_run(f"the ring backend cannot run here (ranks done: {sorted(done)}): {log}")


def run_on_ranks(code: str, folder: Path, ranks: int, timeout: float) -> dict[str, str] | None:
    """`python -c code folder` on `ranks` ring ranks under mlx.launch, its output in
    `folder`/probe.log: each file the ranks wrote in `folder` as rank{N}, by name; None when
    they did not end within `timeout` seconds (then killed)."""
    command = [sys.executable, "-c", code, str(folder)]
    probe = launch(command, folder / "probe.log", free_port(), ranks)
    try:
        probe.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(probe.pid, signal.SIGKILL)
        return None
    return {path.name: path.read_text() for path in folder.glob("rank*")}


def cannot_run(reason: str) -> None:
    """Two ranks on 127.0.0.1 need nothing CI lacks: under .ci/run a ring that does not come up
    is a failure, not a skip; elsewhere (a sandbox without loopback sockets) a skip."""
    if os.environ.get("MLXSERVE_CI") == "1":
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


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
    pipeline for it), a Llama of 5 layers (it has none: mlxserve's pipeline), and a Llama of
    one layer (too few for 2 ranks)."""
    folder = tmp_path_factory.mktemp("three-heads")
    qwen2 = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]}
    return {
        "qwen2": build_tiny_model(folder / "qwen2", 0, False, THREE_HEADS | qwen2),
        "llama": build_tiny_model(
            folder / "llama", 0, False, THREE_HEADS | {"num_hidden_layers": 5}
        ),
        "one layer": build_tiny_model(
            folder / "one-layer", 0, False, THREE_HEADS | {"num_hidden_layers": 1}
        ),
    }


@pytest.fixture(scope="module")
def cluster(ring, tiny_model, tmp_path_factory):
    """Two ranks serving the tiny model, started once for this module's tests on it: each start
    is three processes loading MLX. (url, [rank 0, rank 1])."""
    # A tensor split, as asked (auto would time a tiny model's collectives as not paying)
    folder = tmp_path_factory.mktemp("cluster")
    with ranks_by_hand(tiny_model, folder, "--parallel", "tensor") as running:
        yield running


@contextmanager
def launched_cluster(model: Path, tmp_path: Path):
    """Two ranks serving `model` under mlx.launch: (url, the launcher's process, its log);
    stopped after."""
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


FAILED = "FAILED: "  # in place of a body's texts when it got no answer


ANSWER_WAIT_S = 600  # 4 bodies at once on a real model over ranks on a slow VM's 2 cores


def answers(url: str, stream: bool) -> list[list[str]]:
    """The 4 bodies at once; each answer's choices' texts."""
    results: list[list[str]] = [[] for _ in BODIES]

    def one(i: int) -> None:
        body = BODIES[i] | {"stream": stream}
        with httpx.Client(base_url=url, timeout=ANSWER_WAIT_S) as client:
            response = client.post("/v1/completions", json=body)
            if response.status_code != 200 or '"error"' in response.text:
                results[i] = [f"{FAILED}HTTP {response.status_code}: {response.text[-500:]}"]
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
            results[i] = [f"{FAILED}{type(e).__name__}: {e}"]

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(len(BODIES))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return results


def assert_answered(results: list[list[str]]) -> None:
    """Every body answered with text: no HTTP error, no exception (`answers` writes those in
    place of the texts, and two servers failing alike would compare equal)."""
    failed = [t for texts in results for t in texts if t.startswith(FAILED)]
    assert all(all(texts) for texts in results) and not failed, failed


def test_two_ranks_answer_as_one_process(cluster, server):
    """Greedy, seeded, n, a JSON schema, echo with logprobs, streamed (the pipeline's test below
    asks for whole answers: which one is rank 0's front alone); then a stream the client drops."""
    url, _ = cluster
    single = answers(server.url, stream=True)
    assert_answered(single)
    assert answers(url, stream=True) == single
    body = {"prompt": "a", "max_tokens": 1000, "stream": True, "ignore_eos": True}
    with httpx.Client(base_url=url, timeout=60) as client:
        with client.stream("POST", "/v1/completions", json=body) as response:
            for n, _ in enumerate(response.iter_lines()):
                if n > 6:
                    break
        deadline = time.monotonic() + 60
        cancelled = re.compile(r"^mlxserve_cancelled_sequences_total{.*} 1", re.MULTILINE)
        while not cancelled.search(client.get("/metrics").text):
            assert time.monotonic() < deadline, "the dropped stream was not cancelled"
            time.sleep(0.1)
        assert answers(url, False)[0] == answers(server.url, False)[0]
        # one model over the ranks: a second one would load on rank 0 alone
        refused = client.post("/admin/load", json={"model": "mlxserve-demo-coder"})
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["code"] == "switch_not_possible"
        assert answers(url, False)[0] == answers(server.url, False)[0]


@pytest.mark.parametrize(
    ("model", "whose", "extra", "ranks"),
    [
        ("qwen2", "mlx-lm's", (), 2),
        ("llama", "mlxserve's", ("--layer-split", "1,4"), 2),  # rank 0 the last layer only
        ("llama", "mlxserve's", (), 3),
    ],
    ids=["qwen2-mlx-lm", "llama-split-1-4", "llama-3-ranks"],
)
def test_heads_that_do_not_split_run_as_a_pipeline_and_answer_as_one_process(
    ring, three_heads, live_servers, tmp_path, model, whose, extra, ranks
):
    """Greedy, seeded, n=2, a JSON schema, echo with logprobs, a prompt prefilled in chunks,
    streamed and whole: a pipeline of layers answers as one process does."""
    with ranks_by_hand(three_heads[model], tmp_path, *extra, count=ranks) as (url, _):
        log = (tmp_path / "rank0.log").read_text()
        assert f"pipeline parallel over {ranks} ranks ({whose};" in log
        if extra:
            assert "rank 0: layers 4-4; rank 1: layers 0-3" in log
        # drafting off, as the ranks run: this random model's answers run into near-ties, where
        # a verify pass's logits may round the other way (a run of .ci/run at 4765054)
        off = SpeculationSettings(draft_tokens=0)
        with live_servers.own(three_heads[model], speculation=off) as single:
            for stream in (False, True):
                alone = answers(single.url, stream=stream)
                assert_answered(alone)
                assert answers(url, stream=stream) == alone


# the families a split applies to (mlx-lm's tensor or pipeline parallelism for their classes);
# the others are refused at start (the test below)
SPLIT_FAMILIES = ["qwen3_5", "deepseek_v3", "qwen3_moe", "qwen3_next", "glm4_moe", "ministral3"]


@pytest.mark.parametrize("family", SPLIT_FAMILIES)
def test_each_kind_of_cache_over_two_ranks_answers_as_one_process(
    ring, live_servers, tmp_path, family
):
    """The family matrix's families where a split applies (hybrids of linear attention, MLA,
    MoE, a sliding window) over 2 ranks, split as `--parallel auto` decides: the same answers as
    one process. (gemma3_text splits neither way: refused at start, as the test below shows of
    another model.)"""
    model = build_tiny_family(family, tmp_path / "model")
    with ranks_by_hand(model, tmp_path) as (url, _):
        off = SpeculationSettings(draft_tokens=0)  # as the ranks run
        with live_servers.own(model, speculation=off) as single:
            for stream in (False, True):
                alone = answers(single.url, stream=stream)
                assert_answered(alone)
                assert answers(url, stream=stream) == alone


def test_a_model_that_splits_neither_way_is_refused_at_start(ring, three_heads, tmp_path):
    with ranks_by_hand(three_heads["one layer"], tmp_path, ready=False) as (_, ranks):
        assert [rank.wait(60) for rank in ranks] == [1, 1]
    assert (
        "its 3 attention heads (3 key/value heads) do not split evenly over 2 ranks (3 ranks "
        "would), and its 1 layers are too few for a pipeline of 2 ranks (at most 1 ranks would)"
    ) in (tmp_path / "rank0.log").read_text()


LONG_STREAM = {
    "prompt": "def f():\n",
    "max_tokens": 1500,
    "temperature": 0,
    "ignore_eos": True,
    "stream": True,
}


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def children(pid: int) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    return [int(child) for child in found.stdout.split()]


def engine_process(rank_0: int) -> int:
    """Rank 0's engine process: the one child of its HTTP front."""
    found = children(rank_0)
    assert len(found) == 1, f"rank 0 ({rank_0}) has children {found}, not one engine process"
    return found[0]


def rank_pids(launcher: subprocess.Popen) -> dict[int, int]:
    """The ranks mlx.launch started, by rank."""
    ranks = {}
    for pid in children(launcher.pid):
        with open(f"/proc/{pid}/environ", "rb") as environ:
            for entry in environ.read().split(b"\0"):
                if entry.startswith(b"MLX_RANK="):
                    ranks[int(entry[9:])] = int(pid)
    return ranks


def stream_until_killed(url: str, pid: int) -> list[dict]:
    """A long stream; `pid` is killed after its 5th chunk. The chunks' errors, in order."""
    chunks: list[str] = []
    with httpx.Client(base_url=url, timeout=60) as client:
        with client.stream("POST", "/v1/completions", json=LONG_STREAM) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    chunks.append(line[6:])
                    if len(chunks) == 5:  # once: the pid may be reaped and reused after
                        os.kill(pid, signal.SIGKILL)
    return [json.loads(c)["error"] for c in chunks if c.startswith('{"error"')]


def wait_gone(pids, seconds: float) -> list[int]:
    """The pids still running after up to `seconds`."""
    deadline = time.monotonic() + seconds
    while (left := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


IDLE_AFTER_WORK_S = RATE_WINDOW_S + 1  # the engine's tokens per second back at 0: at rest
IDLE_WAKEUPS_PER_S = 5  # at most, for an idle process (each costs energy on a laptop)
# Long enough that a timer's wakes count, not one burst: a run of .ci/run counted 18 of rank 0's
# in 3 s, which 4 runs after it did not repeat (the one that printed them: none)
IDLE_WINDOW_S = 10
IDLE_RUNNING_SHARE = 0.25  # of samples with a thread running: spinning is most of them


def test_idle_ranks_use_no_cpu(cluster):
    """Idle ranks and rank 0's engine process neither spin (a collective busy-waiting) nor wake
    often. Counted, not timed: a slow VM charges a process milliseconds of CPU for each wake-up
    (docs/benchmarks.md, "Slow machines"), so CPU seconds do not tell a spin from a wake-up."""
    url, ranks = cluster
    httpx.post(f"{url}/v1/completions", json={"prompt": "a", "max_tokens": 4}, timeout=60)
    processes = {f"rank {rank}": process.pid for rank, process in enumerate(ranks)}
    processes["rank 0's engine"] = engine_process(processes["rank 0"])
    time.sleep(IDLE_AFTER_WORK_S)  # its tokens-per-second gone to 0: at rest
    before = {name: wakeups(pid) for name, pid in processes.items()}
    started = time.monotonic()
    share = running_share(processes.values(), seconds=IDLE_WINDOW_S)
    elapsed = time.monotonic() - started
    woken = {}  # each process's threads that woke, and how often
    for name, pid in processes.items():
        counts = ((thread, n - before[name].get(thread, 0)) for thread, n in wakeups(pid).items())
        woken[name] = {thread: n for thread, n in counts if n}
    rates = {name: sum(threads.values()) / elapsed for name, threads in woken.items()}
    assert all(rate <= IDLE_WAKEUPS_PER_S for rate in rates.values()), (rates, woken)
    running = dict(zip(processes, share))
    assert all(each < IDLE_RUNNING_SHARE for each in running.values()), running


def wakeups(pid: int) -> dict[str, int]:
    """How often each of `pid`'s threads (by id and name) gave up the CPU to wait (its voluntary
    context switches)."""
    counts = {}
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        try:
            lines = status.read_text().splitlines()
        except FileNotFoundError:  # a thread that ended
            continue
        fields = dict(line.split(":", 1) for line in lines if ":" in line)
        thread = f"{status.parent.name} {fields['Name'].strip()}"
        counts[thread] = int(fields["voluntary_ctxt_switches"])
    return counts


def running_share(pids, seconds: float) -> list[float]:
    """For each pid, the share of samples (every 10 ms for `seconds`) in which one of its
    threads was running or waiting for a core."""
    pids = list(pids)
    counts, samples = [0] * len(pids), 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for i, pid in enumerate(pids):
            states = []
            for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
                try:
                    states.append(stat.read_text().rsplit(")", 1)[1].split()[0])
                except FileNotFoundError:
                    continue
            counts[i] += "R" in states
        samples += 1
        time.sleep(0.01)
    return [count / samples for count in counts]


def test_under_mlx_launch_it_answers_and_a_killed_rank_fails_the_stream_and_every_rank_ends(
    ring, tiny_model, server, tmp_path
):
    with launched_cluster(tiny_model, tmp_path) as (url, launcher, log):
        body = BODIES[0] | {"stream": False}
        ours = httpx.post(f"{url}/v1/completions", json=body, timeout=120).json()
        alone = httpx.post(f"{server.url}/v1/completions", json=body, timeout=120).json()
        assert ours["choices"][0]["text"] == alone["choices"][0]["text"]
        ranks = rank_pids(launcher)
        errors = stream_until_killed(url, ranks[1])
        assert errors and errors[0]["type"] == "service_unavailable", errors
        assert "lost a rank" in errors[0]["message"]
        assert not wait_gone(ranks.values(), 15)
        launcher.wait(15)
        assert "rank 0 exited with code 1" in log.read_text()


@contextmanager
def ranks_by_hand(model: Path, tmp_path: Path, *extra: str, ready: bool = True, count: int = 2):
    """`count` ranks started as mlx.launch starts them (MLX_RANK, MLX_HOSTFILE), without the
    launcher (which would also stop the others when one dies): (url, [rank 0, rank 1, ...]),
    once it answers if `ready`; each rank's output in `tmp_path`/rank{N}.log."""
    port = free_port()
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(json.dumps([[f"127.0.0.1:{free_port()}"] for _ in range(count)]))
    command = serve_command(port, model, *extra)
    ranks = [
        subprocess.Popen(
            command,
            env=os.environ | {"MLX_RANK": str(rank), "MLX_HOSTFILE": str(hostfile)},
            stdout=(tmp_path / f"rank{rank}.log").open("wb"),
            stderr=subprocess.STDOUT,
        )
        for rank in range(count)
    ]
    try:
        url = f"http://127.0.0.1:{port}"
        if ready:
            try:
                wait_healthy(url)
            except AssertionError:
                log = (tmp_path / "rank0.log").read_text()[-2000:]
                pytest.fail(f"the distributed server never got ready: {log}")
        yield url, ranks
    finally:
        for rank in ranks:
            if rank.poll() is None:
                rank.kill()


def test_a_rank_that_dies_fails_requests_with_503_and_stops_rank_0(ring, tiny_model, tmp_path):
    with ranks_by_hand(tiny_model, tmp_path, "--rank-timeout", "3", "--parallel", "tensor") as (
        url,
        ranks,
    ):
        errors = stream_until_killed(url, ranks[1].pid)
        assert errors and errors[0]["type"] == "service_unavailable", errors
        assert "lost a rank" in errors[0]["message"]
        assert ranks[0].wait(30) != 0  # it stopped, and says it failed


@pytest.mark.parametrize("when", ["idle", "its engine process mid-stream"])
def test_without_rank_0_the_other_rank_exits(ring, tiny_model, tmp_path, when):
    """Rank 0 killed (its engine process goes with it), or only its engine process: that
    one's place in the ranks' lock-step cannot be taken, so the stream ends with a 503 and
    rank 0's front stops too."""
    with ranks_by_hand(tiny_model, tmp_path, "--rank-timeout", "3", "--parallel", "tensor") as (
        url,
        ranks,
    ):
        if when == "idle":
            ranks[0].kill()
        else:
            errors = stream_until_killed(url, engine_process(ranks[0].pid))
            assert errors and errors[0]["type"] == "service_unavailable", errors
            assert "engine process died (SIGKILL)" in errors[0]["message"]
            assert ranks[0].wait(15) == 1
        assert ranks[1].wait(15) == 1
    assert "rank 1 stops" in (tmp_path / "rank1.log").read_text()
