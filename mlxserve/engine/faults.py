"""Faults on purpose, so that a row failing inside the engine's step can be tested end to end
(tests, `scripts/soak.py --fault-rate`): with MLXSERVE_FAULTS=1 in the server's environment, a
request whose `user` is `mlxserve-fault:STAGE[:TOKENS]` fails in that stage (sampler, grammar,
detokenizer) after generating TOKENS tokens. Off otherwise: `user` is then only a label."""

from __future__ import annotations

import os
from dataclasses import dataclass

ENVIRONMENT = "MLXSERVE_FAULTS"
PREFIX = "mlxserve-fault:"
STAGES = ("sampler", "grammar", "detokenizer")


class InjectedFault(RuntimeError):
    """The failure a fault asked for."""


@dataclass(frozen=True)
class Fault:
    stage: str
    after: int = 0  # tokens the row generates before it fails

    def check(self, stage: str, generated: int) -> None:
        if stage == self.stage and generated >= self.after:
            raise InjectedFault(f"injected fault in the {stage} (a test asked for it)")


def fault_of(user: str | None) -> Fault | None:
    """The fault a request's `user` asks for, when faults are enabled."""
    if not user or not user.startswith(PREFIX) or os.environ.get(ENVIRONMENT) != "1":
        return None
    stage, _, after = user[len(PREFIX) :].partition(":")
    if stage not in STAGES:
        return None
    return Fault(stage, int(after) if after.isdigit() else 0)
