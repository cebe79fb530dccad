"""llama.cpp's POST /tokenize and POST /detokenize, which llama.vscode calls to measure its
context and chat UIs to count tokens: the served model's tokenizer, nothing generated."""

from __future__ import annotations

import asyncio
from typing import Any

from quart import Blueprint
from quart_schema import document_request
from transformers.convert_slow_tokenizer import bytes_to_unicode

from ..dispatch import ready_model
from ..errors import InvalidRequest
from ..parsing import read_json_object, validate
from .protocol import DetokenizeRequest, TokenizeRequest

blueprint = Blueprint("llamacpp_tokens", __name__)
BYTE_OF_SYMBOL = {symbol: byte for byte, symbol in bytes_to_unicode().items()}


@blueprint.post("/tokenize")
@document_request(TokenizeRequest)
async def tokenize():
    body = validate(TokenizeRequest, await read_json_object())
    _, loaded = await ready_model(body.model, kind=None)
    return await asyncio.to_thread(tokenized, loaded.tokenizer, body)


@blueprint.post("/detokenize")
@document_request(DetokenizeRequest)
async def detokenize():
    body = validate(DetokenizeRequest, await read_json_object())
    _, loaded = await ready_model(body.model, kind=None)
    outside = [t for t in body.tokens if not 0 <= t < loaded.vocab_size]
    if outside:
        raise InvalidRequest(
            f"Token id {outside[0]} is outside the vocabulary (0 to {loaded.vocab_size - 1}).",
            param="tokens",
        )
    text = loaded.tokenizer.decode(body.tokens, skip_special_tokens=False)
    return {"content": text}


def tokenized(tokenizer, body: TokenizeRequest) -> dict[str, Any]:
    """`{"tokens": ids}`, or with pieces `{"tokens": [{"id", "piece"}]}`: a piece is its text,
    or its bytes as numbers where they are not whole UTF-8 (part of a character)."""
    hf = tokenizer._tokenizer
    ids = hf.encode(
        body.content,
        add_special_tokens=body.add_special,
        split_special_tokens=not body.parse_special,
    )
    if not body.with_pieces:
        return {"tokens": ids}
    return {"tokens": [{"id": t, "piece": piece(hf, t)} for t in ids]}


def piece(hf_tokenizer, token: int) -> str | list[int]:
    raw = token_bytes(hf_tokenizer, token)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)


def token_bytes(hf_tokenizer, token: int) -> bytes:
    """One token's bytes: a byte-level BPE's symbols mapped back to bytes; SentencePiece's `▁`
    as a space and `<0xNN>` as that byte; added tokens as their text."""
    symbol = hf_tokenizer.convert_ids_to_tokens(token)
    if symbol in hf_tokenizer.get_added_vocab():
        return symbol.encode()
    if "ByteLevel" in str(hf_tokenizer.backend_tokenizer.decoder):
        decoder = BYTE_OF_SYMBOL
        return bytes(decoder[c] for c in symbol if c in decoder)
    if len(symbol) == 6 and symbol.startswith("<0x") and symbol.endswith(">"):
        return bytes([int(symbol[3:5], 16)])
    return symbol.replace("▁", " ").encode()
