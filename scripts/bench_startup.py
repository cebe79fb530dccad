"""Time from `make serve` to the first `GET /health` 200, with the venv already built: what a user
waits for between typing the command and the server answering.

Each run starts `make serve` on a free port in its own process group (bench_common's `spawn`),
polls /health every 50 ms, and stops the server once it answers 200. Run `make serve` (or `make
install`) once before, so the venv exists and no run includes pip.

    python scripts/bench_startup.py [--runs 3] [--model PATH]
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench_common import REPO_ROOT, free_port, log_file, spawn, stop_server, wait_healthy

POLL_S = 0.05


def one_run(model: str | None) -> float:
    port = free_port()
    command = ["make", "--no-print-directory", "serve", f"PORT={port}", "HOST=127.0.0.1"]
    if model:
        command.append(f"MODEL={model}")
    log_path = log_file("startup", port)
    started = time.monotonic()
    server = spawn(command, log_path)
    try:
        wait_healthy(server, f"http://127.0.0.1:{port}", log_path, poll_s=POLL_S)
        return time.monotonic() - started
    finally:
        stop_server(server)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--model", help="as `make serve MODEL=...` (default: the demo model)")
    args = parser.parse_args()
    if not (REPO_ROOT / ".venv" / ".installed").exists():
        raise SystemExit("build the venv first: make install (or make serve once)")
    times = []
    for n in range(1, args.runs + 1):
        seconds = one_run(args.model)
        times.append(seconds)
        print(f"run {n}: make serve -> /health 200 in {seconds:.2f} s", flush=True)
    print(f"median {statistics.median(times):.2f} s over {len(times)} runs")


if __name__ == "__main__":
    main()
