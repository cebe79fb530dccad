"""BERT and its RoBERTa / XLM-RoBERTa variants: bidirectional encoders whose last hidden states
are pooled into embeddings (MiniLM, bge, e5, gte, multilingual-e5 are of this family), and the
cross-encoders built on them that score a (query, document) pair (bge-reranker).

Parameter names are the Hugging Face checkpoint's (a `bert.` / `roberta.` prefix and the pooler
are dropped at load), so `load_weights` reads a sentence-transformers folder as it is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from .common import EncoderFacts, LayeredEncoder, activation, padding_mask

_PREFIXES = ("bert.", "roberta.", "model.")


@dataclass(frozen=True)
class BertConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"
    pad_token_id: int = 0

    @classmethod
    def of(cls, config: dict[str, Any]) -> BertConfig:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in config.items() if k in names})

    @property
    def position_offset(self) -> int:
        """RoBERTa numbers positions from its padding id + 1; BERT from 0."""
        return 0 if self.model_type == "bert" else self.pad_token_id + 1

    @property
    def facts(self) -> EncoderFacts:
        positions = self.max_position_embeddings - self.position_offset
        return EncoderFacts(self.hidden_size, positions, self.pad_token_id)


class Embeddings(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(
            max(1, config.type_vocab_size), config.hidden_size
        )
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.offset = config.position_offset

    def __call__(self, ids: mx.array, token_types: mx.array) -> mx.array:
        positions = mx.arange(ids.shape[1]) + self.offset
        x = self.word_embeddings(ids) + self.position_embeddings(positions)[None]
        return self.LayerNorm(x + self.token_type_embeddings(token_types))


class SelfAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        size = config.hidden_size
        self.heads = config.num_attention_heads
        self.query = nn.Linear(size, size)
        self.key = nn.Linear(size, size)
        self.value = nn.Linear(size, size)

    def __call__(self, x: mx.array, mask: mx.array) -> mx.array:
        batch, length, size = x.shape

        def heads(t: mx.array) -> mx.array:
            return t.reshape(batch, length, self.heads, -1).transpose(0, 2, 1, 3)

        q, k, v = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))
        scale = 1 / math.sqrt(q.shape[-1])
        out = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)
        return out.transpose(0, 2, 1, 3).reshape(batch, length, size)


class DenseNorm(nn.Module):
    """A projection added to its input, then normalised (BERT's `*.output`)."""

    def __init__(self, inputs: int, size: int, eps: float):
        super().__init__()
        self.dense = nn.Linear(inputs, size)
        self.LayerNorm = nn.LayerNorm(size, eps=eps)

    def __call__(self, x: mx.array, residual: mx.array) -> mx.array:
        return self.LayerNorm(self.dense(x) + residual)


class Attention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.self = SelfAttention(config)  # the checkpoint's name
        self.output = DenseNorm(config.hidden_size, config.hidden_size, config.layer_norm_eps)

    def __call__(self, x: mx.array, mask: mx.array) -> mx.array:
        return self.output(self.self(x, mask), x)


class Intermediate(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.activation = activation(config.hidden_act)

    def __call__(self, x: mx.array) -> mx.array:
        return self.activation(self.dense(x))


class Layer(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = Attention(config)
        self.intermediate = Intermediate(config)
        self.output = DenseNorm(config.intermediate_size, config.hidden_size, config.layer_norm_eps)

    def __call__(self, x: mx.array, mask: mx.array) -> mx.array:
        x = self.attention(x, mask)
        return self.output(self.intermediate(x), x)


class Encoder(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.layer = [Layer(config) for _ in range(config.num_hidden_layers)]


class BertModel(LayeredEncoder):
    """Token ids (B, L), right-padded, and their mask (B, L) -> last hidden states (B, L, D)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.encoder = Encoder(config)

    @classmethod
    def of(cls, config: dict[str, Any]) -> BertModel:
        return cls(BertConfig.of(config))

    @staticmethod
    def facts_of(config: dict[str, Any]) -> EncoderFacts:
        return BertConfig.of(config).facts

    @property
    def blocks(self) -> list[Layer]:
        return self.encoder.layer

    def begin(
        self, ids: mx.array, mask: mx.array, types: mx.array | None = None
    ) -> tuple[mx.array, mx.array]:
        """The first layer's input, and the additive mask every layer reads (the layers may
        then run a few at a time). `types`: each token's segment (a pair's second text is 1;
        BERT reads it, RoBERTa has one segment)."""
        if types is None or self.config.type_vocab_size < 2:
            types = mx.zeros_like(ids)
        x = self.embeddings(ids, types)
        return x, padding_mask(mask, x.dtype)

    @staticmethod
    def sanitize(weights: dict[str, mx.array]) -> dict[str, mx.array]:
        """The checkpoint's names as this module's: prefixes and the pooler dropped."""
        out = {}
        for name, value in weights.items():
            for prefix in _PREFIXES:
                if name.startswith(prefix):
                    name = name[len(prefix) :]
                    break
            if name.startswith(("pooler.", "cls.", "lm_head.")) or name.endswith("position_ids"):
                continue
            out[name] = value
        return out


class ScoreHead(nn.Module):
    """A cross-encoder's head on the first token: dense, tanh, one logit (BERT's pooler and
    classifier, RoBERTa's classification head: the same arithmetic under other names)."""

    def __init__(self, size: int, labels: int):
        super().__init__()
        self.dense = nn.Linear(size, size)
        self.out = nn.Linear(size, labels)

    def __call__(self, first: mx.array) -> mx.array:
        return self.out(mx.tanh(self.dense(first)))


class CrossEncoder(nn.Module):
    """`*ForSequenceClassification` with one label: a (query, document) pair read together,
    scored by its first token (bge-reranker, ms-marco cross-encoders)."""

    def __init__(self, config: BertConfig, labels: int = 1):
        super().__init__()
        self.config = config
        self.bert = BertModel(config)
        self.head = ScoreHead(config.hidden_size, labels)

    @classmethod
    def of(cls, config: dict[str, Any]) -> CrossEncoder:
        return cls(BertConfig.of(config))

    @property
    def encoder(self) -> BertModel:
        return self.bert

    def __call__(self, ids: mx.array, mask: mx.array, types: mx.array | None = None) -> mx.array:
        return self.score(self.bert(ids, mask, types), None)

    def score(self, hidden: mx.array, lengths: mx.array | None) -> mx.array:
        """(B, L, D) last hidden states -> (B, 1) scores, read off the first token."""
        return self.head(hidden[:, 0])

    @staticmethod
    def sanitize(weights: dict[str, mx.array]) -> dict[str, mx.array]:
        out = {}
        for name, value in weights.items():
            for prefix in ("bert.", "roberta."):
                if name.startswith(prefix):
                    name = "bert." + name[len(prefix) :]
            for before, after in _HEAD_NAMES:
                if name.startswith(before):
                    name = after + name[len(before) :]
                    break
            if name.endswith("position_ids"):
                continue
            out[name] = value
        return out


_HEAD_NAMES = (
    ("bert.pooler.dense.", "head.dense."),
    ("classifier.dense.", "head.dense."),
    ("classifier.out_proj.", "head.out."),
    ("classifier.", "head.out."),
)
