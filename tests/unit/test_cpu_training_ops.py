"""The demo model trains with its own logsumexp and SwiGLU (scripts/cpu_training_ops.py):
values and gradients must be MLX's own, or the shipped weights are trained on a different model."""

from __future__ import annotations

import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx.utils import tree_flatten
from mlx_lm.models import base, llama

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import cpu_training_ops as ops  # noqa: E402


def largest_difference(a, b) -> float:
    return mx.abs(a - b).max().item()


@pytest.fixture
def scores():
    mx.random.seed(0)
    return mx.random.normal((3, 5, 37)) * 6


def test_logsumexp_and_its_gradient_are_mlx_s(scores):
    assert largest_difference(ops.logsumexp(scores), mx.logsumexp(scores, axis=-1)) < 1e-5
    weights = mx.random.normal(scores.shape[:-1])

    def ours(x):
        return (ops.logsumexp(x) * weights).sum()

    def theirs(x):
        return (mx.logsumexp(x, axis=-1) * weights).sum()

    assert largest_difference(mx.grad(ours)(scores), mx.grad(theirs)(scores)) < 1e-6


def test_swiglu_and_its_gradients_are_mlx_s():
    mx.random.seed(1)
    gate, x = mx.random.normal((4, 64)) * 8, mx.random.normal((4, 64))
    assert largest_difference(ops.swiglu(gate, x), nn.silu(gate) * x) < 1e-5
    weights = mx.random.normal(gate.shape)

    def ours(g, u):
        return (ops.swiglu(g, u) * weights).sum()

    def theirs(g, u):
        return (nn.silu(g) * u * weights).sum()

    for a, b in zip(
        mx.grad(ours, argnums=(0, 1))(gate, x), mx.grad(theirs, argnums=(0, 1))(gate, x)
    ):
        assert largest_difference(a, b) < 1e-5


def test_cross_entropy_is_mlx_s():
    mx.random.seed(2)
    logits, targets = mx.random.normal((2, 9, 50)) * 4, mx.random.randint(0, 50, (2, 9))
    expected = nn.losses.cross_entropy(logits, targets, reduction="mean")
    assert abs(ops.cross_entropy(logits, targets).item() - expected.item()) < 1e-5


def test_token_losses_are_mlx_s_per_position():
    """The training script weighs each position's loss (FIM middles more), so each must match."""
    mx.random.seed(3)
    logits, targets = mx.random.normal((2, 9, 50)) * 4, mx.random.randint(0, 50, (2, 9))
    expected = nn.losses.cross_entropy(logits, targets, reduction="none")
    ours = ops.token_losses(logits, targets)
    assert ours.shape == expected.shape
    assert largest_difference(ours, expected) < 1e-5


def test_a_llama_trains_on_them_as_on_mlx_s_ops(monkeypatch):
    """Loss and every parameter's gradient of a small Llama, stock against patched."""
    config = {
        "model_type": "llama",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "vocab_size": 97,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True,
    }
    # attention as training runs it (MLX's own), even where a server in this process swapped
    # the module's for the CPU policy's, which has no gradient
    monkeypatch.setattr(llama, "scaled_dot_product_attention", base.scaled_dot_product_attention)
    mx.random.seed(3)
    model = llama.Model(llama.ModelArgs.from_dict(config))
    tokens = mx.random.randint(0, 97, (2, 33))

    def stock(model):
        return nn.losses.cross_entropy(model(tokens[:, :-1]), tokens[:, 1:], reduction="mean")

    def patched(model):
        return ops.cross_entropy(model(tokens[:, :-1]), tokens[:, 1:])

    loss, grads = nn.value_and_grad(model, stock)(model)
    monkeypatch.setattr(llama, "swiglu", llama.swiglu)  # restored after the test
    ops.use_in_llama()
    assert llama.swiglu is ops.swiglu
    our_loss, our_grads = nn.value_and_grad(model, patched)(model)
    assert abs(our_loss.item() - loss.item()) < 1e-5
    for (name, ours), (_, theirs) in zip(tree_flatten(our_grads), tree_flatten(grads)):
        scale = max(mx.abs(theirs).max().item(), 1e-6)
        assert largest_difference(ours, theirs) / scale < 1e-4, name
