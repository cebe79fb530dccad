"""What the benchmarks share (and scripts/soak.py): the default model, a server subprocess in
its own process group on a free port, waiting for its /health, stopping it (whatever is left of
it), reading its server-sent events, a streamed completion timed chunk by chunk, a long prompt
of an exact token count, a long prompt sent beside a running stream, and the two-column table
every benchmark prints.

A row whose server does not start, or fails under it, prints `row NAME: ...` and the benchmark
goes on with its next row (`row_failed`, `ROW_ERRORS`). The entry points import this module,
never each other.
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
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

# The one place the benchmarks name the module of the CPU process settings mlxserve runs under
# (OpenBLAS preloaded, huge pages): they import these from here.
from mlxserve.platform import cpu_environment, openblas_library, reexec_for_cpu  # noqa: F401

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_MODEL = REPO_ROOT.parent / "shared" / "models" / "smollm2-135m-instruct-4bit"
HEALTH_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 15.0
LOG_TAIL_LINES = 15


def demo_model() -> str:
    """The embedded demo model, `mlxserve serve`'s own default."""
    from mlxserve.settings import DEFAULT_MODEL

    return str(DEFAULT_MODEL)


def bench_parser(
    description: str,
    model_help: str = "model folder (default: the shared SmolLM2 if present, else the demo model)",
) -> argparse.ArgumentParser:
    """A benchmark's command line: `description` (what it compares against what), defaults
    shown in --help, and `--model` (None: the benchmark's default, `default_model()` unless
    `model_help` says otherwise)."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--model", default=None, help=model_help)
    return parser


def add_engine_flag(parser: argparse.ArgumentParser) -> None:
    """`--engine-in-process`: the server measured with its engine in its own process (as
    `mlxserve serve --engine-in-process` runs), not in a process of its own (the default)."""
    parser.add_argument(
        "--engine-in-process",
        action="store_true",
        help="serve with the engine inside the HTTP server's process (one process), not in a "
        "supervised process of its own",
    )


def engine_flags(args: argparse.Namespace) -> list[str]:
    return ["--engine-in-process"] if getattr(args, "engine_in_process", False) else []


def default_model() -> str:
    """The shared SmolLM2 if present (a real >= 100M model), else the embedded demo model."""
    return str(SHARED_MODEL) if SHARED_MODEL.is_dir() else demo_model()


def add_family_flag(parser: argparse.ArgumentParser) -> None:
    """`--family NAME`: a tiny random model of an mlx-lm architecture in place of --model."""
    parser.add_argument(
        "--family",
        default=None,
        help="a tiny random model of this mlx-lm architecture (mlxserve/tiny_families.py: "
        "qwen3_5, gemma3_text, gpt_oss, ...) in place of --model",
    )


def chosen_model(args: argparse.Namespace) -> str:
    """--family's tiny model (built once into the user cache), else --model, else the
    default."""
    family = getattr(args, "family", None)
    if not family:
        return args.model or default_model()
    import platformdirs

    from mlxserve.tiny_families import build_tiny_family

    folder = Path(platformdirs.user_cache_dir("mlxserve")) / "models" / "families" / family
    return str(build_tiny_family(family, folder))


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
    `stop_server` ends it and everything it started (`make serve`'s server) and the terminal's
    Ctrl-C reaches only the benchmark. Its output goes to `log_path`, so a full pipe cannot stall
    it; its stdin is /dev/null."""
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
    model: str, port: int, extra: Sequence[str] = (), module: str = "mlxserve"
) -> list[str]:
    """`python -m mlxserve serve` on 127.0.0.1:`port` with `extra` flags. `module`: another
    entry point to `mlxserve serve` (tests.faults: with the tests' faults on purpose)."""
    command = [sys.executable, "-m", module, "serve", "--model", model, *extra]
    command += ["--host", "127.0.0.1", "--port", str(port)]
    if "--log-level" not in extra:  # quiet unless the caller asks for a step log
        command += ["--log-level", "warning"]
    if "--prefix-cache-dir" not in extra:  # as by default, but not in the user's cache folder
        command += ["--prefix-cache-dir", bench_prefix_cache_dir()]
    return command


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
    extra: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    module: str = "mlxserve",
) -> subprocess.Popen:
    """mlxserve serving `model` on `port` (see `mlxserve_command`), logging to `log_path`;
    `env`: its environment (default: this process's)."""
    return spawn(mlxserve_command(model, port, extra, module), log_path, env)


def start_mlx_lm_server(
    model: str, port: int, log_path: Path, extra: Sequence[str] = ()
) -> subprocess.Popen:
    """mlx_lm.server as its users run it, under the process settings mlxserve runs under
    (`cpu_environment`: OpenBLAS, huge pages); `extra`: more of its flags."""
    command = [sys.executable, "-m", "mlx_lm.server", "--model", model, *extra]
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
    the process and up to 5 more for the rest of its group (what it started), then SIGKILL to
    whatever is left. Quiet when the process has already exited or its group is gone (a server
    that died on its own, or a launcher that took its children with it)."""
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


@contextmanager
def served_ranks(
    model: str, count: int, extra: Sequence[str] = (), env: Mapping[str, str] | None = None
) -> Iterator[tuple[str, Path]]:
    """`count` local ranks serving `model` with `extra` flags (one plain process for 1), rank 0
    on a free port: its URL and log. Started as mlx.launch starts them (MLX_RANK,
    MLX_HOSTFILE), each in `env` (default: this process's environment)."""
    port = free_port()
    flags = [*extra, "--log-level", "info"] + (["--distributed"] if count > 1 else [])
    command = mlxserve_command(model, port, flags)
    hosts = Path(tempfile.mkdtemp(prefix="mlxserve-bench-ranks-")) / "hosts.json"
    hosts.write_text(json.dumps([[f"127.0.0.1:{free_port()}"] for _ in range(count)]))
    base = dict(os.environ if env is None else env)
    processes, logs = [], []
    try:
        for rank in range(count):
            launched = base | {"MLX_RANK": str(rank), "MLX_HOSTFILE": str(hosts)}
            logs.append(log_file(f"rank{rank}-of-{count}", port))
            processes.append(spawn(command, logs[-1], launched if count > 1 else base))
        wait_healthy(processes[0], f"http://127.0.0.1:{port}", logs[0])
        yield f"http://127.0.0.1:{port}", logs[0]
    finally:
        for process in processes:
            stop_server(process)


def how_split(log: Path) -> str:
    """Rank 0's line saying how the model was split over its ranks, and why."""
    lines = [line for line in log.read_text().splitlines() if "parallel over" in line]
    return lines[0].split("mlxserve.engine: ")[-1] if lines else "one process"


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


def stream(
    base_url: str, prompt: str, max_tokens: int, on_token=None, sampling: dict | None = None
) -> Streamed:
    """One streamed completion on a client of its own, greedy unless `sampling` says otherwise:
    time to first text chunk (the client's setup included), tokens (the usage chunk's count,
    else text chunks), and each text chunk's time. `on_token(count)` may return True to stop
    reading (the client leaves)."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    body |= sampling or {}
    body["ignore_eos"] = True  # mlxserve: every run decodes max_tokens (mlx_lm.server ignores it)
    body["stream_options"] = {"include_usage": True}
    sent = time.perf_counter()
    with httpx.Client(timeout=httpx.Timeout(900.0, connect=10.0)) as client:
        result = stream_completion(client, base_url, body, on_token)
    result.sent = sent
    if not result.stamps:
        raise ServerFailed(f"{base_url} streamed no text")
    return result


# -- long prompts beside running streams ------------------------------------------------------

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron".split()
# The measured stream may run this long: it stops a few tokens after the long prompt is
# answered, and it must outlive the whole prefill, join included. With 1024 it ended 60-84% into
# a 7,500-token prompt's wait, so the deepest chunks and the join (the worst step) went
# unmeasured.
GAP_STREAM_MAX_TOKENS = 7000  # under SmolLM2's 8192-token context with the short stream prompt
# The stream's tokens before the long prompt is sent: its median gap, the yardstick, is taken
# over these. Over 16 (one second) it measured 0.050-0.072 s from run to run on the 2-core VM,
# whose speed drifts, and moved the ratio as much as the worst gap did.
GAP_TOKENS_BEFORE = 64
GAP_STREAM_PROMPT = "Count slowly: one, two, three,"


def decode_rate(url: str, tokens: int, streams: int) -> float:
    """Decode tokens/s of `streams` greedy streams at once (each its own short prompt), from
    the first token to the last."""
    prompts = [f"Write a story about the number {i}." for i in range(streams)]
    with ThreadPoolExecutor(streams) as pool:
        results = list(pool.map(lambda p: stream(url, p, tokens), prompts))
    first = min(r.stamps[0] for r in results)
    last = max(r.stamps[-1] for r in results)
    return sum(r.tokens - 1 for r in results) / (last - first)


def load_tokenizer(model: str):
    """`model`'s tokenizer, for prompts cut to an exact token count (any length)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    tokenizer.model_max_length = 10**9
    return tokenizer


def long_prompt(tokenizer, tokens: int, tag: str) -> str:
    """Varied text of about `tokens` tokens of `tokenizer`, starting with `tag` (a unique tag
    makes a prompt that no prefix cache holds)."""
    words = [f"{WORDS[(i * 7 + len(tag)) % len(WORDS)]}{i % 97}" for i in range(tokens)]
    text = f"{tag}: " + " ".join(words)
    ids = tokenizer.encode(text, add_special_tokens=False)[: tokens - 8]
    return tokenizer.decode(ids) + "\n"


def unique_tag(kind: str) -> str:
    return f"{kind}-{time.time_ns()}"


@dataclass
class Beside:
    """A long prompt sent while streams run: what it waited and what the streams saw."""

    waited: float  # the prompt's time to first token beside the streams
    worst: float  # the measured stream's longest gap while the prompt waited
    median: float  # its median gap before the prompt was sent (the yardstick)
    # the share of the prompt's wait the stream lasted: under 1, the stream reached its token
    # limit first, so the end of the prefill (the prompt joining the batch) went unmeasured
    covered: float
    median_after: float  # its median gap after the prompt's answer (nan: not measured)


def beside(
    base_url: str,
    prompt: str,
    streams: int = 1,
    tokens_after: int = 0,
    send: Callable[[], None] | None = None,
) -> Beside:
    """Send `prompt` (`max_tokens` 1; or call `send()`, another request) once the first of
    `streams` greedy streams has run GAP_TOKENS_BEFORE tokens; the streams stop when it is
    answered, the first `tokens_after` tokens later (its own decode step afterwards, at the
    depth it reached). Build `prompt` before: tokenizing it (~30 ms of this client's CPU)
    inside the window, as it was, landed in a server step on a 2-core machine and was measured
    as a gap."""
    started, finished = threading.Event(), threading.Event()
    window: list[float] = []
    after_finish = [0]

    def measured_token(n: int) -> bool:
        if n == GAP_TOKENS_BEFORE:
            started.set()
        if finished.is_set():
            after_finish[0] += 1
        return after_finish[0] >= max(tokens_after, 1)

    def other_token(n: int) -> bool:
        return finished.is_set()

    def prompt_beside() -> None:
        started.wait()
        window.append(time.perf_counter())
        if send is not None:
            send()
        else:
            stream(base_url, prompt, 1)
        window.append(time.perf_counter())
        finished.set()

    limit = GAP_STREAM_MAX_TOKENS
    others = [
        threading.Thread(
            target=stream, args=(base_url, f"{GAP_STREAM_PROMPT} ({i})", limit, other_token)
        )
        for i in range(streams - 1)
    ]
    helper = threading.Thread(target=prompt_beside)
    with no_client_gc():
        for thread in [*others, helper]:
            thread.start()
        result = stream(base_url, GAP_STREAM_PROMPT, limit, measured_token)
        for thread in [*others, helper]:
            thread.join()
    pairs = list(zip(result.stamps, result.stamps[1:]))
    before = [b - a for a, b in pairs if b < window[0]]
    during = [b - a for a, b in pairs if b >= window[0] and a <= window[1]]
    after = [b - a for a, b in pairs if a > window[1]]
    return Beside(
        waited=window[1] - window[0],
        worst=max(during),
        median=statistics.median(before),
        covered=min(1.0, (result.stamps[-1] - window[0]) / (window[1] - window[0])),
        median_after=statistics.median(after) if after else float("nan"),
    )


# -- tables -----------------------------------------------------------------------------------


def print_median_ratios(ratios: dict[str, list[float]]) -> None:
    """Each row's median ratio over the runs, after a blank line (nothing when none)."""
    if ratios:
        print()
        print_table(
            [
                (f"{name}: median ratio of {len(r)}", f"{statistics.median(r):.2f}x")
                for name, r in ratios.items()
            ]
        )


def print_table(rows: list[tuple[str, str]]) -> None:
    """Two aligned columns: label and value."""
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        print(f"{label:<{width}}  {value}")
