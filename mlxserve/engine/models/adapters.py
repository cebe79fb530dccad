"""LoRA adapters served as models of their own, on their base model's weights.

An adapter (mlx-lm's format: adapter_config.json and adapters.safetensors, as `mlx_lm.lora`
writes them) gets a copy of its base's module tree whose arrays are the base's own: only the
adapter's small matrices take new memory. Its engine has its own batch and prefix cache (its
KV differs from the base's).
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import mlx.nn as nn

from .host import LoadedModel, weight_bytes
from .sources import ModelLoadError, check_adapter_folder


def shared_copy(value: Any) -> Any:
    """`value` with every module copied and every array shared: a module tree that can be
    changed (layers replaced) without touching the original or its memory."""
    if isinstance(value, nn.Module):
        clone = copy.copy(value)
        for key, child in value.items():
            clone[key] = shared_copy(child)
        return clone
    if isinstance(value, list):
        return [shared_copy(item) for item in value]
    if isinstance(value, tuple):
        return tuple(shared_copy(item) for item in value)
    if isinstance(value, dict):
        return {key: shared_copy(item) for key, item in value.items()}
    return value


def load_adapter(base: LoadedModel | None, adapter_path: str, name: str) -> LoadedModel:
    """The model `base` with the adapter at `adapter_path` applied, sharing `base`'s weights."""
    import mlx.core as mx
    from mlx_lm.tuner.utils import load_adapters

    if base is None:
        raise ModelLoadError(f"adapter {name}: its base model is not loaded")
    check_adapter_folder(adapter_path)
    model = shared_copy(base.model)
    try:
        load_adapters(model, str(Path(adapter_path).expanduser()))
    except Exception as error:  # mlx-lm's KeyError, ValueError, ... in one line
        raise ModelLoadError(
            f"adapter {name} does not fit its base model {base.model_id}: "
            f"{str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__}"
        ) from error
    model.eval()
    mx.eval(model.parameters())
    return dataclasses.replace(
        base,
        model_id=name,
        path=str(adapter_path),
        model=model,
        weights_folder=None,  # its KV is not the base's: no shared files on disk either
        how_it_runs=f"{base.how_it_runs}, LoRA adapter {Path(adapter_path).name}",
        weight_bytes=weight_bytes(model, besides=base.model),
        base_model=base.model_id,
        _grammars=None,
        _token_texts=None,
    )
