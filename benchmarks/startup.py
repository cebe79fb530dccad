"""Start-up: the time from the command to the first `GET /health` 200 and to the first streamed
token, mlxserve (`make serve`) against mlx_lm.server on the same model: what a user waits for
between typing the command and the server answering.

Each run starts `make serve` (with `--direct`: `python -m mlxserve serve` with this interpreter,
for a venv that is not the repository's `.venv`) on a free port in its own process group, polls
/health every 50 ms (both servers answer 503 while the model loads), then streams a short
completion and stops the server once its first token arrives; then the same for
`python -m mlx_lm.server`. Run `make serve` (or `make install`) once before, so the venv exists
and no run includes pip. This script only prints; it asserts nothing.

    python benchmarks/startup.py [--runs 3] [--model PATH] [--direct [--engine-in-process]]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from common import (
    REPO_ROOT,
    add_engine_flag,
    bench_parser,
    demo_model,
    engine_flags,
    free_port,
    log_file,
    mlxserve_command,
    print_table,
    spawn,
    start_mlx_lm_server,
    stop_server,
    stream,
    wait_healthy,
)

POLL_S = 0.05
PROMPT = "Hello"


def parse_args() -> argparse.Namespace:
    parser = bench_parser(
        "Start-up: from the command to the first /health 200 and to the first streamed token, "
        "mlxserve (make serve) against mlx_lm.server on the same model.",
        model_help="as `make serve MODEL=...` (default: the demo model)",
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--direct",
        action="store_true",
        help="start `python -m mlxserve serve` with this interpreter instead of `make serve`",
    )
    add_engine_flag(parser)
    return parser.parse_args()


def make_serve(model: str | None) -> Callable[[int, Path], subprocess.Popen]:
    def start(port: int, log_path: Path) -> subprocess.Popen:
        command = ["make", "--no-print-directory", "serve", f"PORT={port}", "HOST=127.0.0.1"]
        if model:
            command.append(f"MODEL={model}")
        return spawn(command, log_path)

    return start


def one_run(tag: str, start: Callable[[int, Path], subprocess.Popen]) -> tuple[float, float]:
    """Seconds from the command to the first /health 200, and to the first token."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = log_file(f"startup-{tag}", port)
    started = time.monotonic()
    server = start(port, log_path)
    try:
        wait_healthy(server, url, log_path, poll_s=POLL_S)
        healthy = time.monotonic() - started
        stream(url, PROMPT, 4, on_token=lambda count: True)
        return healthy, time.monotonic() - started
    finally:
        stop_server(server)


def main() -> int:
    args = parse_args()
    model = args.model or demo_model()
    if args.direct:
        extra = engine_flags(args)
        ours = (
            "mlxserve serve",
            lambda port, log: spawn(mlxserve_command(model, port, extra), log),
        )
    else:
        if not (REPO_ROOT / ".venv" / ".installed").exists():
            raise SystemExit("build the venv first: make install (or make serve once)")
        ours = ("make serve", make_serve(args.model))
    theirs = ("mlx_lm.server", lambda port, log: start_mlx_lm_server(model, port, log))
    times: dict[str, list[tuple[float, float]]] = {ours[0]: [], theirs[0]: []}
    for n in range(1, args.runs + 1):
        for name, start in (ours, theirs):
            healthy, first = one_run(name.split()[0], start)
            times[name].append((healthy, first))
            print(
                f"run {n}: {name} -> /health 200 in {healthy:.2f} s, first token in {first:.2f} s",
                flush=True,
            )
    rows = [("model", model), ("runs", str(args.runs))]
    for name, runs in times.items():
        health = statistics.median(h for h, _ in runs)
        first = statistics.median(f for _, f in runs)
        rows.append(
            (f"{name}: /health 200, first token (medians)", f"{health:.2f} s, {first:.2f} s")
        )
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
