"""Rank 0 wakes the other ranks of a cluster through a plain TCP connection each, so that they wait
for work without a collective: a rank waiting in one of the ring backend's collectives spins a
core, and an idle server should cost nothing. The connection also tells a rank at once that rank
0 is gone (it closes), where a collective would wait for ever.

Rank 0 listens on its own address in mlx.launch's host file (MLX_HOSTFILE: the ring backend's
list of each rank's "ip:port"), on a port the system picks, which a collective hands to the other
ranks. Without a host file to read (another backend) there is no doorbell, and idle ranks wait in
the tick's collective as before.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
from collections.abc import Callable

log = logging.getLogger("mlxserve.engine")

ACCEPT_TIMEOUT_S = 60.0


def rank0_host() -> str | None:
    """Rank 0's address in mlx.launch's host file, or None where there is none to read."""
    path = os.environ.get("MLX_HOSTFILE")
    try:
        with open(path or "") as file:
            hosts = json.load(file)
        first = hosts[0][0] if isinstance(hosts[0], list) else hosts[0]
        return str(first).rsplit(":", 1)[0]
    except (OSError, ValueError, IndexError, KeyError, TypeError):
        return None


class Doorbell:
    """Rank 0's side rings (`ring`); another rank's side waits (`wait`), and calls `on_gone` the
    moment the connection to rank 0 closes."""

    def __init__(self, sockets: list[socket.socket], on_gone: Callable[[str], None] | None = None):
        self._sockets = sockets
        self._rings = threading.Semaphore(0)
        if on_gone is not None:
            threading.Thread(
                target=self._listen,
                args=(sockets[0], on_gone),
                name="mlxserve-doorbell",
                daemon=True,
            ).start()

    @classmethod
    def open(cls, cluster, on_gone: Callable[[str], None]) -> Doorbell | None:
        """Connect rank 0 to every other rank (a collective: every rank calls it at the same
        point); None on every rank where rank 0 has no doorbell to offer."""
        host = rank0_host()  # every rank reads the same host file
        listener = None
        if cluster.leader and host is not None:
            try:
                listener = socket.create_server((host, 0))
            except OSError as error:
                log.warning("no doorbell for idle ranks (%s): they wait in a collective", error)
        port = cluster.broadcast(listener.getsockname()[1] if listener else None)
        if port is None:
            return None
        if not cluster.leader:
            connection = socket.create_connection((host, port), timeout=ACCEPT_TIMEOUT_S)
            connection.settimeout(None)
            return cls([connection], on_gone)
        listener.settimeout(ACCEPT_TIMEOUT_S)
        with listener:
            followers = [listener.accept()[0] for _ in range(cluster.size - 1)]
        return cls(followers)

    def ring(self) -> None:
        """Rank 0: wake every other rank once."""
        for connection in self._sockets:
            try:
                connection.sendall(b"\x01")
            except OSError:
                pass  # that rank is gone: the next collective says so

    def wait(self) -> None:
        """Another rank: until rank 0 rings (at once if it rang already)."""
        self._rings.acquire()

    def _listen(self, connection: socket.socket, on_gone: Callable[[str], None]) -> None:
        while True:
            try:
                data = connection.recv(64)
            except OSError as error:
                on_gone(f"the connection to rank 0 failed ({error})")
                return
            if not data:
                on_gone("rank 0 closed its connection")
                return
            for _ in data:
                self._rings.release()
