"""Data for the demo code model: the interpreter's own standard library and, where
scripts/demo_corpus.py has written it, permissively licensed packages from PyPI; split by file.

Shared by finetune_demo_model.py and eval_demo_model.py so both see the same split and tokens.
The Python standard library is PSF-licensed text present on every machine with Python; the
card's held-out infills come from it alone, so its split never depends on the packages.
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
DEFAULT_CORPUS = Path(__file__).resolve().parent.parent / "build" / "demo-corpus"


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

    @property
    def chat_source(self) -> bool:
        """One file in four, by hash: where a package's docstrings become chat turns."""
        return self._hash_byte(2) % 4 == 0

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


def corpus_root() -> Path:
    """demo_corpus.py's folder, or DEMO_CORPUS: a copy carried to another machine."""
    return Path(os.environ.get("DEMO_CORPUS") or DEFAULT_CORPUS)


def corpus_files(root: Path | None = None) -> list[SourceFile]:
    """The packages' files, named `package/path in its wheel` (their own split by that name)."""
    root = root or corpus_root()
    if not root.is_dir():
        return []
    return [
        SourceFile(str(path.relative_to(root)), path.read_text(encoding="utf-8"))
        for path in sorted(root.rglob("*.py"))
    ]


def split(files: list[SourceFile]) -> tuple[list[SourceFile], list[SourceFile]]:
    return [f for f in files if not f.held_out], [f for f in files if f.held_out]


def split_files() -> tuple[list[SourceFile], list[SourceFile]]:
    """The standard library's training and held-out files."""
    return split(stdlib_files())


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


def token_stream(files: list[SourceFile], encode, file_sep: int, encode_many=None) -> np.ndarray:
    """All files' tokens, each file preceded by <file_sep>, as one int32 array. `encode_many`
    (texts -> ids per text), where given, encodes them all at once: a fast tokenizer's batch
    call spreads them over the cores."""
    texts = [f.text for f in files]
    encoded = encode_many(texts) if encode_many else map(encode, texts)
    pieces = []
    for ids in encoded:
        pieces.append([file_sep])
        pieces.append(ids)
    return np.fromiter((t for piece in pieces for t in piece), dtype=np.int32)
