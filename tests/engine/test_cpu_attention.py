"""On MLX's CPU backend the server attends with its own softmax (a vectorised exp): it must give
what MLX's fused kernel gives, for every mask mlx-lm hands it."""

from __future__ import annotations

import sys

import mlx.core as mx
import mlx_lm
import pytest
from mlx_lm.models import base
from mlx_lm.models.cache import make_prompt_cache

from mlxserve.platform import attention as cpu_attention
from mlxserve.platform.attention import attention, fast_exp, use_vectorised_attention

pytestmark = pytest.mark.skipif(
    mx.default_device() != mx.cpu, reason="Metal keeps MLX's fused attention"
)


@pytest.fixture(params=["mlx", "numpy"], autouse=True)
def softmax_path(request, monkeypatch):
    """Every test runs with softmax in MLX's compiled loop and in numpy, whatever the sizes."""
    threshold = 1 << 62 if request.param == "mlx" else 0
    monkeypatch.setattr(cpu_attention, "NUMPY_MIN_SCORES", threshold)
    return request.param


def random_qkv(batch, heads, kv_heads, length, total, dim=16, seed=0):
    mx.random.seed(seed)
    q = mx.random.normal((batch, heads, length, dim))
    k = mx.random.normal((batch, kv_heads, total, dim))
    v = mx.random.normal((batch, kv_heads, total, dim))
    return q, k, v


def assert_matches_mlx(q, k, v, mask, atol=2e-5):
    scale = q.shape[-1] ** -0.5
    ours = attention(q, k, v, scale, mask)
    theirs = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)
    assert ours.shape == theirs.shape
    assert ours.dtype == theirs.dtype
    err = mx.abs(ours.astype(mx.float32) - theirs.astype(mx.float32)).max().item()
    assert err < atol, err


def test_fast_exp_is_exp_to_float32_precision():
    x = mx.linspace(-87.0, 0.0, 100_001)
    relative = mx.abs(fast_exp(x) / mx.exp(x) - 1).max().item()
    assert relative < 1e-6
    assert fast_exp(mx.array([-1e30, -mx.inf])).max().item() < 1e-37


@pytest.mark.parametrize("mask_kind", [None, "causal", "bool", "additive"])
@pytest.mark.parametrize("length", [1, 8, 40])
def test_attention_matches_mlx_for_every_mask(mask_kind, length):
    batch, total = 3, 300
    q, k, v = random_qkv(batch, heads=6, kv_heads=2, length=length, total=total)
    if mask_kind == "bool":
        mask = mx.random.uniform(shape=(batch, 1, length, total)) > 0.3
        mask[..., -1] = True  # no row fully masked
    elif mask_kind == "additive":
        mask = mx.random.normal((batch, 1, length, total)) * 4
    else:
        mask = mask_kind
    assert_matches_mlx(q, k, v, mask)


def test_per_head_masks_and_half_precision():
    q, k, v = random_qkv(2, heads=4, kv_heads=4, length=5, total=500)
    mask = mx.random.uniform(shape=(2, 4, 5, 500)) > 0.5
    mask[..., 0] = True
    assert_matches_mlx(q, k, v, mask)
    half = [a.astype(mx.float16) for a in (q, k, v)]
    assert_matches_mlx(*half, "causal", atol=2e-3)


def test_long_query_runs_go_through_in_blocks(monkeypatch):
    monkeypatch.setattr(cpu_attention, "BLOCK_SCORES", 4 * 2 * 600)  # 4 queries a block
    q, k, v = random_qkv(1, heads=4, kv_heads=2, length=37, total=600)
    assert_matches_mlx(q, k, v, "causal")
    mask = mx.random.normal((1, 1, 37, 600))
    assert_matches_mlx(q, k, v, mask)


def test_a_patched_model_gives_the_same_logits(tiny_model, monkeypatch):
    """A prompt long enough for the new path (MIN_KEYS keys), then one decode step on its cache,
    both through it whatever their size."""
    monkeypatch.setattr(cpu_attention, "MIN_SCORES", 0)
    model, _ = mlx_lm.load(str(tiny_model))
    module = sys.modules[type(model).__module__]
    prompt = mx.array([[(7 * i) % 500 + 3 for i in range(cpu_attention.MIN_KEYS + 44)]])

    def logits():
        cache = make_prompt_cache(model)
        first = model(prompt, cache=cache)
        then = model(mx.array([[11]]), cache=cache)
        return first, then

    # mlx-lm's own, even where the session's server patched the module already
    monkeypatch.setattr(module, "scaled_dot_product_attention", base.scaled_dot_product_attention)
    before = logits()
    assert use_vectorised_attention(model)
    assert module.scaled_dot_product_attention is cpu_attention.scaled_dot_product_attention
    after = logits()
    for b, a in zip(before, after):
        assert mx.abs(a - b).max().item() < 1e-4


@pytest.mark.parametrize(
    ("batch", "keys", "vectorised"),
    [(1, 150, False), (16, 150, True), (16, 1, False), (1, 600, True)],
)
def test_the_path_follows_the_number_of_scores(monkeypatch, batch, keys, vectorised):
    """A batch of decode rows takes the vectorised path at depths where one row alone keeps
    MLX's kernel; one key never does."""
    taken = []
    monkeypatch.setattr(cpu_attention, "attention", lambda *a: taken.append(a) or a[0])
    q, k, v = random_qkv(batch, heads=9, kv_heads=3, length=1, total=keys)
    cpu_attention.scaled_dot_product_attention(q, k, v, None, 0.125, None)
    assert bool(taken) is vectorised
