"""The engine's vectors as each door returns them: normalised (or not), cut to the first
`dimensions` (Matryoshka models), as lists of floats or base64 of little-endian float32."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

from ..errors import InvalidRequest


def normalised(vectors: np.ndarray, norm: float = 2.0) -> np.ndarray:
    """Each row over its p-norm (2: Euclidean, 1: taxicab); a zero row stays zero."""
    size = np.linalg.norm(vectors.astype(np.float64), ord=norm, axis=-1, keepdims=True)
    return (vectors / np.maximum(size, 1e-12)).astype(np.float32)


def cut(vectors: np.ndarray, dimensions: int | None, loaded) -> np.ndarray:
    """The first `dimensions` of each vector, normalised again (as OpenAI's text-embedding-3
    models), where the model is trained for it (its config says Matryoshka)."""
    if dimensions is None or dimensions == loaded.dimensions:
        return vectors
    if not loaded.matryoshka:
        raise InvalidRequest(
            f"{loaded.model_id} does not support 'dimensions': its config declares no "
            "Matryoshka representation, so its vectors cannot be shortened",
            param="dimensions",
        )
    if not 1 <= dimensions <= loaded.dimensions:
        raise InvalidRequest(
            f"'dimensions' must be between 1 and {loaded.dimensions} for {loaded.model_id}",
            param="dimensions",
        )
    return normalised(vectors[:, :dimensions])


def encoded(vector: np.ndarray, encoding_format: str) -> Any:
    if encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.astype(np.float32).tolist()
