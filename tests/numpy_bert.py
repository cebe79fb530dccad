"""BERT's forward pass in float64 NumPy, written from the Hugging Face model's definition: the
reference mlxserve's MLX encoder is compared with (sentence-transformers needs PyTorch, which
this project does not install). One input at a time, no padding."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

_erf = np.vectorize(math.erf)


def load_weights(folder: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    weights = {}
    for file in sorted(folder.glob("*.safetensors")):
        weights.update(load_file(str(file)))
    return {k.removeprefix("bert."): v.astype(np.float64) for k, v in weights.items()}


def hidden_states(
    w: dict[str, np.ndarray], config: dict, ids: list[int], types: list[int] | None = None
) -> np.ndarray:
    """(len(ids), hidden) last hidden states of one unpadded input (`types`: each token's
    segment, 0 when not given)."""
    eps, heads = config.get("layer_norm_eps", 1e-12), config["num_attention_heads"]
    offset = 0 if config["model_type"] == "bert" else config.get("pad_token_id", 1) + 1

    def norm(x, name):
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / np.sqrt(var + eps) * w[f"{name}.weight"] + w[f"{name}.bias"]

    def dense(x, name):
        return x @ w[f"{name}.weight"].T + w[f"{name}.bias"]

    e = "embeddings."
    x = w[e + "word_embeddings.weight"][ids]
    x = x + w[e + "position_embeddings.weight"][offset : offset + len(ids)]
    segments = types if types is not None else [0] * len(ids)
    x = norm(x + w[e + "token_type_embeddings.weight"][segments], e + "LayerNorm")
    for n in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{n}."

        def split(t):
            return t.reshape(len(ids), heads, -1).transpose(1, 0, 2)

        q, k, v = (split(dense(x, p + f"attention.self.{m}")) for m in ("query", "key", "value"))
        scores = q @ k.transpose(0, 2, 1) / math.sqrt(q.shape[-1])
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        attended = (scores / scores.sum(-1, keepdims=True)) @ v
        attended = attended.transpose(1, 0, 2).reshape(len(ids), -1)
        x = norm(
            dense(attended, p + "attention.output.dense") + x, p + "attention.output.LayerNorm"
        )
        inner = dense(x, p + "intermediate.dense")
        inner = 0.5 * inner * (1 + _erf(inner / math.sqrt(2)))
        x = norm(dense(inner, p + "output.dense") + x, p + "output.LayerNorm")
    return x


def pair_score(w, config, ids: list[int], types: list[int]) -> float:
    """A cross-encoder's logit: BERT's pooler (dense, tanh) on the first token, then its
    classifier. `w` read with `bert.` kept off the encoder's names (load_weights)."""
    first = hidden_states(w, config, ids, types)[0]
    pooled = np.tanh(first @ w["pooler.dense.weight"].T + w["pooler.dense.bias"])
    return float((pooled @ w["classifier.weight"].T + w["classifier.bias"])[0])


def mean_pooled(w, config, ids: list[int], normalize: bool = False) -> np.ndarray:
    vector = hidden_states(w, config, ids).mean(0)
    return vector / np.linalg.norm(vector) if normalize else vector
