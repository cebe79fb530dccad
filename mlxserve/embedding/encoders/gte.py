"""GTE's "new" encoder (Alibaba-NLP's gte-base/large-en-v1.5, gte-multilingual-base and its
reranker; `model_type: "new"`): BERT's post-norm layers with rotary positions (NTK-scaled as
the config says), a packed QKV projection and a gated MLP whose up and gate halves share one
projection.

Parameter names are the Hugging Face checkpoint's (a reranker's `new.` prefix dropped).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from .bert import ScoreHead
from .common import EncoderFacts, LayeredEncoder, activation, padding_mask


@dataclass(frozen=True)
class GteConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    hidden_act: str = "gelu"
    max_position_embeddings: int = 512
    type_vocab_size: int = 0
    layer_norm_type: str = "layer_norm"
    layer_norm_eps: float = 1e-12
    position_embedding_type: str = "rope"
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    logn_attention_scale: bool = False
    logn_attention_clip1: bool = False
    pack_qkv: bool = True
    pad_token_id: int = 0

    @classmethod
    def of(cls, config: dict[str, Any]) -> GteConfig:
        names = {f.name for f in fields(cls)}
        c = cls(**{k: v for k, v in config.items() if k in names and v is not None})
        for value, allowed, what in (
            (c.layer_norm_type, ("layer_norm", "rms_norm"), "norm"),
            (c.position_embedding_type, ("rope", "absolute"), "position embedding"),
            ((c.rope_scaling or {}).get("type", "ntk"), ("ntk",), "rotary scaling"),
        ):
            if value not in allowed:
                raise ValueError(f"its {what} {value!r} is not one this server runs")
        return c

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def rotary_periods(self) -> mx.array:
        """Each rotated pair's period. The reference builds its cache for the scaled length
        at load, so NTK scaling (fixed, or mixed by `mixed_b`) holds for every length."""
        dim, scaling = self.head_dim, self.rope_scaling or {}
        factor, mixed_b = float(scaling.get("factor", 1.0)), scaling.get("mixed_b")
        pairs = np.arange(0, dim, 2, dtype=np.float64) / dim
        if factor <= 1:
            inverse = self.rope_theta**-pairs
        elif mixed_b is None:
            inverse = (self.rope_theta * factor) ** -pairs / factor ** (2 / dim)
        else:
            a = math.log(factor) / (dim / 2) ** mixed_b
            inverse = self.rope_theta**-pairs / np.exp(a * np.arange(1, dim // 2 + 1) ** mixed_b)
        return mx.array((1 / inverse).astype(np.float32))


def _norm(config: GteConfig) -> nn.Module:
    if config.layer_norm_type == "rms_norm":
        return nn.RMSNorm(config.hidden_size, eps=config.layer_norm_eps)
    return nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)


class Embeddings(nn.Module):
    def __init__(self, config: GteConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        if config.position_embedding_type == "absolute":
            self.position_embeddings = nn.Embedding(
                config.max_position_embeddings, config.hidden_size
            )
        if config.type_vocab_size > 0:
            self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def __call__(self, ids: mx.array, types: mx.array) -> mx.array:
        x = self.word_embeddings(ids)
        if "token_type_embeddings" in self:
            x = x + self.token_type_embeddings(types)
        if "position_embeddings" in self:
            x = x + self.position_embeddings(mx.arange(ids.shape[1]))[None]
        return self.LayerNorm(x)


class Attention(nn.Module):
    def __init__(self, config: GteConfig):
        super().__init__()
        size = config.hidden_size
        self.heads = config.num_attention_heads
        if config.pack_qkv:
            self.qkv_proj = nn.Linear(size, 3 * size)
        else:
            self.q_proj, self.k_proj, self.v_proj = (nn.Linear(size, size) for _ in range(3))
        self.o_proj = nn.Linear(size, size)
        self.rotary = config.position_embedding_type == "rope"
        self._periods = config.rotary_periods() if self.rotary else None

    def __call__(self, x: mx.array, masks: tuple[mx.array, mx.array | None]) -> mx.array:
        additive, query_scale = masks
        batch, length, size = x.shape
        if "qkv_proj" in self:
            q, k, v = mx.split(self.qkv_proj(x), 3, axis=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q, k, v = (
            t.reshape(batch, length, self.heads, -1).transpose(0, 2, 1, 3) for t in (q, k, v)
        )
        if self.rotary:
            q, k = self._rotate(q), self._rotate(k)
        if query_scale is not None:
            q = q * query_scale
        out = mx.fast.scaled_dot_product_attention(
            q, k, v, scale=q.shape[-1] ** -0.5, mask=additive
        )
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(batch, length, size))

    def _rotate(self, t: mx.array) -> mx.array:
        """Rotate-half rotary embeddings over the whole head, positions from 0."""
        return mx.fast.rope(
            t, t.shape[-1], traditional=False, base=None, scale=1.0, offset=0, freqs=self._periods
        )


class GatedMLP(nn.Module):
    """One projection holds the up half then the gate half: down(act(gate) * up)."""

    def __init__(self, config: GteConfig):
        super().__init__()
        self.up_gate_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size)
        self.activation = activation(config.hidden_act)

    def __call__(self, x: mx.array) -> mx.array:
        up, gate = mx.split(self.up_gate_proj(x), 2, axis=-1)
        return self.down_proj(self.activation(gate) * up)


class Layer(nn.Module):
    def __init__(self, config: GteConfig):
        super().__init__()
        self.attention = Attention(config)
        self.mlp = GatedMLP(config)
        self.attn_ln = _norm(config)
        self.mlp_ln = _norm(config)

    def __call__(self, x: mx.array, masks: tuple[mx.array, mx.array | None]) -> mx.array:
        x = self.attn_ln(x + self.attention(x, masks))
        return self.mlp_ln(x + self.mlp(x))


class Encoder(nn.Module):
    def __init__(self, config: GteConfig):
        super().__init__()
        self.layer = [Layer(config) for _ in range(config.num_hidden_layers)]


class GteModel(LayeredEncoder):
    """Token ids (B, L), right-padded, and their mask (B, L) -> last hidden states (B, L, D)."""

    def __init__(self, config: GteConfig):
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.encoder = Encoder(config)

    @classmethod
    def of(cls, config: dict[str, Any]) -> GteModel:
        return cls(GteConfig.of(config))

    @staticmethod
    def facts_of(config: dict[str, Any]) -> EncoderFacts:
        c = GteConfig.of(config)
        return EncoderFacts(c.hidden_size, c.max_position_embeddings, c.pad_token_id)

    @property
    def blocks(self) -> list[Layer]:
        return self.encoder.layer

    def begin(
        self, ids: mx.array, mask: mx.array, types: mx.array | None = None
    ) -> tuple[mx.array, tuple[mx.array, mx.array | None]]:
        """The first layer's input; the additive mask and, where the config asks for it, each
        row's query scale (log of its length in the trained length's base)."""
        if types is None or self.config.type_vocab_size < 2:  # one segment: a pair's too
            types = mx.zeros_like(ids)
        x = self.embeddings(ids, types)
        query_scale = None
        if self.config.logn_attention_scale:
            lengths = mask.sum(axis=1).astype(mx.float32)
            query_scale = mx.log(lengths) / math.log(self.config.max_position_embeddings)
            if self.config.logn_attention_clip1:
                query_scale = mx.maximum(query_scale, 1.0)
            query_scale = query_scale[:, None, None, None].astype(x.dtype)
        return x, (padding_mask(mask, x.dtype), query_scale)

    @staticmethod
    def sanitize(weights: dict[str, mx.array]) -> dict[str, mx.array]:
        return {
            name.removeprefix("new."): value
            for name, value in weights.items()
            if not name.removeprefix("new.").startswith(("pooler.", "lm_head.", "classifier."))
        }


class GteCrossEncoder(nn.Module):
    """`NewForSequenceClassification` with one label (gte-multilingual-reranker-base): the
    pair's first token through the pooler (dense, tanh) and the classifier."""

    def __init__(self, config: GteConfig, labels: int = 1):
        super().__init__()
        self.config = config
        self.new = GteModel(config)
        self.head = ScoreHead(config.hidden_size, labels)

    @classmethod
    def of(cls, config: dict[str, Any]) -> GteCrossEncoder:
        return cls(GteConfig.of(config))

    @property
    def encoder(self) -> GteModel:
        return self.new

    def score(self, hidden: mx.array, lengths: mx.array | None) -> mx.array:
        """(B, L, D) last hidden states -> (B, 1) scores, read off the first token."""
        return self.head(hidden[:, 0])

    @staticmethod
    def sanitize(weights: dict[str, mx.array]) -> dict[str, mx.array]:
        out = {}
        for name, value in weights.items():
            if name.startswith("new.pooler.dense."):
                name = "head.dense." + name.removeprefix("new.pooler.dense.")
            elif name.startswith("classifier."):
                name = "head.out." + name.removeprefix("classifier.")
            out[name] = value
        return out
