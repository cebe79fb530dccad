"""NomicBERT (nomic-embed-text v1 and v1.5, Ollama's `nomic-embed-text`; CodeRankEmbed): BERT's
post-norm layers with rotary positions instead of learned ones, a fused QKV projection, no
biases and a SwiGLU MLP, under GPT-2's config names (`n_embd`, `n_head`, `n_layer`).

Parameter names are the Hugging Face checkpoint's (a `bert.` prefix and the pooler dropped).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from .common import EncoderFacts, LayeredEncoder, activation, padding_mask

GATED = {"swiglu": "silu", "geglu": "gelu", "glu": "sigmoid"}  # the gate's activation


@dataclass(frozen=True)
class NomicBertConfig:
    vocab_size: int
    n_embd: int
    n_head: int
    n_layer: int
    n_inner: int | None = None
    n_positions: int = 2048
    type_vocab_size: int = 0
    activation_function: str = "gelu_new"
    layer_norm_epsilon: float = 1e-5
    rotary_emb_fraction: float = 0.0
    rotary_emb_base: float = 10000.0
    rotary_emb_interleaved: bool = False
    rotary_scaling_factor: float | None = None
    max_trained_positions: int = 2048
    qkv_proj_bias: bool = True
    mlp_fc1_bias: bool = True
    mlp_fc2_bias: bool = True
    pad_vocab_size_multiple: int = 1
    pad_token_id: int = 0

    @classmethod
    def of(cls, config: dict[str, Any]) -> NomicBertConfig:
        for key, why in (
            ("prenorm", "pre-norm layers"),
            ("causal", "causal attention"),
            ("use_rms_norm", "RMS norms"),
            ("moe_every_n_layers", "mixture-of-experts layers"),
        ):
            if config.get(key):
                raise ValueError(f"it is a NomicBERT with {why}, which this server does not run")
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in config.items() if k in names and v is not None})

    @property
    def padded_vocab(self) -> int:
        multiple = self.pad_vocab_size_multiple
        return -(-self.vocab_size // multiple) * multiple

    @property
    def inner(self) -> int:
        """The MLP's width: `n_inner`, else the reference's defaults."""
        if self.n_inner:
            return self.n_inner
        if self.activation_function in GATED:
            return -(-int(8 * self.n_embd / 3) // 256) * 256
        return 4 * self.n_embd

    @property
    def max_tokens(self) -> int:
        # Past `max_trained_positions`, dynamic NTK scaling changes the rotary base with the
        # input's length: inputs are held within it instead
        if self.rotary_scaling_factor:
            return min(self.n_positions, self.max_trained_positions)
        return self.n_positions


class Embeddings(nn.Module):
    def __init__(self, config: NomicBertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.padded_vocab, config.n_embd)
        if config.type_vocab_size > 0:
            self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.n_embd)
        if config.rotary_emb_fraction <= 0:  # learned positions where there is no rotary
            self.position_embeddings = nn.Embedding(config.n_positions, config.n_embd)

    def __call__(self, ids: mx.array, types: mx.array) -> mx.array:
        x = self.word_embeddings(ids)
        if "token_type_embeddings" in self:
            x = x + self.token_type_embeddings(types)
        if "position_embeddings" in self:
            x = x + self.position_embeddings(mx.arange(ids.shape[1]))[None]
        return x


class Attention(nn.Module):
    def __init__(self, config: NomicBertConfig):
        super().__init__()
        size = config.n_embd
        self.heads = config.n_head
        head_dim = size // self.heads
        self.Wqkv = nn.Linear(size, 3 * size, bias=config.qkv_proj_bias)
        self.out_proj = nn.Linear(size, size, bias=config.qkv_proj_bias)
        rotary = int(head_dim * config.rotary_emb_fraction)
        self.rope = None
        if rotary > 0:
            self.rope = nn.RoPE(
                rotary, traditional=config.rotary_emb_interleaved, base=config.rotary_emb_base
            )

    def __call__(self, x: mx.array, mask: mx.array) -> mx.array:
        batch, length, size = x.shape
        qkv = self.Wqkv(x).reshape(batch, length, 3, self.heads, -1).transpose(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        if self.rope is not None:
            q, k = self.rope(q), self.rope(k)
        out = mx.fast.scaled_dot_product_attention(q, k, v, scale=q.shape[-1] ** -0.5, mask=mask)
        return self.out_proj(out.transpose(0, 2, 1, 3).reshape(batch, length, size))


class MLP(nn.Module):
    """SwiGLU (and GeGLU, GLU): fc11's output times the activated fc12's; else fc1, act."""

    def __init__(self, config: NomicBertConfig):
        super().__init__()
        size, inner = config.n_embd, config.inner
        name = config.activation_function
        self.gated = name in GATED
        if self.gated:
            self.fc11 = nn.Linear(size, inner, bias=config.mlp_fc1_bias)
            self.fc12 = nn.Linear(size, inner, bias=config.mlp_fc1_bias)
        else:
            self.fc1 = nn.Linear(size, inner, bias=config.mlp_fc1_bias)
        self.fc2 = nn.Linear(inner, size, bias=config.mlp_fc2_bias)
        self.activation = activation(GATED.get(name, name))

    def __call__(self, x: mx.array) -> mx.array:
        if self.gated:
            return self.fc2(self.fc11(x) * self.activation(self.fc12(x)))
        return self.fc2(self.activation(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, config: NomicBertConfig):
        super().__init__()
        eps = config.layer_norm_epsilon
        self.attn = Attention(config)
        self.mlp = MLP(config)
        self.norm1 = nn.LayerNorm(config.n_embd, eps=eps)
        self.norm2 = nn.LayerNorm(config.n_embd, eps=eps)

    def __call__(self, x: mx.array, mask: mx.array) -> mx.array:
        x = self.norm1(x + self.attn(x, mask))
        return self.norm2(x + self.mlp(x))


class Encoder(nn.Module):
    def __init__(self, config: NomicBertConfig):
        super().__init__()
        self.layers = [Block(config) for _ in range(config.n_layer)]


class NomicBertModel(LayeredEncoder):
    """Token ids (B, L), right-padded, and their mask (B, L) -> last hidden states (B, L, D)."""

    def __init__(self, config: NomicBertConfig):
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.emb_ln = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.encoder = Encoder(config)

    @classmethod
    def of(cls, config: dict[str, Any]) -> NomicBertModel:
        return cls(NomicBertConfig.of(config))

    @staticmethod
    def facts_of(config: dict[str, Any]) -> EncoderFacts:
        c = NomicBertConfig.of(config)
        return EncoderFacts(c.n_embd, c.max_tokens, c.pad_token_id)

    @property
    def blocks(self) -> list[Block]:
        return self.encoder.layers

    def begin(
        self, ids: mx.array, mask: mx.array, types: mx.array | None = None
    ) -> tuple[mx.array, mx.array]:
        x = self.emb_ln(self.embeddings(ids, mx.zeros_like(ids) if types is None else types))
        return x, padding_mask(mask, x.dtype)

    @staticmethod
    def sanitize(weights: dict[str, mx.array]) -> dict[str, mx.array]:
        out = {}
        for name, value in weights.items():
            name = name.removeprefix("bert.")
            if name.startswith(("pooler.", "cls.", "lm_head.")):
                continue
            out[name] = value
        return out
