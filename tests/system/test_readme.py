"""The README's Python example, run as a user copies it, prints what the README says it prints."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from mlxserve.settings import DEFAULT_MODEL

README = Path(__file__).resolve().parents[2] / "README.md"


def fenced_after(text: str, marker: str) -> str:
    """The first fenced block after `marker`."""
    start = text.index(marker)
    match = re.compile(r"```[a-z]*\n(.*?)```", re.S).search(text, start)
    assert match is not None, marker
    return match.group(1)


def test_the_python_example_prints_what_the_readme_shows(live_server):
    readme = README.read_text()
    example = fenced_after(readme, "The official `openai` client works as is:")
    printed = fenced_after(readme, "On the demo model it prints")
    live = live_server(DEFAULT_MODEL)
    assert "http://127.0.0.1:8080/v1" in example
    script = example.replace("http://127.0.0.1:8080/v1", live.url + "/v1")
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout == printed
