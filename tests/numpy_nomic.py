"""NomicBERT's forward pass in float64 NumPy, written from Nomic's reference model
(contrastors' `modeling_hf_nomic_bert.py`: post-norm blocks, rotate-half rotary embeddings on the
first `rotary_emb_fraction` of each head, SwiGLU as fc11 * silu(fc12)): the reference the MLX
encoder is compared with (the reference needs PyTorch, which this project does not install).
One input at a time, no padding."""

from __future__ import annotations

import math

import numpy as np


def hidden_states(w: dict[str, np.ndarray], config: dict, ids: list[int]) -> np.ndarray:
    """(len(ids), n_embd) last hidden states of one unpadded input."""
    eps, heads, length = config["layer_norm_epsilon"], config["n_head"], len(ids)
    head_dim = config["n_embd"] // heads
    rotary = int(head_dim * config["rotary_emb_fraction"])

    def norm(x, name):
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / np.sqrt(var + eps) * w[f"{name}.weight"] + w[f"{name}.bias"]

    def rotate(t):  # (heads, length, head_dim): the first `rotary` of each head turn
        inverse = 1.0 / config["rotary_emb_base"] ** (np.arange(0, rotary, 2) / rotary)
        angles = np.outer(np.arange(length), inverse)
        cos, sin = np.tile(np.cos(angles), 2), np.tile(np.sin(angles), 2)
        part, rest = t[..., :rotary], t[..., rotary:]
        half = rotary // 2
        turned = np.concatenate([-part[..., half:], part[..., :half]], -1)
        return np.concatenate([part * cos + turned * sin, rest], -1)

    x = w["embeddings.word_embeddings.weight"][ids]
    x = x + w["embeddings.token_type_embeddings.weight"][[0] * length]
    x = norm(x, "emb_ln")
    for n in range(config["n_layer"]):
        p = f"encoder.layers.{n}."
        qkv = (x @ w[p + "attn.Wqkv.weight"].T).reshape(length, 3, heads, head_dim)
        q, k, v = (qkv[:, i].transpose(1, 0, 2) for i in range(3))
        q, k = rotate(q), rotate(k)
        scores = q @ k.transpose(0, 2, 1) / math.sqrt(head_dim)
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        attended = (scores / scores.sum(-1, keepdims=True)) @ v
        attended = attended.transpose(1, 0, 2).reshape(length, -1)
        x = norm(attended @ w[p + "attn.out_proj.weight"].T + x, p + "norm1")
        value = x @ w[p + "mlp.fc11.weight"].T
        gate = x @ w[p + "mlp.fc12.weight"].T
        inner = value * gate / (1 + np.exp(-gate))
        x = norm(inner @ w[p + "mlp.fc2.weight"].T + x, p + "norm2")
    return x
