"""Faults on purpose, so that a row failing inside the engine's step can be tested end to end
(tests, `scripts/soak.py --fault-rate`): with MLXSERVE_FAULTS=1 in the server's environment, a
request whose `user` is `mlxserve-fault:STAGE[:TOKENS]` fails in that stage after generating
TOKENS tokens. Off otherwise: `user` is then only a label.

Stages: `sampler`, `grammar`, `detokenizer` (the row's own code), `forward` (the decode pass of
a batch holding the row raises half-way through the model's layers, after some layers wrote
their KV) and `prefill` (so does any pass carrying the row's prompt)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import mlx.nn as nn

ENVIRONMENT = "MLXSERVE_FAULTS"
PREFIX = "mlxserve-fault:"
ROW_STAGES = ("sampler", "grammar", "detokenizer")
PASS_STAGES = ("forward", "prefill")  # raised by the whole batch's pass (`Tripwire`)
STAGES = ROW_STAGES + PASS_STAGES


class InjectedFault(RuntimeError):
    """The failure a fault asked for."""


@dataclass(frozen=True)
class Fault:
    stage: str
    after: int = 0  # tokens the row generates before it fails

    def check(self, stage: str, generated: int) -> None:
        if self.due(stage, generated):
            raise InjectedFault(f"injected fault in the {stage} (a test asked for it)")

    def due(self, stage: str, generated: int) -> bool:
        return stage == self.stage and (stage == "prefill" or generated >= self.after)


def fault_of(user: str | None) -> Fault | None:
    """The fault a request's `user` asks for, when faults are enabled."""
    if not user or not user.startswith(PREFIX) or os.environ.get(ENVIRONMENT) != "1":
        return None
    stage, _, after = user[len(PREFIX) :].partition(":")
    if stage not in STAGES:
        return None
    return Fault(stage, int(after) if after.isdigit() else 0)


class Tripwire(nn.Module):
    """A layer's query projection that raises while `armed` names a stage: the pass fails with
    the layers before it already through, their KV written, as a real failure part-way would."""

    def __init__(self, projection: nn.Module):
        super().__init__()
        self.projection = projection
        self.armed: str | None = None

    def __call__(self, x):
        if self.armed is not None:
            raise InjectedFault(f"injected fault in the {self.armed} pass (a test asked for it)")
        return self.projection(x)


def tripwire(model) -> Tripwire:
    """The model's tripwire, put in its middle layer's attention on first use."""
    layers = model.model.layers if hasattr(model, "model") else model.layers
    attention = layers[len(layers) // 2].self_attn
    if not isinstance(attention.q_proj, Tripwire):
        attention.q_proj = Tripwire(attention.q_proj)
    return attention.q_proj
