"""Training a Llama on MLX's CPU backend without its scalar `exp`.

MLX's CPU `exp` (and so logsumexp and sigmoid) is a scalar loop at ~9.5 ns an element. Here the
loss's logsumexp and SwiGLU's sigmoid use `platform.attention.fast_exp` (a polynomial `mx.compile`
fuses), each with its gradient written out, so the backward pass needs no exp of its own beyond
the forward's. Values and gradients are MLX's own to float32 precision
(tests/test_cpu_training_ops.py).

Attention stays MLX's own (`mx.fast.scaled_dot_product_attention`): with MLX 0.32.4 an attention
written out here with this softmax made the demo model's 16 x 256 step 3.4x slower on the 2-core
CPU (5.0-5.1 s against 1.46-1.49 s, interleaved runs, OpenBLAS).

    from cpu_training_ops import token_losses, use_in_llama
    use_in_llama()  # mlx_lm.models.llama's MLP
"""

from __future__ import annotations

import mlx.core as mx

from mlxserve.platform.attention import fast_exp


def _largest(x: mx.array) -> mx.array:
    return mx.stop_gradient(x.max(axis=-1, keepdims=True))


@mx.custom_function
def logsumexp(x: mx.array) -> mx.array:
    """log(sum(exp(x))) over the last axis."""
    largest = _largest(x)
    return (largest + mx.log(fast_exp(x - largest).sum(axis=-1, keepdims=True)))[..., 0]


@logsumexp.vjp
def _logsumexp_vjp(x, cotangent, output):
    return (cotangent[..., None] * fast_exp(x - output[..., None]),)


def _sigmoid(x: mx.array) -> mx.array:
    small = fast_exp(-mx.abs(x))  # exp of a non-positive number only
    return mx.where(x >= 0, 1.0, small) / (1.0 + small)


@mx.custom_function
def swiglu(gate: mx.array, x: mx.array) -> mx.array:
    """silu(gate) * x, mlx-lm's `activations.swiglu`."""
    return gate * _sigmoid(gate) * x


@swiglu.vjp
def _swiglu_vjp(primals, cotangent, output):
    gate, x = primals
    sigmoid = _sigmoid(gate)
    return (
        cotangent * x * sigmoid * (1 + gate * (1 - sigmoid)),
        cotangent * gate * sigmoid,
    )


def token_losses(logits: mx.array, targets: mx.array) -> mx.array:
    """Each position's next-token loss, as `nn.losses.cross_entropy(..., reduction="none")`."""
    picked = mx.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return logsumexp(logits) - picked


def cross_entropy(logits: mx.array, targets: mx.array) -> mx.array:
    """Mean next-token loss, as `nn.losses.cross_entropy(..., reduction="mean")`."""
    return token_losses(logits, targets).mean()


def use_in_llama() -> None:
    """Point mlx-lm's Llama at `swiglu` above (it imports it by name)."""
    from mlx_lm.models import llama

    llama.swiglu = swiglu
