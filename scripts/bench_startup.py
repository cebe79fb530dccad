"""Time from `make serve` to the first `GET /health` 200, with the venv already built: what a user
waits for between typing the command and the server answering.

Each run starts `make serve` on a free port in its own process group, polls /health every 50 ms,
and stops the server with Ctrl-C's signal once it answers 200. Run `make serve` (or `make
install`) once before, so the venv exists and no run includes pip.

    python scripts/bench_startup.py [--runs 3] [--model PATH]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
POLL_S = 0.05
LIMIT_S = 300.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def one_run(model: str | None) -> float:
    port = free_port()
    command = ["make", "--no-print-directory", "serve", f"PORT={port}", "HOST=127.0.0.1"]
    if model:
        command.append(f"MODEL={model}")
    started = time.monotonic()
    server = subprocess.Popen(
        command,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        with httpx.Client(timeout=1.0) as http:
            while time.monotonic() - started < LIMIT_S:
                if server.poll() is not None:
                    raise SystemExit(f"make serve exited with {server.returncode}")
                try:
                    if http.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                        return time.monotonic() - started
                except httpx.TransportError:
                    pass
                time.sleep(POLL_S)
        raise SystemExit(f"/health not 200 within {LIMIT_S:.0f} s")
    finally:
        os.killpg(server.pid, signal.SIGINT)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--model", help="as `make serve MODEL=...` (default: the demo model)")
    args = parser.parse_args()
    if not (REPO / ".venv" / ".installed").exists():
        raise SystemExit("build the venv first: make install (or make serve once)")
    times = []
    for n in range(1, args.runs + 1):
        seconds = one_run(args.model)
        times.append(seconds)
        print(f"run {n}: make serve -> /health 200 in {seconds:.2f} s", flush=True)
    print(f"median {statistics.median(times):.2f} s over {len(times)} runs")


if __name__ == "__main__":
    main()
