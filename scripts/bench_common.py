"""What the bench scripts (bench.py, bench_engine.py, bench_distributed.py, soak.py) share:
the default model, a server subprocess in its own process group on a free port, waiting for its
/health, stopping it (whatever is left of it), reading its server-sent events, the decode rate
of one stream, and the two-column tables with medians and ratios.

A row whose server does not start, or fails under it, prints `row NAME: ...` and the bench goes
on with its next row (`row_failed`, `ROW_ERRORS`).
"""

from __future__ import annotations

import argparse
import atexit
import functools
import gc
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx

# The one place the bench scripts name the module of the CPU process settings mlxserve runs
# under (OpenBLAS preloaded, huge pages): they import these from here.
from mlxserve.platform import cpu_environment, openblas_library, reexec_for_cpu  # noqa: F401

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_MODEL = REPO_ROOT.parent / "shared" / "models" / "smollm2-135m-instruct-4bit"
HEALTH_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 15.0
LOG_TAIL_LINES = 15
MLX_LAUNCH = Path(sys.executable).with_name("mlx.launch")


def demo_model() -> str:
    """The embedded demo model, `mlxserve serve`'s own default."""
    from mlxserve.settings import DEFAULT_MODEL

    return str(DEFAULT_MODEL)


def bench_parser(description: str) -> argparse.ArgumentParser:
    """A bench script's command line: its description, defaults shown in --help, and `--model`
    (None: `default_model()`)."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--model", default=None, help="model folder (default: shared SmolLM2)")
    return parser


def default_model() -> str:
    """The shared SmolLM2 if present (a real >= 100M model), else the embedded demo model."""
    return str(SHARED_MODEL) if SHARED_MODEL.is_dir() else demo_model()


def mixed_batch_model(model: str | None):
    """(path, model, policy): `model` (None: `default_model()`) loaded and prepared as the server
    prepares it, for a bench that runs mixed batches' forward pass; None, with why printed,
    where they do not support its architecture."""
    from mlx_lm import load

    from mlxserve.engine.mlx_lm_compat.mixed_batch import supports
    from mlxserve.platform import current_policy

    path = model or default_model()
    loaded, _ = load(path)
    policy = current_policy()
    policy.prepare_model(loaded)
    if not supports(loaded):
        print("this model's architecture has no mixed batches", file=sys.stderr)
        return None
    return path, loaded, policy


def rewind(caches, depth: int) -> None:
    """Each of a decode batch's caches (`BatchKVCache`) back at `depth` tokens, every row: each
    timed pass then runs at the same depth, over what the last one wrote."""
    import mlx.core as mx

    for cache in caches:
        cache._idx, cache.offset = depth, mx.array([depth] * cache.offset.size)


def stretched_context(model: str, tokens: int) -> str:
    """`model` with its declared context raised to `tokens`, for timing prompts past what it was
    trained on (RoPE goes on; the answers mean nothing there, the time they take does): a
    temporary folder of links to its files and an edited config.json."""
    source = Path(model)
    config = json.loads((source / "config.json").read_text())
    if config.get("max_position_embeddings", 0) >= tokens:
        return model
    folder = Path(tempfile.mkdtemp(prefix="mlxserve-bench-context-")) / source.name
    folder.mkdir()
    for item in source.iterdir():
        if item.name != "config.json":
            (folder / item.name).symlink_to(item.resolve())
    config["max_position_embeddings"] = tokens
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return str(folder)


def free_port() -> int:
    """An unused local port, picked by the OS."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def log_file(tag: str, port: int) -> Path:
    return Path(tempfile.gettempdir()) / f"mlxserve-{tag}-{port}.log"


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as error:
        return f"(no log: {error})"
    tail = text.splitlines()[-lines:]
    return "\n".join(f"    {line}" for line in tail) if tail else "    (the log is empty)"


# -- server processes -------------------------------------------------------------------------


class ServerDidNotStart(RuntimeError):
    """The server exited, could not be run, or never answered /health 200; says why, with the
    last lines of its log."""


class ServerFailed(RuntimeError):
    """A running server answered badly: an HTTP error status, an error inside a stream, or a
    stream cut short."""


ROW_ERRORS = (ServerDidNotStart, ServerFailed, httpx.HTTPError)


@contextmanager
def no_client_gc() -> Iterator[None]:
    """This process's garbage collector off (what it holds frozen first) while a server's
    inter-token gaps are timed: a full collection here pauses every thread of this client for
    tens of ms, and a chunk read late looks like a gap the server made."""
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.unfreeze()


def spawn(
    command: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None
) -> subprocess.Popen:
    """Run `command` from the repository root in a session (and process group) of its own, so
    `stop_server` ends it and everything it started (mlx.launch's ranks) and the terminal's
    Ctrl-C reaches only the bench. Its output goes to `log_path`, so a full pipe cannot stall it;
    its stdin is /dev/null (mlx.launch would otherwise set the terminal's stdin non-blocking)."""
    with open(log_path, "wb") as log:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            list(command),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO_ROOT,
            env=None if env is None else dict(env),
            start_new_session=True,
        )


def mlxserve_command(
    model: str,
    port: int,
    distributed: bool = False,
    extra: Sequence[str] = (),
    module: str = "mlxserve",
) -> list[str]:
    """`python -m mlxserve serve` on 127.0.0.1:`port` with `extra` flags; `distributed`: as 2
    local ranks under mlx.launch (ring backend over loopback). `module`: another entry point
    to `mlxserve serve` (tests.faults: with the tests' faults on purpose)."""
    command = [sys.executable, "-m", module, "serve", "--model", model, *extra]
    command += ["--host", "127.0.0.1", "--port", str(port)]
    if "--log-level" not in extra:  # quiet unless the caller asks for a step log
        command += ["--log-level", "warning"]
    if "--prefix-cache-dir" not in extra:  # as by default, but not in the user's cache folder
        command += ["--prefix-cache-dir", bench_prefix_cache_dir()]
    if not distributed:
        return command
    launch = [str(MLX_LAUNCH), "--backend", "ring", "-n", "2", "--hosts", "127.0.0.1", "--"]
    return [*launch, *command, "--distributed"]


@functools.cache
def bench_prefix_cache_dir() -> str:
    """A folder for the servers' prefix caches on disk, removed when the bench exits: the
    bench's unique prompts would fill the user's own."""
    folder = tempfile.mkdtemp(prefix="mlxserve-bench-prefix-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def start_server(
    model: str,
    port: int,
    log_path: Path,
    distributed: bool = False,
    extra: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    module: str = "mlxserve",
) -> subprocess.Popen:
    """mlxserve serving `model` on `port` (see `mlxserve_command`), logging to `log_path`;
    `env`: its environment (default: this process's)."""
    command = mlxserve_command(model, port, distributed, extra, module)
    return spawn(command, log_path, env)


def start_mlx_lm_server(model: str, port: int, log_path: Path) -> subprocess.Popen:
    """mlx_lm.server as its users run it, under the process settings mlxserve runs under
    (`cpu_environment`: OpenBLAS, huge pages)."""
    command = [sys.executable, "-m", "mlx_lm.server", "--model", model]
    command += ["--host", "127.0.0.1", "--port", str(port)]
    return spawn(command, log_path, cpu_environment(os.environ))


def wait_healthy(
    server: subprocess.Popen,
    base_url: str,
    log_path: Path,
    timeout: float = HEALTH_TIMEOUT_S,
    poll_s: float = 0.25,
) -> None:
    """Poll /health every `poll_s` until 200 (it answers 503 while the model loads); raise
    ServerDidNotStart when the process exits first or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        if server.poll() is not None:
            reason = f"exited with code {server.returncode}"
            break
        try:
            if httpx.get(f"{base_url}/health", timeout=2.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            reason = f"no /health 200 within {timeout:.0f} s"
            break
        time.sleep(poll_s)
    raise ServerDidNotStart(f"{reason}; last lines of {log_path}:\n{log_tail(log_path)}")


def _signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` to a process group; False when the group is gone (or, on macOS, holds only
    processes that already exited)."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def stop_server(server: subprocess.Popen, timeout: float = STOP_TIMEOUT_S) -> None:
    """End a `spawn`ed server and its process group: SIGTERM to the group, `timeout` seconds for
    the process and up to 5 more for the rest of its group (mlx.launch's ranks), then SIGKILL to
    whatever is left. Quiet when the process has already exited or its group is gone (a server
    that died on its own, or a launcher that took its ranks with it)."""
    pgid = server.pid  # a session leader: its process group's id is its own pid
    _signal_group(pgid, signal.SIGTERM)
    try:
        server.wait(timeout)
    except subprocess.TimeoutExpired:
        pass
    else:
        deadline = time.monotonic() + 5.0
        while _signal_group(pgid, 0) and time.monotonic() < deadline:
            time.sleep(0.1)
    _signal_group(pgid, signal.SIGKILL)
    try:
        server.wait(timeout)
    except subprocess.TimeoutExpired:
        print(f"server {server.pid} still running after SIGKILL", file=sys.stderr)


@dataclass
class Server:
    process: subprocess.Popen
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextmanager
def served(
    start: Callable[[int, Path], subprocess.Popen],
    tag: str,
    health_timeout: float = HEALTH_TIMEOUT_S,
) -> Iterator[Server]:
    """`start(port, log_path)` on a free port, waited for until healthy, stopped on the way out.
    Raises ServerDidNotStart (it is stopped by then) when it does not come up."""
    port = free_port()
    log_path = log_file(tag, port)
    try:
        process = start(port, log_path)
    except OSError as error:
        raise ServerDidNotStart(f"could not run it: {error}") from error
    try:
        wait_healthy(process, f"http://127.0.0.1:{port}", log_path, health_timeout)
        yield Server(process, port, log_path)
    finally:
        stop_server(process)


def warm_and_cold(
    name: str, tag: str, model: str, repeats: int, run: Callable[[str, str, int], Any]
) -> list[Any] | None:
    """`run(warm_url, cold_url, number)` for numbers 1..`repeats` on two servers of `model` side
    by side: one as users run it, one with the prefix cache off (`--prefix-cache-mb 0`), which
    sees every prompt cold. None, the row's failure printed, when a server fails."""
    cold_start = partial(start_server, model, extra=["--prefix-cache-mb", "0"])
    try:
        with (
            served(partial(start_server, model), f"{tag}-warm") as warm,
            served(cold_start, f"{tag}-cold") as cold,
        ):
            runs = []
            for number in range(1, repeats + 1):
                runs.append(run(warm.url, cold.url, number))
                print(f"{name}: {number} of {repeats} done", file=sys.stderr)
            return runs
    except ROW_ERRORS as error:
        row_failed(name, error)
        return None


def row_failed(name: str, error: BaseException) -> None:
    """The line a row prints instead of its numbers; the bench goes on with the next row."""
    if isinstance(error, ServerDidNotStart):
        print(f"row {name}: server did not start: {error}", flush=True)
    else:
        print(f"row {name}: failed: {type(error).__name__}: {error}", flush=True)


# -- server-sent events -----------------------------------------------------------------------

SSE_DONE = "data: [DONE]"


def sse_chunk(line: str) -> dict[str, Any] | None:
    """The JSON object of one server-sent `data: ` line; None for other lines and [DONE]."""
    if not line.startswith("data: ") or line == SSE_DONE:
        return None
    return json.loads(line[len("data: ") :])


def sse_chunks(response: httpx.Response, where: str) -> Iterator[dict[str, Any]]:
    """The JSON chunks of a streamed response. Raises ServerFailed on an HTTP error status or
    an error inside the stream, naming `where`."""
    if response.status_code != 200:
        response.read()
        raise ServerFailed(f"{where}: HTTP {response.status_code}: {response.text}")
    for line in response.iter_lines():
        chunk = sse_chunk(line)
        if chunk is None:
            continue
        if "error" in chunk:
            raise ServerFailed(f"{where}: stream error: {chunk['error']}")
        yield chunk


def has_text(chunk: dict[str, Any]) -> bool:
    return any(choice.get("text") for choice in chunk.get("choices") or [])


@dataclass
class Streamed:
    """One streamed completion: when it was sent, when each chunk with text came, the usage
    chunk's completion_tokens, and whether `data: [DONE]` ended it."""

    sent: float
    stamps: list[float] = field(default_factory=list)
    usage_tokens: int | None = None
    done: bool = False

    @property
    def ttft(self) -> float:
        return self.stamps[0] - self.sent

    @property
    def tokens(self) -> int:
        """The usage chunk's count, else the text chunks."""
        return self.usage_tokens or len(self.stamps)


def stream_completion(
    client: httpx.Client,
    base_url: str,
    body: dict[str, Any],
    on_token: Callable[[int], bool] | None = None,
) -> Streamed:
    """POST a streaming /v1/completions and time its text chunks; `on_token(count)` may return
    True to stop reading (the client leaves). Raises ServerFailed on an HTTP error status or an
    error inside the stream."""
    result = Streamed(time.perf_counter())
    with client.stream("POST", f"{base_url}/v1/completions", json=body) as response:
        if response.status_code != 200:
            response.read()
            raise ServerFailed(f"{base_url}: HTTP {response.status_code}: {response.text}")
        for line in response.iter_lines():
            if line == SSE_DONE:
                result.done = True
                break
            chunk = sse_chunk(line)
            if chunk is None:
                continue
            if "error" in chunk:
                raise ServerFailed(f"{base_url}: stream error: {chunk['error']}")
            if chunk.get("usage"):
                result.usage_tokens = chunk["usage"]["completion_tokens"]
            if has_text(chunk):
                result.stamps.append(time.perf_counter())
                if on_token is not None and on_token(len(result.stamps)):
                    break
    return result


def http_decode_rate(
    client: httpx.Client, base_url: str, prompt: str, max_tokens: int, sampling: dict | None = None
) -> tuple[float, int]:
    """Decode tokens/s seen by a streaming client, greedy with EOS ignored unless `sampling`
    says otherwise: (usage's tokens - 1) over first text chunk to last, and usage's tokens."""
    body = {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
        **(sampling or {}),
    }
    result = stream_completion(client, base_url, body)
    if not result.done:
        raise ServerFailed("stream ended without data: [DONE]")
    if len(result.stamps) < 2 or result.stamps[-1] <= result.stamps[0]:
        raise ServerFailed("stream carried fewer than two text chunks")
    if result.usage_tokens is None:
        raise ServerFailed("no usage chunk despite stream_options.include_usage")
    tokens = result.usage_tokens
    return (tokens - 1) / (result.stamps[-1] - result.stamps[0]), tokens


# -- tables -----------------------------------------------------------------------------------


def call_times_ms(run: Callable[[], None], repeats: int) -> list[float]:
    """`run()`'s wall times in ms, sorted: `repeats` calls after an unmeasured one (warm-up)."""
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append((time.perf_counter() - start) * 1000)
    return sorted(times)


def print_table(rows: list[tuple[str, str]]) -> None:
    """Two aligned columns: label and value."""
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        print(f"{label:<{width}}  {value}")


def runs_text(rates: list[float]) -> str:
    return ", ".join(f"{r:.2f}" for r in rates)


def median_cell(rates: list[float]) -> str:
    """`12.34  runs: 12.00, 12.34, 13.10`"""
    return f"{statistics.median(rates):.2f}  runs: {runs_text(rates)}"


def ratio_cell(rates: list[float], baseline: list[float], target: str) -> str:
    """The ratio of two medians: `0.987  (target >= 0.95)`"""
    return f"{statistics.median(rates) / statistics.median(baseline):.3f}  (target {target})"
