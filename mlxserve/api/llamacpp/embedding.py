"""llama.cpp's own POST /embedding and /embeddings: `content` (or `input`), one result per
input as `{"index", "embedding": [[...]]}`, normalised as `embd_normalize` says (Euclidean
unless asked otherwise). Its OpenAI route, /v1/embeddings, is openai/embeddings.py."""

from __future__ import annotations

import numpy as np
from quart import Blueprint
from quart_schema import document_request

from ..embeddings.protocol import NativeEmbeddingRequest
from ..embeddings.run import embed, json_response
from ..embeddings.vectors import normalised
from ..errors import InvalidRequest
from ..parsing import read_json_object, validate

blueprint = Blueprint("llamacpp_embedding", __name__)
INT16_SCALE = 32760.0  # llama.cpp's embd_normalize 0: the largest value scaled to this


@blueprint.post("/embedding")
@blueprint.post("/embeddings")
@document_request(NativeEmbeddingRequest)
async def embedding():
    body = validate(NativeEmbeddingRequest, await read_json_object())
    if body.content is not None:
        value, param = body.content, "content"
    elif body.input is not None:
        value, param = body.input, "input"
    else:
        raise InvalidRequest('"input" or "content" must be provided', param="content")
    per_token = body.pooling == "none"
    done = await embed(body.model, value, param=param, per_token=per_token)
    if per_token:  # as llama.cpp: each token's state as the model left it
        states = done.vectors
        return await json_response(
            lambda: [{"index": i, "embedding": v.tolist()} for i, v in enumerate(states)]
        )
    vectors = scaled(done.vectors, body.embd_normalize)
    return await json_response(
        lambda: [{"index": i, "embedding": [v.tolist()]} for i, v in enumerate(vectors)]
    )


def scaled(vectors: np.ndarray, norm: int) -> np.ndarray:
    """llama.cpp's `embd_normalize`: -1 none, 0 max absolute to the int16 range, else p-norm."""
    if norm < 0:
        return vectors
    if norm == 0:
        largest = np.abs(vectors).max(axis=-1, keepdims=True)
        return (vectors * INT16_SCALE / np.maximum(largest, 1e-12)).astype(np.float32)
    return normalised(vectors, float(norm))
