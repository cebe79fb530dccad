"""Which engine features a model's architecture rules out, and why: said once at load (the log,
`/props`, `/v1/models`), then read by the engine, never found out by a failing request."""

from __future__ import annotations

from ...families import mixed_batch_modules
from ...planning.model_facts import MIXED_BATCHES, ROW_ISOLATION
from ..mlx_lm_compat import mixed_batch
from ..mlx_lm_compat.cache_kinds import CacheLayout


def features_off_for(model, layout: CacheLayout) -> dict[str, str]:
    """Feature name -> why it is off for `model`, whose layers keep `layout`'s caches."""
    off: dict[str, str] = {}
    if not layout.positional:
        kinds = layout.describe()
        off[ROW_ISOLATION] = (
            f"a pass that fails ends every sequence in flight: its {kinds} caches cannot be "
            "put back as they were before the pass"
        )
    if not mixed_batch.supports(model):
        off[MIXED_BATCHES] = (
            "prompt chunks run in passes of their own beside the decode pass: the mixed pass "
            f"knows {', '.join(mixed_batch_modules())} layers only"
        )
    return off
