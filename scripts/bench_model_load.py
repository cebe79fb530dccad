"""A running stream's gaps while the server loads another model beside it.

One server serves the demo model; a chat stream runs on it. Each repeat loads a second model
(`POST /admin/load`, not made the default), waits until it is ready, then unloads it again. A
load runs on the one MLX thread, a slice of weights (or a timed pass) at a time, and the
stream steps between the slices: its worst gap during a load is reported against the load's
length (what the gap was before the slices) and against its own median gap.

    python scripts/bench_model_load.py [--repeats 3] [--other-model PATH]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import (
    SHARED_MODEL,
    ServerFailed,
    bench_parser,
    demo_model,
    print_table,
    served,
    start_server,
)
from bench_models import ChatStream

POLL_S = 0.02


def state_of(client: httpx.Client, url: str, name: str) -> dict:
    models = client.get(f"{url}/admin/status").json()["models"]
    return next((m for m in models if m["model"] == name), {"state": "unloaded", "memory_bytes": 0})


def wait_state(client: httpx.Client, url: str, name: str, done, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not done(state_of(client, url, name)):
        if time.monotonic() > deadline:
            raise ServerFailed(f"{name}: {state_of(client, url, name)}")
        time.sleep(POLL_S)


def one_load(client: httpx.Client, url: str, name: str, stream: ChatStream) -> dict:
    """Load `name` beside the stream, then unload it: the load's seconds and the stream's gaps
    during it."""
    began = time.perf_counter()
    response = client.post(f"{url}/admin/load", json={"model": name, "default": False})
    if response.status_code not in (200, 202):
        raise ServerFailed(f"/admin/load: HTTP {response.status_code}: {response.text}")
    wait_state(client, url, name, lambda m: m["state"] == "ready" and m["memory_bytes"] > 0)
    ended = time.perf_counter()
    time.sleep(0.5)  # the stream's first gap after the load counts too
    gaps = stream.gaps_between(began, time.perf_counter())
    client.post(f"{url}/admin/unload", json={"model": name})
    wait_state(client, url, name, lambda m: m["memory_bytes"] == 0)
    time.sleep(1.0)
    return {"load_s": ended - began, "gaps": gaps}


def main() -> int:
    parser = bench_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--other-model", default=None, help="the model loaded (default: SmolLM2)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    model = args.model or demo_model()
    other = Path(args.other_model or SHARED_MODEL)
    if not other.is_dir():
        print(f"no model at {other}: pass --other-model", file=sys.stderr)
        return 2
    extra = ["--models-dir", str(other.parent), "--memory-budget", "90%"]
    rows = []
    with served(lambda port, log: start_server(model, port, log, extra=extra), "load") as server:
        stream = ChatStream(server.url, Path(model).name)
        try:
            stream.wait_for_tokens(8)
            time.sleep(3.0)
            quiet = stream.gaps_between(0.0, time.perf_counter())
            with httpx.Client(timeout=300) as client:
                for repeat in range(args.repeats):
                    run = one_load(client, server.url, other.name, stream)
                    worst = max(run["gaps"])
                    median = statistics.median(quiet)
                    print(
                        f"repeat {repeat + 1}: load {run['load_s']:.2f} s; the stream's worst gap "
                        f"{worst * 1000:.0f} ms = {worst / run['load_s']:.2f} of the load, "
                        f"{worst / median:.1f}x its median gap ({median * 1000:.0f} ms)",
                        flush=True,
                    )
                    rows.append((run["load_s"], worst, median))
            if stream.error is not None:
                raise stream.error
        finally:
            stream.close()
    print_table(
        [
            ("stream on", Path(model).name),
            ("model loaded beside it", other.name),
            ("load, s", ", ".join(f"{r[0]:.2f}" for r in rows)),
            ("worst gap / load", ", ".join(f"{r[1] / r[0]:.2f}" for r in rows)),
            ("worst gap / median gap", ", ".join(f"{r[1] / r[2]:.1f}" for r in rows)),
        ]
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
