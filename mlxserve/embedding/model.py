"""An embedding model loaded and ready: right-padded batches of token ids in, one pooled
vector a row out. Encoders (encoders/) read the whole row; decoders (any mlx-lm model,
Qwen3-Embedding's kind) are causal, so a row's right padding never reaches its tokens."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from ..registry import read_json as _read_json
from . import encoders
from .kinds import DECODER, ENCODER, RERANKER, YES_NO, embedding_architecture
from .pooling import Pooling
from .yes_no import ANSWERS


class NotAnEmbeddingModel(ValueError):
    """The folder's model is not one this server embeds with (the message says why)."""


@dataclass
class EncoderPass:
    """An encoder's batch part way through its layers (run over several engine turns)."""

    x: mx.array  # the next layer's input
    masks: Any  # what the encoder's layers read besides x (the padding's additive masks)
    lengths: mx.array  # each row's tokens
    done: int = 0  # layers run so far


@dataclass
class EmbeddingModel:
    network: nn.Module
    architecture: str
    pooling: Pooling
    dimensions: int
    max_tokens: int  # the most tokens an input may have (its sentence-transformers limit)
    pad_id: int = 0
    prompts: dict[str, str] = field(default_factory=dict)  # instruction prefixes by name
    default_prompt: str | None = None  # the prompt applied unless an input names another
    answer_ids: tuple[int, int] | None = None  # a yes-no reranker's "yes" and "no" tokens

    @property
    def kind(self) -> str:
        """What the pool serves it for: "rerank" (a score a pair) or "embed"."""
        return "rerank" if self.architecture in (RERANKER, YES_NO) else "embed"

    @property
    def layers(self) -> int:
        """An encoder's layers, which a batch may go through a few at a time (`begin`,
        `advance`, `finish`); 0 for a decoder, whose batch runs whole."""
        return len(self._encoder().blocks) if self.architecture in (ENCODER, RERANKER) else 0

    def begin(self, rows: list[list[int]], seconds: list[int] | None = None) -> EncoderPass:
        """An encoder's batch of right-padded rows, before its first layer; a reranker's pairs
        have their second text from `seconds[i]` in row i."""
        ids, lengths = self._padded(rows)
        positions = mx.arange(ids.shape[1])[None, :]
        types = None
        if seconds is not None:
            types = (positions >= mx.array(seconds)[:, None]).astype(ids.dtype)
        x, masks = self._encoder().begin(ids, positions < lengths[:, None], types)
        return EncoderPass(x, masks, lengths)

    def advance(self, part: EncoderPass, count: int) -> None:
        """The next `count` layers of the batch (no more than it has left)."""
        encoder = self._encoder()
        for index in range(part.done, min(self.layers, part.done + count)):
            part.x = encoder.run(index, part.x, part.masks)
        part.done = min(self.layers, part.done + count)

    def finish(self, part: EncoderPass, per_token: bool = False) -> mx.array:
        """A batch through every layer: pooled vectors, a reranker's scores, or (`per_token`)
        every token's state, float32."""
        states = self._encoder().end(part.x)
        if self.architecture == RERANKER:
            out = self.network.score(states, part.lengths)
        elif per_token:
            out = states
        else:
            out = self.pooling(states, part.lengths)
        return out.astype(mx.float32)

    def token_states(self, rows: list[list[int]]) -> mx.array:
        """(len(rows), longest, dimensions) float32 last hidden states, unpooled (llama.cpp's
        pooling none); each row's own are its first len(row)."""
        return self._whole(rows, None, per_token=True)

    def embed(self, rows: list[list[int]], seconds: list[int] | None = None) -> mx.array:
        """(len(rows), dimensions) float32 vectors, pooled (and normalised) as the model says;
        a reranker's (len(rows), 1) scores of its pairs, whose second text starts at
        `seconds[i]` in row i."""
        return self._whole(rows, seconds, per_token=False)

    def _whole(self, rows: list[list[int]], seconds: list[int] | None, per_token: bool):
        """A batch in one go: an encoder's every layer, or a decoder's model."""
        if self.layers:
            part = self.begin(rows, seconds)
            self.advance(part, self.layers)
            return self.finish(part, per_token)
        ids, lengths = self._padded(rows)
        states = self.network.model(ids)
        if self.architecture == YES_NO:
            return self._judged(states[mx.arange(len(rows)), lengths - 1])
        return (states if per_token else self.pooling(states, lengths)).astype(mx.float32)

    def _judged(self, last: mx.array) -> mx.array:
        """(B, D) hidden states at each prompt's answer -> (B, 1) logit of "yes" less "no"'s
        (its sigmoid is the two answers' softmax)."""
        network = self.network
        if hasattr(network, "lm_head"):
            logits = network.lm_head(last)
        else:  # tied embeddings
            logits = network.model.embed_tokens.as_linear(last)
        yes, no = self.answer_ids
        return (logits[:, yes] - logits[:, no]).astype(mx.float32)[:, None]

    def _padded(self, rows: list[list[int]]) -> tuple[mx.array, mx.array]:
        """The rows right-padded to the longest, and each one's length."""
        longest = max(map(len, rows))
        ids = mx.array([row + [self.pad_id] * (longest - len(row)) for row in rows])
        return ids, mx.array([len(row) for row in rows])

    def _encoder(self):
        return self.network.encoder if self.architecture == RERANKER else self.network


def load_network(folder: Path, architecture: str) -> tuple[nn.Module, dict[str, Any]]:
    """The network of an embedding model's folder (weights lazy) and its config."""
    config = _read_json(folder / "config.json")
    if architecture in (DECODER, YES_NO):
        import mlx_lm

        model, _ = mlx_lm.load(str(folder), lazy=True)
        if not hasattr(model, "model"):
            raise NotAnEmbeddingModel("its mlx-lm model has no inner `model` to read states of")
        return model, config
    if architecture == RERANKER:
        labels = len(config.get("id2label") or {}) or int(config.get("num_labels", 1))
        if labels != 1:
            raise NotAnEmbeddingModel(
                f"its classification head has {labels} labels; a reranker scores with one"
            )
    try:
        network = encoders.build(config, reranker=architecture == RERANKER)
    except ValueError as error:
        raise NotAnEmbeddingModel(str(error)) from error
    weights: dict[str, mx.array] = {}
    for file in sorted(folder.glob("*.safetensors")):
        weights.update(mx.load(str(file)))
    if not weights:
        raise NotAnEmbeddingModel(f"no *.safetensors weights in {folder}")
    network.load_weights(list(network.sanitize(weights).items()), strict=True)
    return network, config


def embedding_model(folder: Path, network: nn.Module, config: dict[str, Any]) -> EmbeddingModel:
    """The loaded `network` with what its folder says of pooling, length and prompts."""
    architecture = embedding_architecture(folder) or DECODER
    pooling = Pooling.of_folder(folder, "mean" if architecture == ENCODER else "last")
    answer_ids = _answer_ids(folder) if architecture == YES_NO else None
    limits = [_read_json(folder / "sentence_bert_config.json").get("max_seq_length")]
    if architecture in (ENCODER, RERANKER):
        facts = encoders.facts(config)
        limits.append(facts.max_tokens)
        dimensions, pad_id = facts.hidden_size, facts.pad_id
        if architecture == RERANKER:
            dimensions = 1
    else:
        limits.append(config.get("max_position_embeddings"))
        dimensions, pad_id = int(config["hidden_size"]), 0
        if architecture == YES_NO:
            dimensions = 1
    prompts = _read_json(folder / "config_sentence_transformers.json")
    return EmbeddingModel(
        network,
        architecture,
        pooling,
        dimensions,
        min(int(n) for n in limits if n),
        pad_id,
        {k: str(v) for k, v in (prompts.get("prompts") or {}).items()},
        prompts.get("default_prompt_name"),
        answer_ids,
    )


def _answer_ids(folder: Path) -> tuple[int, int]:
    """A yes-no reranker's "yes" and "no" token ids, from its tokenizer's vocabulary."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    ids = [tokenizer.token_to_id(answer) for answer in ANSWERS]
    if None in ids:
        raise NotAnEmbeddingModel('its vocabulary has no "yes" and "no" tokens to score with')
    return ids[0], ids[1]
