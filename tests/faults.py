"""Faults on purpose, injected from the tests' side, so that a row failing inside the engine's
step can be tested end to end. Production code holds no hook for them: `install` wraps the
engine's own functions from outside, and only a `FaultyRequest` (a GenerationRequest with a
`fault`) is made to fail. Over HTTP, once installed, a body whose `user` is
`mlxserve-fault:STAGE[:TOKENS]` is planned as FaultyRequests failing in STAGE after generating
TOKENS tokens; without `install`, such a `user` is only a label.

Stages: `sampler`, `grammar`, `detokenizer` (the row's own code), `forward` (the decode pass of
a batch holding the row raises half-way through the model's layers, after some layers wrote
their KV) and `prefill` (so does any pass carrying the row's prompt).

`python -m tests.faults serve ...` is `mlxserve serve --engine-in-process ...` with them installed
(the server of `scripts/soak.py --fault-rate`)."""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable
from dataclasses import dataclass, fields

import mlx.nn as nn

from mlxserve.api import dispatch
from mlxserve.engine import Engine
from mlxserve.engine.failures.row_guard import RowGuard
from mlxserve.engine.mlx_lm_compat import ServerBatchGenerator
from mlxserve.engine.requests import GenerationRequest
from mlxserve.engine.sequences import starting
from mlxserve.engine.sequences.state import SamplingSetup, SequenceState

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


@dataclass(frozen=True, kw_only=True)
class FaultyRequest(GenerationRequest):
    """A sequence made to fail; `dataclasses.replace` keeps it one."""

    fault: Fault


def with_fault(request: GenerationRequest, fault: Fault) -> FaultyRequest:
    values = {f.name: getattr(request, f.name) for f in fields(GenerationRequest)}
    return FaultyRequest(**values, fault=fault)


def fault_of(request: GenerationRequest) -> Fault | None:
    return getattr(request, "fault", None)


def fault_in_label(user: str | None) -> Fault | None:
    """The fault a request's `user` asks for (`mlxserve-fault:STAGE[:TOKENS]`), if any."""
    if not user or not user.startswith(PREFIX):
        return None
    stage, _, after = user[len(PREFIX) :].partition(":")
    if stage not in STAGES:
        return None
    return Fault(stage, int(after) if after.isdigit() else 0)


# ---- a row's own code: its sampler, its logits processors, its detokenizing -----------------


class Tripping:
    """A row's sampler or logits processor that raises in `stage` once `fault` is due, counting
    the tokens its `guard` saw sampled. It has no `group_key` and is no `Ban`, so the row draws
    and bans alone: the failure stays its own."""

    def __init__(self, call: Callable, stage: str, fault: Fault, guard: RowGuard):
        self.call = call
        self.stage = stage
        self.fault = fault
        self.guard = guard

    @property
    def needs_logprobs(self) -> bool:
        return getattr(self.call, "needs_logprobs", True)

    def __call__(self, *args):
        self.fault.check(self.stage, self.guard.steps)
        return self.call(*args)


def _tripping_setup(sampling_setup: Callable) -> Callable:
    """`sampling_setup` whose faulty rows have their sampler and processors `Tripping`, inside
    the guards production puts around them."""

    def tripping_setup(request: GenerationRequest, loaded) -> SamplingSetup:
        setup = sampling_setup(request, loaded)
        fault = fault_of(request)
        if fault is not None:
            guard = setup.guard
            for processor in setup.processors:
                processor.process = Tripping(processor.process, processor.stage, fault, guard)
            sampler = setup.guarded_sampler
            sampler.sample = Tripping(sampler.sample, "sampler", fault, guard)
        return setup

    return tripping_setup


def _failing_detokenizer(advance: Callable) -> Callable:
    def advance_or_fail(seq: SequenceState, response, row):
        fault = fault_of(seq.request)
        if fault is not None:
            fault.check("detokenizer", seq.generated)
        return advance(seq, response, row)

    return advance_or_fail


# ---- the batch's passes -------------------------------------------------------------------


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


class PassFaults:
    """One generator's passes armed: the decode pass raises when it holds a row of
    `due["forward"]` or carries a prompt of `due["prefill"]`; a prompt pass when it holds one of
    `due["prefill"]`, or a join's pass one of either. Only inside `next()` (`stepping`), where
    the engine recovers from a failed pass."""

    def __init__(self, generator: ServerBatchGenerator, wire: Tripwire):
        self._generator = weakref.ref(generator)
        self.wire = wire
        self.due: dict[str, set[int]] = {stage: set() for stage in PASS_STAGES}
        self.stepping = False
        self.joining: list[int] = []  # prompts moving to the decode batch in this step
        decode, prompts = generator.decode_batch, generator._prompt_batch
        decode.model = self._armed(decode.model, self._decode_stage)
        prompts.model = self._armed(prompts.model, self._prompt_stage)
        if generator.mixed is not None:  # a kept chunk run alone
            generator.mixed.flush = self._armed(generator.mixed.flush, self._prompt_stage)
        prompts.split = self._noting_joins(prompts.split)

    def _decode_stage(self) -> str | None:
        generator = self._generator()
        if self.due["forward"] & set(generator.decode_batch.uids):
            return "forward"
        carried = generator.mixed is not None and generator.mixed.pending is not None
        return "prefill" if carried and self._prompt_stage() else None

    def _prompt_stage(self) -> str | None:
        rows = {*self._generator()._prompt_batch.uids, *self.joining}
        if self.due["prefill"] & rows:
            return "prefill"
        # a decode row back from a failed step computes its next token in a join's pass
        return "forward" if self.due["forward"] & set(self.joining) else None

    def _noting_joins(self, split: Callable) -> Callable:
        """The prompt batch's `split` (which mlx-lm calls only to move prompts to the decode
        batch), noting the rows whose last token the join's pass computes."""

        def noting_split(indices):
            moving = split(indices)
            self.joining = list(moving.uids)
            return moving

        return noting_split

    def _armed(self, forward: Callable, stage_due: Callable[[], str | None]) -> Callable:
        def armed(*args, **kwargs):
            self.wire.armed = stage_due() if self.stepping else None
            try:
                return forward(*args, **kwargs)
            finally:
                self.wire.armed = None

        return armed


_ARMED: weakref.WeakKeyDictionary[ServerBatchGenerator, PassFaults] = weakref.WeakKeyDictionary()


def _arming(step: Callable) -> Callable:
    """`Engine.step` that first arms the generator's passes for the rows whose pass fault is
    due (armed once the first such row runs; then kept up to date each step)."""

    def arming_step(engine: Engine) -> None:
        generator = engine.generator
        rows = [
            (seq, fault)
            for seq in engine.live.all()
            if (fault := fault_of(seq.request)) is not None and fault.stage in PASS_STAGES
        ]
        faults = _ARMED.get(generator)
        if faults is None and rows:
            wire = tripwire(engine.slot.loaded.model)
            faults = _ARMED[generator] = PassFaults(generator, wire)
        if faults is not None:
            faults.due = {stage: set() for stage in PASS_STAGES}
            for seq, fault in rows:
                if fault.due(fault.stage, seq.generated):
                    faults.due[fault.stage].add(seq.uid)
        return step(engine)

    return arming_step


def _stepping(next_step: Callable) -> Callable:
    """The generator's `_next`, its passes armed while it runs."""

    def stepping_next(generator: ServerBatchGenerator):
        faults = _ARMED.get(generator)
        if faults is None:
            return next_step(generator)
        faults.stepping, faults.joining = True, []
        try:
            return next_step(generator)
        finally:
            faults.stepping = False

    return stepping_next


# ---- over HTTP, and installing it all -----------------------------------------------------


def _planning_faults(make_plan: Callable) -> Callable:
    """`make_plan` (as api/dispatch.py calls it) whose sequences fail as the request's `user`
    asks."""

    def make_faulty_plan(body, *args, **kwargs):
        plan = make_plan(body, *args, **kwargs)
        fault = fault_in_label(body.user)
        if fault is not None:
            plan.sequences = [with_fault(r, fault) for r in plan.sequences]
        return plan

    return make_faulty_plan


def install(set_attribute: Callable[[object, str, object], None] = setattr) -> None:
    """Wrap the engine's functions so that FaultyRequests fail: `set_attribute` is pytest's
    `monkeypatch.setattr` (undone after the test), or `setattr` for a server's whole life."""
    set_attribute(dispatch, "make_plan", _planning_faults(dispatch.make_plan))
    set_attribute(starting, "sampling_setup", _tripping_setup(starting.sampling_setup))
    set_attribute(SequenceState, "advance", _failing_detokenizer(SequenceState.advance))
    set_attribute(Engine, "step", _arming(Engine.step))
    set_attribute(ServerBatchGenerator, "_next", _stepping(ServerBatchGenerator._next))


if __name__ == "__main__":
    from mlxserve.cli import main

    install()
    # The faults ride on the requests' Python objects: the engine runs in this process.
    sys.argv.append("--engine-in-process")
    sys.exit(main())
