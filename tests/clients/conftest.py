"""The coding agents' tier: each client, installed from its registry by scripts/install_clients.sh,
runs non-interactively against a real server on 127.0.0.1 (the tiny agent model).

`make test-clients` runs it (pytest -m clients); plain `make test` leaves it out.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from mlxserve.api import access_log as access_log_module
from mlxserve.settings import Limits
from mlxserve.tiny_model import build_tiny_agent_model

from ..helpers import skip_for_missing
from .agents import MODEL

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = ROOT / "build" / "clients"
HERE = Path(__file__).resolve().parent
NOT_ASKED = (
    "the coding agents' tier runs on request: `make test-clients` (pytest -m clients, "
    "MLXSERVE_CLIENTS=1, or under .ci/run)"
)
# A safety net: the model ends its answers within a few tokens (tiny_model.END_LOGIT).
MAX_TOKENS = 1024

BODY_LINE = "%s %s body: %s"  # access_log.note_body's
ACCESS_LINE = re.compile(
    r'"(?P<method>[A-Z]+) (?P<path>\S+)" (?P<status>\d{3}) [\d.]+s'
    r"(?: prompt_tokens=(?P<prompt>\d+) completion_tokens=\d+ cached_tokens=(?P<cached>\d+))?"
)


def asked_for(config: pytest.Config) -> bool:
    markexpr = config.getoption("markexpr") or ""
    return (
        re.search(r"(?<!not )\bclients\b", markexpr) is not None
        or os.environ.get("MLXSERVE_CLIENTS") == "1"
        or os.environ.get("MLXSERVE_CI") == "1"
    )


def pytest_collection_modifyitems(config, items):
    if asked_for(config):
        return
    skip = pytest.mark.skip(reason=NOT_ASKED)
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(skip)


@dataclass
class Request:
    """One line of the server's access log."""

    method: str
    path: str
    status: int
    prompt_tokens: int | None
    cached_tokens: int | None


class AccessLog(logging.Handler):
    """The requests the server answered while it is installed on "mlxserve.access", and (its
    DEBUG lines) their JSON bodies, whole."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.requests: list[Request] = []
        self.bodies: list[tuple[str, str]] = []  # (path, JSON text)

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg == BODY_LINE:
            _, path, text = record.args
            self.bodies.append((path, text))
            return
        if record.levelno < logging.INFO:
            return
        match = ACCESS_LINE.search(record.getMessage())
        if match is None:
            return
        prompt, cached = match["prompt"], match["cached"]
        self.requests.append(
            Request(
                match["method"],
                match["path"],
                int(match["status"]),
                int(prompt) if prompt is not None else None,
                int(cached) if cached is not None else None,
            )
        )

    def take(self) -> list[Request]:
        """The requests since the last take."""
        taken, self.requests = self.requests, []
        return taken

    def take_bodies(self) -> list[tuple[str, str]]:
        taken, self.bodies = self.bodies, []
        return taken


@pytest.fixture(scope="session")
def installed() -> Path:
    if not (CLIENTS / "versions.txt").exists():
        skip_for_missing(
            f"the coding agents are not installed in {CLIENTS} (scripts/install_clients.sh)"
        )
    return CLIENTS


@pytest.fixture(scope="session")
def agent_model(tmp_path_factory) -> Path:
    return build_tiny_agent_model(tmp_path_factory.mktemp("models") / MODEL, seed=0)


@pytest.fixture(scope="session")
def agent_server(live_servers, agent_model):
    return live_servers.shared(agent_model, limits=Limits(max_tokens=MAX_TOKENS))


@pytest.fixture
def access_log(agent_server, monkeypatch):
    monkeypatch.setattr(access_log_module, "MAX_LOGGED_BODY", 1 << 30)  # bodies whole
    logger = logging.getLogger("mlxserve.access")
    handler, level = AccessLog(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


# Each client's turns, for the summary at the end (and docs/benchmarks.md).
RESULTS: list[tuple[str, str]] = []


def pytest_terminal_summary(terminalreporter):
    if RESULTS:
        terminalreporter.section("coding agents: prompt tokens and the next turn's cached share")
        for client, line in RESULTS:
            terminalreporter.write_line(f"{client:<22} {line}")
