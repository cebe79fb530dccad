"""GTE's "new" encoder in float64 NumPy, written from Alibaba-NLP's reference model
(`new-impl`'s `modeling.py`: post-norm layers, rotate-half rotary embeddings whose NTK-scaled
table the reference builds for the scaled length at load, an optional log-length query scale,
a gated MLP of act(gate) * up, a reranker's pooler and classifier on the first token): the
reference the MLX encoder is compared with. One input at a time, no padding."""

from __future__ import annotations

import math

import numpy as np


def rotary_inverse(config: dict) -> np.ndarray:
    """The reference's inverse frequencies: RotaryEmbedding's, or NTKScalingRotaryEmbedding's
    once its cache is set for max_position_embeddings * factor."""
    dim = config["hidden_size"] // config["num_attention_heads"]
    base, scaling = config["rope_theta"], config.get("rope_scaling")
    exponent = np.arange(0, dim, 2) / dim
    if not scaling or scaling["factor"] <= 1:
        return 1.0 / base**exponent
    factor, mixed_b = scaling["factor"], scaling.get("mixed_b")
    if mixed_b is None:
        return 1.0 / (base * factor) ** exponent / factor ** (2 / dim)
    a = math.log(factor) / (dim / 2) ** mixed_b
    return 1.0 / base**exponent / np.exp(a * np.arange(1, dim // 2 + 1) ** mixed_b)


def hidden_states(w: dict[str, np.ndarray], config: dict, ids: list[int]) -> np.ndarray:
    """(len(ids), hidden_size) last hidden states of one unpadded input (the checkpoint's names
    without a reranker's `new.` prefix)."""
    eps, heads, length = config["layer_norm_eps"], config["num_attention_heads"], len(ids)
    head_dim = config["hidden_size"] // heads
    angles = np.outer(np.arange(length), rotary_inverse(config))
    cos, sin = np.tile(np.cos(angles), 2), np.tile(np.sin(angles), 2)

    def norm(x, name):
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / np.sqrt(var + eps) * w[f"{name}.weight"] + w[f"{name}.bias"]

    def dense(x, name):
        out = x @ w[f"{name}.weight"].T
        return out + w[f"{name}.bias"] if f"{name}.bias" in w else out

    def rotate(t):  # (length, heads, head_dim)
        half = head_dim // 2
        turned = np.concatenate([-t[..., half:], t[..., :half]], -1)
        return t * cos[:, None] + turned * sin[:, None]

    x = norm(w["embeddings.word_embeddings.weight"][ids], "embeddings.LayerNorm")
    scale = 1.0
    if config.get("logn_attention_scale"):
        scale = math.log(length) / math.log(config["max_position_embeddings"])
        if config.get("logn_attention_clip1"):
            scale = max(scale, 1.0)
    for n in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{n}."
        qkv = dense(x, p + "attention.qkv_proj").reshape(length, 3, heads, head_dim)
        q, k, v = rotate(qkv[:, 0]) * scale, rotate(qkv[:, 1]), qkv[:, 2]
        scores = np.einsum("qhd,khd->hqk", q, k) / math.sqrt(head_dim)
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        attended = np.einsum("hqk,khd->qhd", scores / scores.sum(-1, keepdims=True), v)
        x = norm(x + dense(attended.reshape(length, -1), p + "attention.o_proj"), p + "attn_ln")
        up, gate = np.split(dense(x, p + "mlp.up_gate_proj"), 2, axis=-1)
        gelu = 0.5 * gate * (1 + np.vectorize(math.erf)(gate / math.sqrt(2)))
        x = norm(x + dense(gelu * up, p + "mlp.down_proj"), p + "mlp_ln")
    return x


def pair_score(w: dict[str, np.ndarray], config: dict, ids: list[int]) -> float:
    """NewForSequenceClassification's one logit: its first token through pooler and classifier."""
    encoder = {k.removeprefix("new."): v for k, v in w.items()}
    first = hidden_states(encoder, config, ids)[0]
    pooled = np.tanh(first @ w["new.pooler.dense.weight"].T + w["new.pooler.dense.bias"])
    return float((pooled @ w["classifier.weight"].T + w["classifier.bias"])[0])
