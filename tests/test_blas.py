"""The process settings `mlxserve serve` re-executes itself under on Linux."""

from __future__ import annotations

import sys

import pytest

from mlxserve.blas import HUGE_PAGES_TUNABLE, cpu_environment, openblas_library

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


@pytest.mark.skipif(openblas_library() is None, reason="no OpenBLAS on this machine")
def test_openblas_is_preloaded_before_the_users_preloads():
    env = cpu_environment({"LD_PRELOAD": "/x/mine.so"})
    assert env["LD_PRELOAD"] == f"{openblas_library()}:/x/mine.so"
