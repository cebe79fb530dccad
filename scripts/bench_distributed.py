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
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

LAUNCH = Path(sys.executable).with_name("mlx.launch")


def _serve(model: str, port: int, log: Path, distributed: bool) -> subprocess.Popen:
    command = [
        sys.executable,
        "-m",
        "mlxserve",
        "serve",
        "--model",
        model,
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    if distributed:
        command = [
            str(LAUNCH),
            "--backend",
            "ring",
            "-n",
            "2",
            "--hosts",
            "127.0.0.1",
            "--",
            *command,
            "--distributed",
        ]
    return subprocess.Popen(
        command, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True
    )


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


def run(model: str, prompt: str, max_tokens: int, repeats: int, decode_rate, free_port) -> None:
    if not LAUNCH.exists():
        print("distributed row skipped: mlx.launch is not installed")
        return
    rows = {}
    for distributed in (False, True):
        port = free_port()
        log = Path(f"/tmp/mlxserve-bench-{'ranks' if distributed else 'one'}.log")
        server = _serve(model, port, log, distributed)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    if httpx.get(url + "/health", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline or server.poll() is not None:
                    print(f"distributed row skipped: server did not start ({log})")
                    return
                time.sleep(0.25)
            with httpx.Client(timeout=300) as client:
                decode_rate(client, url, prompt, 8)  # warm up
                rates = [decode_rate(client, url, prompt, max_tokens)[0] for _ in range(repeats)]
                ttfts = [_ttft(client, url, prompt) for _ in range(repeats)]
            rows[distributed] = (statistics.median(rates), statistics.median(ttfts))
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
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
