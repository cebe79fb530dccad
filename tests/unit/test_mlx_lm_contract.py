"""The mlx-lm internals engine/mlx_lm_compat relies on are where it expects them; when an upgrade
moves one, the check names it."""

from __future__ import annotations

import pytest
from mlx_lm.generate import GenerationBatch

from mlxserve.engine.mlx_lm_compat import MlxLmContractError, check_contract
from mlxserve.engine.mlx_lm_compat.contract import REQUIRED, missing


def test_the_installed_mlx_lm_has_every_internal_we_use():
    assert missing() == []
    check_contract()


def test_a_moved_method_is_named(monkeypatch):
    monkeypatch.delattr(GenerationBatch, "extend")
    with pytest.raises(MlxLmContractError, match=r"GenerationBatch\.extend \(mixed_batch\.py"):
        check_contract()


def test_a_moved_instance_attribute_is_named(monkeypatch):
    original = GenerationBatch.__init__

    def without_num_tokens(self, *args, **kwargs):
        original(self, *args, **kwargs)
        del self._num_tokens

    monkeypatch.setattr(GenerationBatch, "__init__", without_num_tokens)
    assert missing() == ["GenerationBatch._num_tokens (mixed_batch.py: rows at their last token)"]


def test_every_entry_says_who_uses_it():
    assert all(user for entries in REQUIRED.values() for _, user in entries)
