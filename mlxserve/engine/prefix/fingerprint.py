"""A model's fingerprint: what the KV of a token sequence depends on, so that a prefix kept on
disk is only ever read back by the same weights run the same way."""

from __future__ import annotations

import hashlib
from pathlib import Path

FINGERPRINT_BLOCKS = 16  # blocks sampled across each weight file
FINGERPRINT_BLOCK_BYTES = 64 << 10


def model_fingerprint(folder: Path, how_it_runs: str) -> str | None:
    """What the KV of a token sequence depends on: the config, the weights (each file's size and
    blocks sampled across it: hashing gigabytes would slow every start), and how the platform
    runs them (`how_it_runs`: weights converted or not). None where there is no folder to read."""
    digest = hashlib.sha256(how_it_runs.encode())
    try:
        digest.update((folder / "config.json").read_bytes())
        weights = sorted(folder.glob("*.safetensors"))
        for path in weights:
            size = path.stat().st_size
            digest.update(f"{path.name}:{size}".encode())
            with path.open("rb") as file:
                for i in range(FINGERPRINT_BLOCKS):
                    file.seek(size * i // FINGERPRINT_BLOCKS)
                    digest.update(file.read(FINGERPRINT_BLOCK_BYTES))
    except OSError:
        return None
    return digest.hexdigest() if weights else None
