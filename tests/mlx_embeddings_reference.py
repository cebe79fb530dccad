"""mlx-embeddings' own model files (the MLX field's embedding library), as the reference the
encoders' tests compare with. Read by path, as a package of their own: mlx-embeddings' package
imports mlx-vlm, which the tests do not install (`make install-dev` installs mlx-embeddings
without its dependencies)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from pathlib import Path

import pytest

PACKAGE = "_mlx_embeddings_models"


def model_module(name: str):
    """mlx-embeddings' `models/<name>.py`, or a skip saying it is not installed."""
    spec = importlib.util.find_spec("mlx_embeddings")
    if spec is None or spec.origin is None:
        pytest.skip("mlx-embeddings is not installed (make install-dev installs it)")
    if PACKAGE not in sys.modules:
        package = types.ModuleType(PACKAGE)
        package.__path__ = [str(Path(spec.origin).parent / "models")]
        sys.modules[PACKAGE] = package
    return importlib.import_module(f"{PACKAGE}.{name}")
