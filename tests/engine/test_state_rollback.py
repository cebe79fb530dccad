"""A verify pass over a batch of a model whose caches cannot be trimmed (linear attention's
states, a sliding window shorter than the prompt, Mamba-2's states): after its state is put back
and fed again what each row kept, every row decodes exactly as the same row alone, fed only the
tokens it kept. Rows keep different numbers, so the feeding is right-padded."""

from __future__ import annotations

import mlx.core as mx
import mlx_lm
import pytest
from mlx_lm.models.cache import make_prompt_cache

from mlxserve.engine.mlx_lm_compat import ssm_lengths
from mlxserve.engine.mlx_lm_compat.state_rollback import StateSnapshot, positional, refeed
from mlxserve.tiny_families import build_tiny_family

from ..device_numerics import LOGPROB_TOLERANCE
from .verify_rows import alone, assert_each_decodes_as_alone, decoded_after

# prompts past gemma3_text's window (64), of unequal lengths
PROMPTS = [[(i * 13 + 5) % 900 + 20 for i in range(90)], [11, 4, 30], list(range(40, 110))]
# per row: what a verify pass feeds after its prompt (the last token and 3 drafts), and how
# many of them the row keeps
FED = [[12, 40, 41, 42], [6, 7, 50, 51], [19, 20, 21, 22]]
KEPT = [1, 3, 4]  # the third row keeps everything, the first only its last token


@pytest.fixture(scope="module", params=["qwen3_5", "gemma3_text", "nemotron_h"])
def model(request, tmp_path_factory):
    ssm_lengths.install()  # as the server's batch does: Nemotron-H's rows stop at their lengths
    families = tmp_path_factory.getbasetemp() / "families"
    folder = build_tiny_family(request.param, families / request.param)
    loaded, _ = mlx_lm.load(str(folder))
    return loaded


def batched(model, steps: int, put_back=refeed) -> list[list[mx.array]]:
    """The rows read alone, merged into one batch (as mlx-lm batches rows with history), then
    one verify pass and `put_back`."""
    rows = []
    for prompt in PROMPTS:
        cache = make_prompt_cache(model)
        model(mx.array(prompt)[None], cache=cache)
        rows.append(cache)
    caches = [rows[0][i].merge([row[i] for row in rows]) for i in range(len(rows[0]))]
    assert not positional(caches)
    fed = mx.array(FED)
    snapshot = StateSnapshot(caches)
    verify = model(fed, cache=caches)
    put_back(model, caches, snapshot, fed, [k - 1 for k in KEPT])
    return decoded_after(model, caches, verify, KEPT, steps)


def test_rows_fed_again_what_they_kept_decode_as_each_alone(model):
    steps = 6
    together = batched(model, steps)
    assert_each_decodes_as_alone(model, together, PROMPTS, FED, KEPT, steps)


def test_without_being_put_back_a_row_would_differ(model):
    """The check above can fail: the same batch left as the verify pass left it, the first
    row's rejected drafts read into its state."""

    def left_as_is(model, caches, snapshot, fed, kept):
        return None

    together = batched(model, 2, put_back=left_as_is)
    reference = alone(model, PROMPTS[0] + FED[0][: KEPT[0]], 2)
    assert not mx.allclose(together[0][1], reference[1], atol=LOGPROB_TOLERANCE).item()
