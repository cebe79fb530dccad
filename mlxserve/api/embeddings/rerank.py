"""POST /v1/rerank (and llama.cpp's /rerank, /reranking, /v1/reranking): a cross-encoder
scores each (query, document) pair; the results come best first, `top_n` of them. Jina's and
Cohere's body (`documents`, strings or `{"text"}` objects) and TEI's (`texts`, answered as
TEI's list)."""

from __future__ import annotations

import asyncio
import math
from typing import Any

from pydantic import Field, StrictBool, StrictInt
from quart import Blueprint
from quart_schema import document_request

from ...embedding.yes_no import pair_rows
from ..dispatch import ready_model
from ..errors import InvalidRequest
from ..parsing import read_json_object, validate
from ..schema_docs import documented
from .inputs import MAX_INPUTS
from .protocol import MAX_NAME, Fields
from .run import engine_vectors

blueprint = Blueprint("rerank", __name__)
MAX_INSTRUCTION = 4096  # characters


class RerankRequest(Fields):
    model_config = {
        "extra": "allow",
        "json_schema_extra": documented(
            {"query": "what is a panda?", "documents": ["hi", "The giant panda is a bear."]},
            {"query": "q", "texts": ["a", "b"], "return_text": True},
        ),
    }
    model: str | None = Field(None, max_length=MAX_NAME)
    query: str = Field(..., min_length=1)
    documents: list[str | dict[str, Any]] | None = None
    texts: list[str] | None = Field(None, description="TEI's name for the documents")
    top_n: StrictInt | None = Field(None, ge=1, description="the best N (default: all)")
    return_documents: StrictBool = False
    return_text: StrictBool = Field(False, description="TEI: each result with its text")
    raw_scores: StrictBool = Field(False, description="TEI: the logit, not its sigmoid")
    instruction: str | None = Field(
        None,
        min_length=1,
        max_length=MAX_INSTRUCTION,
        description="a language-model reranker's task (Qwen3-Reranker's Instruct; ours)",
    )


@blueprint.post("/v1/rerank")
@blueprint.post("/rerank")
@blueprint.post("/v1/reranking")
@blueprint.post("/reranking")
@document_request(RerankRequest)
async def rerank():
    body = validate(RerankRequest, await read_json_object())
    tei = body.documents is None and body.texts is not None
    documents = _texts(body)
    engine, loaded = await ready_model(body.model, kind="rerank")
    if loaded.judges_pairs:
        rows = await asyncio.to_thread(
            _judged_pairs, loaded, body.query, documents, body.instruction
        )
        seconds = None
    elif body.instruction is not None:
        raise InvalidRequest(
            f"'instruction' is for rerankers that are language models; {loaded.model_id} is a "
            "cross-encoder",
            param="instruction",
        )
    else:
        rows, seconds = await asyncio.to_thread(_pairs, loaded, body.query, documents)
    logits = await engine_vectors(engine, rows, seconds)
    raw = [float(v) for v in logits[:, 0]]
    scores = raw if tei and body.raw_scores else [_sigmoid(v) for v in raw]
    order = sorted(range(len(documents)), key=lambda i: -scores[i])[: body.top_n]
    if tei:
        return [
            {"index": i, "score": scores[i]} | ({"text": documents[i]} if body.return_text else {})
            for i in order
        ]
    tokens = sum(map(len, rows))
    return {
        "model": loaded.model_id,
        "object": "list",
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        "results": [
            {"index": i, "relevance_score": scores[i]}
            | ({"document": {"text": documents[i]}} if body.return_documents else {})
            for i in order
        ],
    }


def _texts(body: RerankRequest) -> list[str]:
    given = body.documents if body.documents is not None else body.texts
    param = "documents" if body.documents is not None or body.texts is None else "texts"
    if not given:
        raise InvalidRequest(f"'{param}' must be a non-empty list of texts", param=param)
    if len(given) > MAX_INPUTS:
        raise InvalidRequest(f"'{param}' has {len(given)} texts; at most {MAX_INPUTS}", param=param)
    texts = []
    for index, item in enumerate(given):
        text = item.get("text") if isinstance(item, dict) else item
        if not isinstance(text, str) or not text:
            raise InvalidRequest(
                f"'{param}[{index}]' must be a non-empty string (or an object with one in 'text')",
                param=param,
            )
        texts.append(text)
    return texts


def _pairs(loaded, query: str, documents: list[str]) -> tuple[list[list[int]], list[int]]:
    """Each (query, document) as the model reads a pair, the document cut to fit; and where
    each row's document starts."""
    hf = loaded.tokenizer._tokenizer
    limit = loaded.context_length
    if len(hf.encode(query)) + 2 > limit:
        raise _query_too_long(loaded)
    rows, seconds = [], []
    for document in documents:
        encoding = hf(query, document, truncation="only_second", max_length=limit)
        ids = list(encoding["input_ids"])
        sequence = encoding.sequence_ids()
        rows.append(ids)
        seconds.append(sequence.index(1) if 1 in sequence else len(ids))
    return rows, seconds


def _judged_pairs(
    loaded, query: str, documents: list[str], instruction: str | None
) -> list[list[int]]:
    """Each pair written into a language-model reranker's prompt (yes_no.py), the document cut
    to fit."""
    hf, limit = loaded.tokenizer._tokenizer, loaded.context_length
    rows = pair_rows(hf, query, documents, limit, instruction)
    if rows is None:
        raise _query_too_long(loaded)
    return rows


def _query_too_long(loaded) -> InvalidRequest:
    return InvalidRequest(
        f"'query' is too long: {loaded.model_id} reads at most {loaded.context_length} tokens "
        "a pair",
        param="query",
        code="context_length_exceeded",
    )


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x)) if x >= 0 else math.exp(x) / (1 + math.exp(x))
