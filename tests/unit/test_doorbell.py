"""The doorbell finds rank 0's address in mlx.launch's host file, and a rank waiting on it wakes
once per ring and learns at once that rank 0 closed its side."""

from __future__ import annotations

import json
import socket
import threading

from mlxserve.engine.cluster.doorbell import Doorbell, rank0_host


def test_rank_0s_address_comes_from_the_ring_host_file(tmp_path, monkeypatch):
    hosts = tmp_path / "hosts.json"
    hosts.write_text(json.dumps([["10.0.0.1:5000"], ["10.0.0.2:5000"]]))
    monkeypatch.setenv("MLX_HOSTFILE", str(hosts))
    assert rank0_host() == "10.0.0.1"


def test_without_a_readable_host_file_there_is_no_address(tmp_path, monkeypatch):
    monkeypatch.delenv("MLX_HOSTFILE", raising=False)
    assert rank0_host() is None
    (tmp_path / "bad.json").write_text("{not json")
    monkeypatch.setenv("MLX_HOSTFILE", str(tmp_path / "bad.json"))
    assert rank0_host() is None


def test_a_ring_wakes_the_waiting_rank_and_a_close_says_rank_0_is_gone():
    rank0_side, other_side = socket.socketpair()
    gone = threading.Event()
    reasons: list[str] = []

    def on_gone(why: str) -> None:
        reasons.append(why)
        gone.set()

    waiting, ringing = Doorbell([other_side], on_gone), Doorbell([rank0_side])
    ringing.ring()
    ringing.ring()
    woken = threading.Thread(target=lambda: (waiting.wait(), waiting.wait()))
    woken.start()
    woken.join(5)
    assert not woken.is_alive()  # one wake-up per ring, rung before or after the wait
    rank0_side.close()
    assert gone.wait(5)
    assert reasons == ["rank 0 closed its connection"]
