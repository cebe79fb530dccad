"""A skip for want of what the project's own files install fails under .ci/run; every skip
says why in the summary."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
from tests.helpers import skip_for_missing

def test_needs_a_package():
    skip_for_missing("frobnicator is not installed (apt-get install frobnicator)")
"""


def run_probe(tmp_path: Path, ci: bool) -> subprocess.CompletedProcess:
    probe = tmp_path / "test_probe.py"
    probe.write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if k != "MLXSERVE_CI"}
    if ci:
        env["MLXSERVE_CI"] = "1"
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        # The project's configuration (its -rs), this probe alone.
        [sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), str(probe)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_outside_ci_it_skips_and_says_why(tmp_path):
    run = run_probe(tmp_path, ci=False)
    assert run.returncode == 0, run.stdout
    assert "1 skipped" in run.stdout
    assert "SKIPPED [1]" in run.stdout and "frobnicator is not installed" in run.stdout


def test_under_ci_it_fails(tmp_path):
    run = run_probe(tmp_path, ci=True)
    assert run.returncode == 1, run.stdout
    assert "1 failed" in run.stdout and ".ci/run installs it" in run.stdout
