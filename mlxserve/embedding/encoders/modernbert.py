"""ModernBERT (gte-modernbert, modernbert-embed, gte-reranker-modernbert): pre-norm layers with
rotary positions, a gated GELU MLP, no biases, and attention that is global every few layers
and a sliding window in between (each kind with its own RoPE base).

Parameter names are the Hugging Face checkpoint's (`model.` dropped, the masked-LM head too).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from ..pooling import Pooling
from .common import MASKED, EncoderFacts, LayeredEncoder, activation, padding_mask


@dataclass(frozen=True)
class ModernBertConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int = 8192
    norm_eps: float = 1e-5
    norm_bias: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    hidden_activation: str = "gelu"
    global_attn_every_n_layers: int = 3
    local_attention: int = 128  # a sliding layer sees this many tokens around each one
    global_rope_theta: float = 160000.0
    local_rope_theta: float | None = 10000.0
    pad_token_id: int = 50283
    layer_types: tuple[str, ...] = ()  # "full_attention" / "sliding_attention" per layer
    classifier_pooling: str = "cls"
    classifier_activation: str = "gelu"
    classifier_bias: bool = False

    @classmethod
    def of(cls, config: dict[str, Any]) -> ModernBertConfig:
        names = set(cls.__dataclass_fields__)
        values = {k: v for k, v in config.items() if k in names and v is not None}
        if "local_rope_theta" in config and config["local_rope_theta"] is None:
            values["local_rope_theta"] = None  # the global base for every layer
        ropes = config.get("rope_parameters") or {}  # transformers 5's form of the two bases
        if "rope_theta" in ropes.get("full_attention", {}):
            values["global_rope_theta"] = ropes["full_attention"]["rope_theta"]
        if "rope_theta" in ropes.get("sliding_attention", {}):
            values["local_rope_theta"] = ropes["sliding_attention"]["rope_theta"]
        values["layer_types"] = tuple(config.get("layer_types") or ())
        return cls(**values)

    def sliding(self, index: int) -> bool:
        """Whether layer `index` attends within the sliding window."""
        if self.layer_types:
            return self.layer_types[index] == "sliding_attention"
        return index % self.global_attn_every_n_layers != 0


class Embeddings(nn.Module):
    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)

    def __call__(self, ids: mx.array) -> mx.array:
        return self.norm(self.tok_embeddings(ids))


class Attention(nn.Module):
    def __init__(self, config: ModernBertConfig, sliding: bool):
        super().__init__()
        size = config.hidden_size
        self.heads = config.num_attention_heads
        self.sliding = sliding
        self.Wqkv = nn.Linear(size, 3 * size, bias=config.attention_bias)
        self.Wo = nn.Linear(size, size, bias=config.attention_bias)
        base = config.global_rope_theta
        if sliding and config.local_rope_theta is not None:
            base = config.local_rope_theta
        self.rope = nn.RoPE(size // self.heads, traditional=False, base=base)

    def __call__(self, x: mx.array, mask: mx.array) -> mx.array:
        batch, length, size = x.shape
        qkv = self.Wqkv(x).reshape(batch, length, 3, self.heads, -1).transpose(2, 0, 3, 1, 4)
        q, k, v = self.rope(qkv[0]), self.rope(qkv[1]), qkv[2]
        out = mx.fast.scaled_dot_product_attention(q, k, v, scale=q.shape[-1] ** -0.5, mask=mask)
        return self.Wo(out.transpose(0, 2, 1, 3).reshape(batch, length, size))


class GatedMLP(nn.Module):
    """Wi's output halves: the first, activated, times the second."""

    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.Wi = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias)
        self.Wo = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)
        self.activation = activation(config.hidden_activation)

    def __call__(self, x: mx.array) -> mx.array:
        value, gate = mx.split(self.Wi(x), 2, axis=-1)
        return self.Wo(self.activation(value) * gate)


class Layer(nn.Module):
    def __init__(self, config: ModernBertConfig, index: int):
        super().__init__()
        eps, bias = config.norm_eps, config.norm_bias
        # The first layer reads the embeddings' norm: it has none of its own
        self.attn_norm = nn.LayerNorm(config.hidden_size, eps=eps, bias=bias) if index else None
        self.attn = Attention(config, config.sliding(index))
        self.mlp_norm = nn.LayerNorm(config.hidden_size, eps=eps, bias=bias)
        self.mlp = GatedMLP(config)

    def __call__(self, x: mx.array, mask: mx.array) -> mx.array:
        normed = x if self.attn_norm is None else self.attn_norm(x)
        x = x + self.attn(normed, mask)
        return x + self.mlp(self.mlp_norm(x))


class ModernBertModel(LayeredEncoder):
    """Token ids (B, L), right-padded, and their mask (B, L) -> last hidden states (B, L, D)."""

    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.layers = [Layer(config, i) for i in range(config.num_hidden_layers)]
        self.final_norm = nn.LayerNorm(
            config.hidden_size, eps=config.norm_eps, bias=config.norm_bias
        )

    @classmethod
    def of(cls, config: dict[str, Any]) -> ModernBertModel:
        return cls(ModernBertConfig.of(config))

    @staticmethod
    def facts_of(config: dict[str, Any]) -> EncoderFacts:
        c = ModernBertConfig.of(config)
        return EncoderFacts(c.hidden_size, c.max_position_embeddings, c.pad_token_id)

    @property
    def blocks(self) -> list[Layer]:
        return self.layers

    def begin(
        self, ids: mx.array, mask: mx.array, types: mx.array | None = None
    ) -> tuple[mx.array, tuple[mx.array, mx.array]]:
        """The first layer's input, and the two additive masks the layers read: the padding's
        (global layers) and the padding's within the window (sliding ones). No segments."""
        x = self.embeddings(ids)
        full = padding_mask(mask, x.dtype)
        positions = mx.arange(ids.shape[1])
        distance = mx.abs(positions[:, None] - positions[None, :])
        near = distance <= self.config.local_attention // 2
        window = mx.where(near[None, None], full, MASKED).astype(x.dtype)
        return x, (full, window)

    def run(self, index: int, x: mx.array, masks: tuple[mx.array, mx.array]) -> mx.array:
        layer = self.layers[index]
        return layer(x, masks[1] if layer.attn.sliding else masks[0])

    def end(self, x: mx.array) -> mx.array:
        return self.final_norm(x)

    @staticmethod
    def sanitize(weights: dict[str, mx.array]) -> dict[str, mx.array]:
        """The checkpoint's names as this module's: `model.` dropped, a masked-LM head too."""
        out = {}
        for name, value in weights.items():
            name = name.removeprefix("model.")
            if name.startswith(("head.", "decoder.")):
                continue
            out[name] = value
        return out


class PredictionHead(nn.Module):
    """ModernBERT's head before its classifier: dense, activation, norm."""

    def __init__(self, config: ModernBertConfig):
        super().__init__()
        size = config.hidden_size
        self.dense = nn.Linear(size, size, bias=config.classifier_bias)
        self.activation = activation(config.classifier_activation)
        self.norm = nn.LayerNorm(size, eps=config.norm_eps, bias=config.norm_bias)

    def __call__(self, x: mx.array) -> mx.array:
        return self.norm(self.activation(self.dense(x)))


class ModernBertCrossEncoder(nn.Module):
    """`ModernBertForSequenceClassification` with one label (gte-reranker-modernbert): the
    pair's hidden states pooled (its first token, or the mean of its tokens, as the config
    says), through the head, to one logit."""

    def __init__(self, config: ModernBertConfig, labels: int = 1):
        super().__init__()
        if config.classifier_pooling not in ("cls", "mean"):
            raise ValueError(f"its classifier pooling {config.classifier_pooling!r} is unknown")
        self.config = config
        self.model = ModernBertModel(config)
        self.head = PredictionHead(config)
        self.classifier = nn.Linear(config.hidden_size, labels)

    @classmethod
    def of(cls, config: dict[str, Any]) -> ModernBertCrossEncoder:
        return cls(ModernBertConfig.of(config))

    @property
    def encoder(self) -> ModernBertModel:
        return self.model

    def score(self, hidden: mx.array, lengths: mx.array) -> mx.array:
        """(B, L, D) last hidden states of rows of `lengths` tokens -> (B, 1) scores."""
        return self.classifier(self.head(Pooling(self.config.classifier_pooling)(hidden, lengths)))

    @staticmethod
    def sanitize(weights: dict[str, mx.array]) -> dict[str, mx.array]:
        return {k: v for k, v in weights.items() if not k.startswith("decoder.")}
