"""POST /v1/embeddings: OpenAI's embeddings (also llama.cpp's and vLLM's OpenAI route), every
vector of length 1 as OpenAI's are; `encoding_format: base64` as the openai client asks."""

from __future__ import annotations

from quart import Blueprint
from quart_schema import document_request

from ..embeddings.protocol import EmbeddingRequest
from ..embeddings.run import embed, json_response
from ..embeddings.vectors import cut, encoded, normalised
from ..parsing import read_json_object, validate

blueprint = Blueprint("openai_embeddings", __name__)


@blueprint.post("/v1/embeddings")
@document_request(EmbeddingRequest)
async def create_embeddings():
    body = validate(EmbeddingRequest, await read_json_object())
    done = await embed(body.model, body.input, prompt_name=body.prompt_name)
    vectors = cut(normalised(done.vectors), body.dimensions, done.loaded)
    return await json_response(
        lambda: {
            "object": "list",
            "data": [
                {"object": "embedding", "index": i, "embedding": encoded(v, body.encoding_format)}
                for i, v in enumerate(vectors)
            ],
            "model": done.loaded.model_id,
            "usage": {"prompt_tokens": done.tokens, "total_tokens": done.tokens},
        }
    )
