"""A batch's drafts verified in one go: greedy rows keep what the argmax agrees with; sampled
rows, with point-mass drafts, emit tokens distributed exactly as the target alone (checked by
chi-square over many rows)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from mlxserve.speculation.verify import NO_DRAFT, verify_greedy, verify_sampled

CHI2_3_DOF_AT_1E4 = 21.11  # chi-square's critical value, 3 degrees of freedom, alpha 1e-4


def test_greedy_keeps_drafts_while_the_argmax_agrees():
    argmax = [[3, 1, 2, 0], [0, 0, 0, 0], [2, 2, 1, 3]]
    logits = mx.array(np.eye(4, dtype=np.float32)[argmax])  # (3, 4, 4): one-hot at the argmax
    drafts = mx.array([[3, 1, 0], [1, 0, 0], [2, NO_DRAFT, NO_DRAFT]])
    kept, tokens = verify_greedy(logits, drafts)
    assert kept.tolist() == [2, 0, 1]  # row 0 refuses its third; row 1 its first; row 2 padded
    assert [t[: k + 1] for t, k in zip(tokens.tolist(), kept.tolist())] == [
        [3, 1, 2],
        [0],
        [2, 2],
    ]


def chi_square(observed: np.ndarray, expected_p: np.ndarray) -> float:
    expected = expected_p * observed.sum()
    return float(((observed - expected) ** 2 / expected).sum())


def test_sampled_rows_emit_the_targets_distribution():
    """Two positions, vocabulary of 4, one draft (token 2) per row, 40,000 rows at once: the
    first token emitted follows p0 (kept drafts and residual draws together), and the second,
    where the draft was kept, follows p1."""
    rows = 40_000
    p0 = np.array([0.1, 0.2, 0.4, 0.3])
    p1 = np.array([0.25, 0.05, 0.3, 0.4])
    logprobs = mx.broadcast_to(mx.log(mx.array(np.stack([p0, p1]), mx.float32)), (rows, 2, 4))
    drafts = mx.full((rows, 1), 2, mx.int32)
    kept, following = verify_sampled(logprobs, drafts, key=mx.random.key(7))
    kept, following = np.array(kept), np.array(following)
    first = np.where(kept == 1, 2, following)
    assert chi_square(np.bincount(first, minlength=4), p0) < CHI2_3_DOF_AT_1E4
    assert abs(kept.mean() - p0[2]) < 0.01  # a draft is kept with p0's probability for it
    second = following[kept == 1]
    assert chi_square(np.bincount(second, minlength=4), p1) < CHI2_3_DOF_AT_1E4


def test_a_refused_draft_is_never_the_token_drawn_in_its_place():
    logprobs = mx.log(mx.array([[[0.5, 0.5], [0.5, 0.5]]] * 2000, mx.float32))
    drafts = mx.zeros((2000, 1), mx.int32)
    kept, following = verify_sampled(logprobs, drafts, key=mx.random.key(1))
    refused = np.array(kept) == 0
    assert refused.any() and (np.array(following)[refused] == 1).all()


def test_rows_without_drafts_sample_the_first_position():
    rows = 20_000
    p0 = np.array([0.4, 0.1, 0.2, 0.3])
    logprobs = mx.broadcast_to(mx.log(mx.array(np.stack([p0, p0]), mx.float32)), (rows, 2, 4))
    kept, following = verify_sampled(logprobs, mx.full((rows, 1), NO_DRAFT, mx.int32))
    assert not np.array(kept).any()
    assert chi_square(np.bincount(np.array(following), minlength=4), p0) < CHI2_3_DOF_AT_1E4
