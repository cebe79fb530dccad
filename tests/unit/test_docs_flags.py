"""Every `--flag` the user docs name is one `mlxserve serve` takes (docs/api.md once named a
--ctx-size it never had), but for the few that belong to other programs, named here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mlxserve.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
OTHER_PROGRAMS = {
    "--spm-infill": "llama.cpp's llama-server",
    "--props": "llama.cpp's llama-server",
    "--analytics-disable": "aider",
    "--no-check-update": "aider",
    "--backend": "mlx.launch and mlx.distributed_config",
}


def serve_flags() -> set[str]:
    parser = build_parser()
    serve = parser._subparsers._group_actions[0].choices["serve"]
    return {flag for action in serve._actions for flag in action.option_strings}


@pytest.mark.parametrize("doc", ["README.md", "docs/api.md"])
def test_every_flag_the_docs_name_is_one_serve_takes(doc):
    named = set(re.findall(r"`(--[a-z][a-z0-9-]*)", (ROOT / doc).read_text()))
    unknown = sorted(named - serve_flags() - OTHER_PROGRAMS.keys())
    assert not unknown, f"{doc} names flags `mlxserve serve` does not take: {unknown}"
