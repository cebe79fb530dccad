"""The process settings `mlxserve serve` re-executes itself under on Linux."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from mlxserve.platform.blas import HUGE_PAGES_TUNABLE, cpu_environment, openblas_library

from ..helpers import skip_for_missing

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="macOS runs as started")


def test_huge_pages_are_asked_for_and_the_users_tunables_kept():
    assert cpu_environment({})["GLIBC_TUNABLES"] == HUGE_PAGES_TUNABLE
    mine = {"GLIBC_TUNABLES": "glibc.malloc.arena_max=4"}
    assert (
        cpu_environment(mine)["GLIBC_TUNABLES"] == f"glibc.malloc.arena_max=4:{HUGE_PAGES_TUNABLE}"
    )
    theirs = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}
    assert cpu_environment(theirs)["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=0"
    assert "GLIBC_TUNABLES" not in cpu_environment({"MLXSERVE_NO_HUGE_PAGES": "1"})


def test_once_set_nothing_changes_so_the_process_re_executes_once():
    once = cpu_environment({"PATH": "/bin"})
    assert cpu_environment(once) == once


def test_openblas_is_preloaded_before_the_users_preloads():
    if openblas_library() is None:
        skip_for_missing("no OpenBLAS on this machine (apt-get install libopenblas0-pthread)")
    env = cpu_environment({"LD_PRELOAD": "/x/mine.so"})
    assert env["LD_PRELOAD"] == f"{openblas_library()}:/x/mine.so"


FLUSHED = """
import platform
import numpy as np
from mlxserve.platform.blas import flush_denormals
tiny = np.float32(1e-38)
assert tiny * np.float32(0.5) > 0  # a denormal, before
assert flush_denormals() == (platform.machine() == "x86_64")
import mlx.core as mx
a = mx.full((64, 64), 1e-38)
print(float(tiny * np.float32(0.5)), (a * 0.5)[0, 0].item(), (a @ a)[0, 0].item())
"""


@pytest.mark.parametrize("preload", [False, True], ids=["plain", "under cpu_environment"])
def test_denormals_flush_to_zero_in_numpy_mlx_and_its_blas(preload):
    env = cpu_environment(os.environ) if preload else dict(os.environ)
    out = subprocess.run(
        [sys.executable, "-c", FLUSHED], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    if platform.machine() == "x86_64":
        assert out == ["0.0", "0.0", "0.0"]
