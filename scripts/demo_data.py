"""Data for the demo code model: the interpreter's own standard library, split by file.

Shared by finetune_demo_model.py and eval_demo_model.py so both see the same split and tokens.
The Python standard library is PSF-licensed text present on every machine with Python.
"""

from __future__ import annotations

import ast
import hashlib
import os
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE, FILE_SEP = (
    "<fim_prefix>",
    "<fim_suffix>",
    "<fim_middle>",
    "<file_sep>",
)
EOS = "<|endoftext|>"
SPECIAL_TOKENS = [FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE, FILE_SEP]
MAX_FILE_BYTES = 200_000  # skips generated tables (pydoc topics, unicode data)
HELD_OUT_EVERY = 10  # one file in ten, chosen by a hash of its path


@dataclass(frozen=True)
class SourceFile:
    name: str  # path relative to the stdlib root
    text: str

    @property
    def held_out(self) -> bool:
        return self._hash_byte(0) % HELD_OUT_EVERY == 0

    @property
    def is_test(self) -> bool:
        """A test suite's file (test/, tests/, idle_test/, test_*.py)."""
        return any(
            part in ("test", "tests", "idle_test") or part.startswith("test_")
            for part in self.name.split("/")
        )

    def kept_for_training(self, test_share: float) -> bool:
        """Non-test files always; a fixed, hash-chosen `test_share` of the test files."""
        return not self.is_test or self._hash_byte(1) < 256 * test_share

    def _hash_byte(self, index: int) -> int:
        return hashlib.sha1(self.name.encode()).digest()[index]


def stdlib_root() -> Path:
    """This interpreter's standard library, or DEMO_STDLIB: a copy of another interpreter's, so a
    machine with another Python (a lent GPU's) trains on the same files."""
    return Path(os.environ.get("DEMO_STDLIB") or sysconfig.get_paths()["stdlib"])


def stdlib_files() -> list[SourceFile]:
    root = stdlib_root()
    files = []
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts or path.stat().st_size > MAX_FILE_BYTES:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        if text.strip():
            files.append(SourceFile(str(path.relative_to(root)), text))
    return files


def split_files() -> tuple[list[SourceFile], list[SourceFile]]:
    files = stdlib_files()
    return [f for f in files if not f.held_out], [f for f in files if f.held_out]


def functions(files: list[SourceFile]) -> Iterator[tuple[SourceFile, list[str], ast.AST]]:
    """(file, its lines, node) for every function of the files that parse."""
    for f in files:
        try:
            tree = ast.parse(f.text)
        except SyntaxError:
            continue
        lines = f.text.split("\n")
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno:
                yield f, lines, node


def token_stream(files: list[SourceFile], encode, file_sep: int) -> np.ndarray:
    """All files' tokens, each file preceded by <file_sep>, as one int32 array."""
    pieces = []
    for f in files:
        pieces.append([file_sep])
        pieces.append(encode(f.text))
    return np.fromiter((t for piece in pieces for t in piece), dtype=np.int32)
