"""The engine's own process (mlxserve/ipc/): what the boundary costs, what the front weighs, and
how fast a dead engine process is noticed and replaced.

- IPC per token: a step's events (`--batch` GenerationEvents of one token each, as the engine
  makes them) encoded, sent over the same ZeroMQ `ipc://` sockets the server uses to another
  process, received and decoded there, and the reply read back: microseconds per event, against
  the one-process hand-off it replaces (a thread's `loop.call_soon_threadsafe` of the step's
  events onto an asyncio queue, read back by the loop) in the same run;
- memory: the front's and the engine process's resident set (RSS) of a server idle after its
  model loaded (`--model`), and of the same server run with `--engine-in-process`;
- idle: the front's and the engine process's wake-ups a second (voluntary context switches,
  every thread's) and CPU seconds over `--idle-s` at rest, after a request's tokens/s window
  has passed: what a server left running on a laptop costs while nobody uses it;
- a crash: `kill -9` of the engine process during `--streams` streams: the time until every
  stream has ended with its error, and until /health answers 200 again (the engine process
  started, the model loaded), `--repeats` times, each after the supervisor's crash-loop window.

Linux (/proc) for the memory and the engine process's pid.

This script only prints; it asserts nothing.

    python benchmarks/engine_process.py [--model PATH] [--batch 1 16] [--messages 20000]
                                        [--streams 16] [--repeats 1] [--idle-s 10]
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from common import (
    ServerFailed,
    bench_parser,
    default_model,
    print_table,
    reexec_for_cpu,
    served,
    sse_chunks,
    start_server,
)

from mlxserve.engine.stats import RATE_WINDOW_S  # noqa: E402
from mlxserve.ipc.supervisor import STABLE_S  # noqa: E402


def parse_args():
    parser = bench_parser(
        "The engine's own process: IPC microseconds per token against the one-process hand-off, "
        "the front's and the engine's memory, and a killed engine's recovery."
    )
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--idle-s", type=float, default=10.0)
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="kills, each after the supervisor's crash-loop window (30 s) has passed",
    )
    return parser.parse_args()


def step_events(batch: int):
    from mlxserve.engine.requests import GenerationEvent

    return [
        (group, GenerationEvent(index=0, text=" word", token_ids=[1234])) for group in range(batch)
    ]


def _echo(address_in: str, address_out: str, messages: int) -> None:
    """The other process: every message decoded and answered with its number of events."""
    import zmq

    from mlxserve.ipc.schema import FROM_ENGINE

    context = zmq.Context()
    inbox, outbox = context.socket(zmq.PULL), context.socket(zmq.PUSH)
    inbox.connect(address_in)
    outbox.connect(address_out)
    for _ in range(messages):
        events = FROM_ENGINE.decode(inbox.recv(copy=False))
        outbox.send(len(events.items).to_bytes(4, "little"))
    inbox.close()
    outbox.close()
    context.term()


def ipc_us_per_event(batch: int, messages: int) -> float:
    """Engine side: encode + send; front side (another process): receive + decode; timed to the
    last reply, pipelined as a stream of steps is."""
    import zmq

    from mlxserve.ipc.schema import Events, encode

    folder = Path(tempfile.mkdtemp(prefix="mlxserve-bench-ipc-"))
    to_front, back = f"ipc://{folder / 'a'}", f"ipc://{folder / 'b'}"
    context = zmq.Context()
    outbox, inbox = context.socket(zmq.PUSH), context.socket(zmq.PULL)
    outbox.bind(to_front)
    inbox.bind(back)
    other = multiprocessing.get_context("spawn").Process(
        target=_echo, args=(to_front, back, messages)
    )
    other.start()
    items = step_events(batch)
    outbox.send(encode(Events(items)))  # connected both ways before the clock starts
    inbox.recv()
    started = time.perf_counter()
    in_flight = 0
    for _ in range(messages - 1):
        outbox.send(encode(Events(items)), copy=False)
        in_flight += 1
        while in_flight > 64:  # a bounded pipeline: the front keeps up with the steps
            inbox.recv()
            in_flight -= 1
    while in_flight:
        inbox.recv()
        in_flight -= 1
    elapsed = time.perf_counter() - started
    other.join()
    outbox.close()
    inbox.close()
    context.term()
    return elapsed / ((messages - 1) * batch) * 1e6


def in_process_us_per_event(batch: int, messages: int) -> float:
    """The one-process hand-off: a thread posts each step's events to the loop in one call
    (engine/scheduling/messages.py's posted_together), the loop puts them on queues and reads
    them."""
    items = step_events(batch)

    async def run() -> float:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        done = asyncio.Event()

        def put_all(events) -> None:
            for event in events:
                queue.put_nowait(event)

        def engine() -> None:
            for _ in range(messages):
                loop.call_soon_threadsafe(put_all, list(items))
            loop.call_soon_threadsafe(done.set)

        started = time.perf_counter()
        threading.Thread(target=engine).start()
        read = 0
        while read < messages * batch:
            await queue.get()
            read += 1
        await done.wait()
        return time.perf_counter() - started

    return asyncio.run(run()) / (messages * batch) * 1e6


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def wakeups_and_cpu_s(pid: int) -> tuple[int, float]:
    """Every thread's voluntary context switches, and the process's CPU seconds, so far."""
    switches = 0
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        try:
            lines = status.read_text().splitlines()
        except FileNotFoundError:  # a thread that ended
            continue
        switches += sum(int(line.split()[1]) for line in lines if line.startswith("voluntary_"))
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return switches, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_cost(url: str, pids: list[int], seconds: float) -> list[tuple[float, float]]:
    """After one short request and the engine's tokens/s window: each pid's wake-ups a second
    and CPU seconds over `seconds`."""
    httpx.post(f"{url}/v1/completions", json={"prompt": "Once", "max_tokens": 4}, timeout=60)
    time.sleep(RATE_WINDOW_S + 1)
    before = [wakeups_and_cpu_s(pid) for pid in pids]
    time.sleep(seconds)
    after = [wakeups_and_cpu_s(pid) for pid in pids]
    return [((a[0] - b[0]) / seconds, a[1] - b[1]) for a, b in zip(after, before)]


def engine_pid(front_pid: int) -> int | None:
    children = Path(f"/proc/{front_pid}/task/{front_pid}/children")
    pids = [int(p) for p in children.read_text().split()] if children.exists() else []
    for pid in pids:
        if b"mlxserve.ipc.engine_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
            return pid
    return None


def crash_recovery(url: str, front_pid: int, streams: int) -> tuple[float, float]:
    """Seconds from kill -9 to the last stream's end, and to /health 200 again."""
    ended: list[float] = []
    started = threading.Barrier(streams + 1)

    def read() -> None:
        body = {"prompt": "Once upon a time", "max_tokens": 4000, "ignore_eos": True}
        with httpx.Client(timeout=60) as http:
            with http.stream("POST", f"{url}/v1/completions", json={**body, "stream": True}) as r:
                chunks = sse_chunks(r, "crash")
                next(chunks)
                started.wait()
                try:
                    for _ in chunks:
                        pass
                except ServerFailed as error:  # the error event the kill must bring
                    if "engine_restarted" in str(error):
                        ended.append(time.monotonic())

    threads = [threading.Thread(target=read) for _ in range(streams)]
    for thread in threads:
        thread.start()
    started.wait()
    killed = time.monotonic()
    os.kill(engine_pid(front_pid), signal.SIGKILL)
    for thread in threads:
        thread.join(60)
    while httpx.get(f"{url}/health", timeout=5).status_code != 200:
        time.sleep(0.01)
    if len(ended) < streams:
        raise ServerFailed(f"{streams - len(ended)} streams did not end with engine_restarted")
    return max(ended) - killed, time.monotonic() - killed


def main() -> None:
    reexec_for_cpu()
    args = parse_args()
    model = args.model or default_model()
    rows: list[tuple[str, str]] = []
    for batch in args.batch:
        ipc = statistics.median(ipc_us_per_event(batch, args.messages) for _ in range(3))
        local = statistics.median(in_process_us_per_event(batch, args.messages) for _ in range(3))
        rows.append(
            (
                f"µs per token, {batch} event(s) a step: ipc / one process",
                f"{ipc:.2f} / {local:.2f} = {ipc / local:.2f}x",
            )
        )
    for extra, name in (((), "two processes"), (("--engine-in-process",), "one process")):
        with served(
            lambda port, log, extra=extra: start_server(model, port, log, extra), "rss"
        ) as server:
            time.sleep(2)  # idle after the load
            front = server.process.pid
            engine = engine_pid(front)
            if engine is None:
                rows.append((f"RSS idle, {name}", f"{rss_mb(front):.0f} MB"))
            else:
                rows.append(
                    (
                        f"RSS idle, {name}: front / engine process",
                        f"{rss_mb(front):.0f} / {rss_mb(engine):.0f} MB",
                    )
                )
                (front_rate, front_cpu), (engine_rate, engine_cpu) = idle_cost(
                    server.url, [front, engine], args.idle_s
                )
                rows.append(
                    (
                        f"at rest, {name}: wake-ups a second, front / engine process "
                        f"(CPU s in {args.idle_s:g} s)",
                        f"{front_rate:.1f} / {engine_rate:.1f} "
                        f"({front_cpu:.2f} / {engine_cpu:.2f})",
                    )
                )
            if engine is not None:
                for repeat in range(args.repeats):
                    if repeat:  # a death sooner after a start counts towards a crash loop
                        time.sleep(STABLE_S)
                    errors_s, healthy_s = crash_recovery(server.url, front, args.streams)
                    rows.append(
                        (
                            f"kill -9 during {args.streams} streams (repeat {repeat + 1}): last "
                            "stream's error / /health 200 again",
                            f"{errors_s:.3f} / {healthy_s:.2f} s",
                        )
                    )
    rows.insert(0, ("model", model))
    print_table(rows)


if __name__ == "__main__":
    main()
    sys.exit(0)
