"""A module given another `__call__` in place: its instance's class becomes a subclass of its
own whose `__call__` is the one given, so the module tree, its names and its arrays stay as they
are (mlx's Module dispatches calls through the class). The pipeline's stages and the vision
tower's recorded blocks are made so."""

from __future__ import annotations

from collections.abc import Callable


def with_call(module, role: str, call: Callable) -> None:
    """`module`'s class made `{role}{its class's name}`, a subclass whose `__call__` is `call`
    (which reaches the original through `super(type(self), self)`, or a closure)."""
    base = type(module)
    attributes = {"__call__": call, "__module__": base.__module__}
    module.__class__ = type(f"{role}{base.__name__}", (base,), attributes)
