"""The prefix cache on disk: a restarted server starts a repeated long prompt from the KV an
earlier one wrote; files that do not match are never loaded; a full disk leaves it answering."""

from __future__ import annotations

import base64
import json
import logging
import re
import resource
import signal
import struct
import time
from pathlib import Path

import httpx
import numpy as np

from mlxserve.engine.prefix.disk import BLOCK, DEBOUNCE_S
from mlxserve.engine.prefix.files import read_header

from ..helpers import complete, start_serve, texts, wait_healthy
from ..live_server import free_port

PROMPT_TOKENS = 1100  # past the shortest prompt written to disk (MIN_TOKENS), in five segments


def prompt(k: int) -> list[int]:
    """A long prompt of token ids, one of several that share no prefix."""
    return [3 + (i * 7919 + k * 104729) % 1000 for i in range(PROMPT_TOKENS)]


def body(k: int = 0, **extra) -> dict:
    return {"prompt": prompt(k), "max_tokens": 8, "temperature": 0, **extra}


def cached(result: dict) -> int:
    return result["usage"]["prompt_tokens_details"]["cached_tokens"]


def serve(live_servers, model: Path, folder: Path):
    return live_servers.own(model, prefix_cache_dir=folder)


def ask(server, *bodies: dict) -> list[dict]:
    with httpx.Client(base_url=server.url, timeout=120) as http:
        return [complete(http, **b) for b in bodies]


def our_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.safetensors"))


def first_segment(folder: Path, k: int) -> Path:
    """The file holding prompt k's first tokens: without it no later one of its is read."""
    for path in our_files(folder):
        metadata = read_header(path)["__metadata__"]
        first = np.frombuffer(base64.b64decode(metadata["tokens"]), dtype="<i4")[0]
        if metadata["start"] == "0" and first == prompt(k)[0]:
            return path
    raise AssertionError(f"no first segment of prompt {k} in {folder}")


def test_a_restarted_server_starts_a_repeated_long_prompt_from_disk(
    live_servers, tiny_model, tmp_path
):
    with serve(live_servers, tiny_model, tmp_path):
        pass  # an empty folder: nothing to read
    with serve(live_servers, tiny_model, tmp_path) as first:
        (before,) = ask(first, body())
    assert cached(before) == 0
    assert len(our_files(tmp_path)) == -(-PROMPT_TOKENS // BLOCK)  # segments of prompt + answer
    with serve(live_servers, tiny_model, tmp_path) as second:
        after, cold = ask(second, body(), body(cache_prompt=False))
        metrics = httpx.get(second.url + "/metrics", timeout=60).text
    loads = r'^mlxserve_prefix_cache_disk_loads_total{model="[^"]+"} 1.0$'
    assert re.search(loads, metrics, re.MULTILINE)
    segments = -(-PROMPT_TOKENS // BLOCK)
    entries = rf'^mlxserve_prefix_cache_disk_entries{{model="[^"]+"}} {segments}.0$'
    assert re.search(entries, metrics, re.MULTILINE)
    assert cached(after) >= 0.9 * after["usage"]["prompt_tokens"]
    assert cached(cold) == 0
    assert texts(after) == texts(cold) == texts(before)


def rewrite_metadata(path: Path, **changes: str) -> None:
    """Change the file's safetensors metadata."""
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + length])
    header["__metadata__"].update(changes)
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + raw[8 + length :])


def test_corrupt_truncated_foreign_and_other_version_files_are_ignored(
    live_servers, tiny_model, tiny_models_dir, tmp_path, caplog
):
    ours, others = tmp_path / "ours", tmp_path / "others"
    with serve(live_servers, tiny_model, ours) as server:
        expected = ask(server, *(body(k) for k in range(4)))  # cold (a new folder), and written
        assert [cached(r) for r in expected] == [0, 0, 0, 0]
    # the same prompt served by another model of the same shapes (other weights)
    with serve(live_servers, tiny_models_dir / "tiny2", others) as server:
        ask(server, body(3))
    corrupt, truncated, other_version, foreign = (first_segment(ours, k) for k in range(4))
    data = bytearray(corrupt.read_bytes())
    data[-100:] = bytes(255 - b for b in data[-100:])  # flipped bits in the last layer's KV
    corrupt.write_bytes(bytes(data))
    truncated.write_bytes(truncated.read_bytes()[:-4096])
    rewrite_metadata(other_version, version="0.0.1")
    # another model's KV of the same tokens under this one's name
    foreign.write_bytes(first_segment(others, 3).read_bytes())
    caplog.set_level(logging.WARNING, logger="mlxserve.engine")
    with serve(live_servers, tiny_model, ours) as server:
        results = ask(server, *(body(k) for k in range(4)))
        assert server.engine.stats.prefix_disk_loads == 0
    assert [cached(r) for r in results] == [0, 0, 0, 0]
    assert [texts(r) for r in results] == [texts(e) for e in expected]
    ignored = [r.getMessage() for r in caplog.records if "ignoring" in r.getMessage()]
    for path, why in [
        (corrupt, "checksum"),
        (truncated, "truncated"),
        (other_version, "written by mlxserve 0.0.1"),
        (foreign, "another model"),
    ]:
        assert any(path.name in line and why in line for line in ignored), (why, ignored)


def test_a_full_disk_leaves_the_server_answering_from_memory(tiny_model, tmp_path):
    """Files may not grow past 64 KiB in this server's process (RLIMIT_FSIZE, as a full disk
    fails a write); a segment of the long prompt's KV is 128 KiB."""

    def small_files() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # fail the write, do not kill the process
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = start_serve(
        *("--model", str(tiny_model), "--port", str(port), "--prefix-cache-dir", str(tmp_path)),
        preexec_fn=small_files,
    )
    try:
        wait_healthy(url)
        with httpx.Client(base_url=url, timeout=120) as http:
            first = complete(http, **body())
            time.sleep(DEBOUNCE_S + 2)  # its write is due, and fails
            again = complete(http, **body())
            health = http.get("/health")
    finally:
        server.send_signal(signal.SIGINT)
        _, err = server.communicate(timeout=60)
    assert health.status_code == 200
    assert cached(again) >= 0.9 * again["usage"]["prompt_tokens"]  # from memory
    assert texts(again) == texts(first)
    assert "it stays in memory from now on" in err
    assert list(tmp_path.iterdir()) == []  # no file, not even a partial one
