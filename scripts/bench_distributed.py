"""bench.py's distributed row: the same model served by 1 process and by 2 local ranks
(mlx.launch, ring backend on 127.0.0.1), measured side by side in one run.

On one machine the ranks share its cores and talk over loopback, so this measures overhead, not
speed-up: decode tokens/s and time to first token for both, the time each decode step gains with
2 ranks (communication and coordination, in microseconds), and the bytes the ranks exchange per
generated token (tensor parallelism all-reduces each layer's attention and MLP outputs).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import time
from functools import partial
from pathlib import Path

import httpx
from bench_common import (
    MLX_LAUNCH,
    ROW_ERRORS,
    http_decode_rate,
    row_failed,
    served,
    start_server,
)

HEALTH_TIMEOUT_S = 120.0


def _ttft(client: httpx.Client, url: str, prompt: str) -> float:
    body = {"prompt": prompt, "max_tokens": 1, "temperature": 0, "cache_prompt": False}
    start = time.perf_counter()
    client.post(f"{url}/v1/completions", json=body).raise_for_status()
    return time.perf_counter() - start


def _all_reduced_bytes_per_token(model: str) -> int:
    """2 all-reduces (attention and MLP outputs) per layer of hidden_size activations, in the
    dtype the ranks compute in (float32 on MLX's CPU backend, else as stored)."""
    config = json.loads((Path(model) / "config.json").read_text())
    import mlx.core as mx

    width = 4 if mx.default_device() == mx.cpu else 2
    return 2 * config["num_hidden_layers"] * config["hidden_size"] * width


IDLE_S = 5.0  # how long the idle ranks' CPU use is measured


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _idle_cpu(launcher: subprocess.Popen) -> tuple[list[float], float] | None:
    """Each rank's CPU use while the server has no work, and mlx.launch's own, as shares of a
    core over IDLE_S (None where /proc cannot say: not Linux)."""
    ranks = subprocess.run(
        ["pgrep", "-P", str(launcher.pid)], capture_output=True, text=True
    ).stdout.split()
    pids = [launcher.pid, *map(int, ranks)]
    try:
        time.sleep(1.0)  # the last request's tail
        before = [_cpu_seconds(p) for p in pids]
        time.sleep(IDLE_S)
        used = [(_cpu_seconds(p) - b) / IDLE_S for p, b in zip(pids, before, strict=True)]
    except OSError:
        return None
    return used[1:], used[0]


def run(model: str, prompt: str, max_tokens: int, repeats: int) -> None:
    if not MLX_LAUNCH.exists():
        print("distributed row skipped: mlx.launch is not installed")
        return
    rows = {}
    for distributed, name in ((False, "1 process"), (True, "2 ranks")):
        start = partial(start_server, model, distributed=distributed)
        tag = f"bench-{'ranks' if distributed else 'one'}"
        try:
            with (
                served(start, tag, HEALTH_TIMEOUT_S) as server,
                httpx.Client(timeout=300) as client,
            ):
                url = server.url
                http_decode_rate(client, url, prompt, 8)  # warm up
                rates = [
                    http_decode_rate(client, url, prompt, max_tokens)[0] for _ in range(repeats)
                ]
                ttfts = [_ttft(client, url, prompt) for _ in range(repeats)]
                if distributed:
                    idle = _idle_cpu(server.process)
        except ROW_ERRORS as error:
            row_failed(f"distributed ({name})", error)
            if not distributed:
                print("row distributed (2 ranks): skipped, nothing to compare it with")
            else:
                rate, ttft = rows[False]
                print(f"row distributed (1 process): {rate:.1f} tok/s, TTFT {ttft * 1000:.0f} ms")
            return
        rows[distributed] = (statistics.median(rates), statistics.median(ttfts))
    (one_rate, one_ttft), (two_rate, two_ttft) = rows[False], rows[True]
    added_us = (1 / two_rate - 1 / one_rate) * 1e6
    print(f"\nDistributed: {Path(model).name}, 1 process vs 2 local ranks (ring, 127.0.0.1)")
    print(
        f"  decode tok/s        1 process {one_rate:8.1f}   2 ranks {two_rate:8.1f}   "
        f"ratio {two_rate / one_rate:.3f}"
    )
    print(
        f"  TTFT (short prompt) 1 process {one_ttft * 1000:6.0f} ms   2 ranks "
        f"{two_ttft * 1000:6.0f} ms"
    )
    print(f"  per decode step with 2 ranks: +{added_us:,.0f} us (communication and lock-step)")
    print(
        f"  bytes all-reduced per token:  {_all_reduced_bytes_per_token(model):,} "
        "(+ 4 for rank 0's token, + the step's tick)"
    )
    if idle is not None:
        ranks, launcher = idle
        shares = " / ".join(f"{share:.1%}" for share in ranks)
        print(
            f"  idle CPU over {IDLE_S:g} s: ranks {shares} of a core; mlx.launch itself "
            f"{launcher:.0%} (it polls its ranks' output in a busy loop)"
        )
