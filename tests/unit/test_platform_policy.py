"""One policy decides every CPU-only path; MLXSERVE_PORTABLE=1 turns them all off."""

from __future__ import annotations

import os
import subprocess
import sys

import mlx.core as mx
import mlx.nn as nn
import mlx_lm
import pytest

from mlxserve.platform import PORTABLE_ENV, cpu_environment, current_policy, portable
from mlxserve.platform.blas import reexec_for_cpu


def test_portable_mode_turns_every_cpu_path_off(monkeypatch):
    monkeypatch.setenv(PORTABLE_ENV, "1")
    assert portable()
    policy = current_policy()
    assert not policy.cpu_tricks and policy.prompt_pass_tokens is None
    from mlx_lm.models.base import scaled_dot_product_attention

    assert policy.attention() is scaled_dot_product_attention
    assert policy.matmul_rows() is None


def test_the_cpu_pads_matmul_rows_to_whole_blocks():
    """Up to the next multiple of 16 rows, unless at most 7 spill over one (or it is one)."""
    from mlxserve.platform.matmul_rows import padded_rows

    assert [padded_rows(n) for n in (1, 7, 8, 12, 16, 17, 23, 24, 32, 40)] == [
        1, 7, 16, 16, 16, 17, 23, 32, 32, 48
    ]  # fmt: skip


@pytest.mark.parametrize("value", ["", "0"])
def test_unset_or_zero_is_not_portable(monkeypatch, value):
    monkeypatch.setenv(PORTABLE_ENV, value)
    assert not portable()
    assert current_policy().cpu_tricks == (mx.default_device() == mx.cpu)


def test_portable_mode_keeps_quantized_weights(tiny_model, monkeypatch):
    monkeypatch.setenv(PORTABLE_ENV, "1")
    model, _ = mlx_lm.load(str(tiny_model))
    nn.quantize(model, group_size=32, bits=4)
    current_policy().prepare_model(model)
    assert any(isinstance(m, nn.QuantizedLinear) for _, m in model.named_modules())


def test_portable_mode_does_not_re_execute(monkeypatch):
    """A child that would re-execute itself under OpenBLAS stays the same process."""
    script = (
        "import os; from mlxserve.platform.blas import reexec_for_cpu; reexec_for_cpu(); "
        "print(os.environ.get('LD_PRELOAD', ''), os.environ.get('GLIBC_TUNABLES', ''))"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "GLIBC_TUNABLES")}
    env[PORTABLE_ENV] = "1"
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""
    assert reexec_for_cpu is not None and cpu_environment(env) is not None
