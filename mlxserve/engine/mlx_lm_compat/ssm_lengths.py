"""Nemotron-H's Mamba layers made to stop at each row's own length in a batched prefill.

mlx-lm 0.32's `NemotronHMamba2Mixer._ssm` passes the batch's mask but not the cache's `lengths`
to `ssm_update`, as Granite 4's and Falcon-H1's mixers do: a prompt right-padded beside a
longer one runs its state on over the padding, and answers otherwise than alone (the family
matrix's batch test, tests/engine/test_family_matrix.py). `install()` hands the mixer's
`lengths` to `ssm_update` while its `_ssm` runs.
"""

from __future__ import annotations

from contextvars import ContextVar

from mlx_lm.models import nemotron_h

_mlx_lm_ssm = nemotron_h.NemotronHMamba2Mixer._ssm
_mlx_lm_ssm_update = nemotron_h.ssm_update
_lengths: ContextVar = ContextVar("ssm_lengths", default=None)


def _ssm(self, hidden_states, B, C, dt, cache, mask):
    token = _lengths.set(cache.lengths if cache else None)
    try:
        return _mlx_lm_ssm(self, hidden_states, B, C, dt, cache, mask)
    finally:
        _lengths.reset(token)


def _ssm_update(*args, lengths=None, **kwargs):
    if lengths is None:
        lengths = _lengths.get()
    return _mlx_lm_ssm_update(*args, lengths=lengths, **kwargs)


def install() -> None:
    """Swap the two into mlx-lm's nemotron_h module (idempotent)."""
    nemotron_h.NemotronHMamba2Mixer._ssm = _ssm
    nemotron_h.ssm_update = _ssm_update
