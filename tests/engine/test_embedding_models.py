"""Embedding models as the engine runs them: the MLX encoder's vectors equal a NumPy BERT's
(tests/numpy_bert.py) for every pooling, in batches of unequal inputs as alone; a decoder's
last-token vectors equal mlx-lm's own model read one input at a time; the engine batches many
requests' inputs together and each gets its own."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from mlxserve.embedding.model import (
    DECODER,
    ENCODER,
    embedding_architecture,
)
from mlxserve.embedding.pooling import Pooling, PoolingError
from mlxserve.engine import Engine
from mlxserve.engine.embedding_jobs import EmbeddingQueue, EmbedJob

from .. import numpy_bert
from ..embedding_models import build_tiny_bert, build_tiny_decoder_embedder, loaded, token_rows
from ..helpers import skip_for_missing
from ..mlx_embeddings_reference import model_module

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import fetch_embedding_model  # noqa: E402

TEXTS = ["a man is eating food.", "why is the sky blue?", "hello", "def f(x): return x + 1"]
TOLERANCE = 1e-4  # float32 against float64 over two layers


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory) -> Path:
    return build_tiny_bert(tmp_path_factory.mktemp("embedding") / "tiny-bert")


def test_the_folder_says_what_it_is(tiny_bert, tiny_model, tmp_path):
    assert embedding_architecture(tiny_bert) == ENCODER
    assert embedding_architecture(tiny_model) is None  # a generation model
    decoder = build_tiny_decoder_embedder(tiny_model, tmp_path / "decoder")
    assert embedding_architecture(decoder) == DECODER
    model, _ = loaded(tiny_bert)
    assert model.pooling == Pooling("mean", normalize=False)
    assert model.dimensions == 32 and model.max_tokens == 64


@pytest.mark.parametrize("mode", ["mean", "cls", "max", "mean_sqrt_len"])
def test_encoder_vectors_equal_numpy_berts_in_a_padded_batch(tiny_bert, mode):
    model, config = loaded(tiny_bert)
    model.pooling = Pooling(mode)
    rows = token_rows(tiny_bert, TEXTS)
    assert len({len(r) for r in rows}) > 1  # the batch pads
    vectors = np.asarray(model.embed(rows))
    weights = numpy_bert.load_weights(tiny_bert)
    for row, vector in zip(rows, vectors):
        states = numpy_bert.hidden_states(weights, config, row)
        expected = {
            "mean": states.mean(0),
            "cls": states[0],
            "max": states.max(0),
            "mean_sqrt_len": states.sum(0) / np.sqrt(len(row)),
        }[mode]
        np.testing.assert_allclose(vector, expected, atol=TOLERANCE, rtol=TOLERANCE)


def test_normalised_pooling_gives_unit_vectors(tiny_bert):
    model, _ = loaded(tiny_bert)
    model.pooling = Pooling("mean", normalize=True)
    vectors = np.asarray(model.embed(token_rows(tiny_bert, TEXTS)))
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_a_decoders_last_token_vectors_equal_mlx_lms_model_alone(tiny_model, tmp_path):
    folder = build_tiny_decoder_embedder(tiny_model, tmp_path / "decoder", normalize=False)
    model, _ = loaded(folder)
    rows = [[1, 5, 6, 7, 8], [1, 9], [1, 40, 41, 42, 43, 44, 45]]
    vectors = np.asarray(model.embed(rows))
    for row, vector in zip(rows, vectors):
        alone = model.network.model(mx.array(row)[None])[0, -1]
        np.testing.assert_allclose(vector, np.asarray(alone), atol=1e-5, rtol=1e-5)


def test_pipelines_this_server_cannot_run_are_refused_saying_which_part(tiny_bert, tmp_path):
    folder = tmp_path / "dense"
    folder.mkdir()
    modules = json.loads((tiny_bert / "modules.json").read_text())
    modules.append({"idx": 2, "path": "2_Dense", "type": "sentence_transformers.models.Dense"})
    (folder / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(PoolingError, match="Dense module"):
        Pooling.of_folder(folder, "mean")


def test_the_engine_batches_requests_and_each_gets_its_own_vectors(tiny_bert):
    engine = Engine(str(tiny_bert)).start()
    try:
        assert engine.wait_ready(300), engine.error
        assert engine.loaded.kind == "embed" and engine.loaded.dimensions == 32
        engine.embedder.batch_tokens = 24  # several batches, rows of two requests in one
        rows = token_rows(tiny_bert, TEXTS)
        model, config = loaded(tiny_bert)
        weights = numpy_bert.load_weights(tiny_bert)

        async def together():
            return await asyncio.gather(engine.embed(rows), engine.embed(rows[::-1]))

        first, second = asyncio.run(together())
        for row, a, b in zip(rows, first, second[::-1]):
            expected = numpy_bert.mean_pooled(weights, config, row)
            np.testing.assert_allclose(a, expected, atol=TOLERANCE, rtol=TOLERANCE)
            np.testing.assert_allclose(b, expected, atol=TOLERANCE, rtol=TOLERANCE)
        assert engine.stats.embedded_inputs == 2 * len(rows)
    finally:
        engine.stop()


def test_all_minilm_l6_v2_vectors_equal_numpy_berts():
    """A real sentence-transformers model (scripts/fetch_embedding_model.py): MLX's vectors are
    NumPy's, and they do what embeddings are for (a paraphrase is near, another topic far)."""
    folder = fetch_embedding_model.FOLDER
    if not (folder / "model.safetensors").exists():
        skip_for_missing(f"{folder} is absent: scripts/fetch_embedding_model.py fetches it")
    model, config = loaded(folder)
    assert model.pooling == Pooling("mean", normalize=True) and model.max_tokens == 256
    sentences = ["A man is eating food.", "A man is eating a piece of bread.", "The sky is blue."]
    rows = token_rows(folder, sentences)
    vectors = np.asarray(model.embed(rows))
    weights = numpy_bert.load_weights(folder)
    for row, vector in zip(rows, vectors):
        expected = numpy_bert.mean_pooled(weights, config, row, normalize=True)
        np.testing.assert_allclose(vector, expected, atol=1e-5)
    similar = vectors @ vectors.T
    assert similar[0, 1] > 0.6 > 0.2 > similar[0, 2]


def test_all_minilm_l6_v2_vectors_equal_mlx_embeddings_own_encode():
    """The same real model through mlx-embeddings' BERT (the MLX field's embedding library), a
    padded batch with its attention mask: its mean-pooled, normalised `text_embeds`."""
    folder = fetch_embedding_model.FOLDER
    if not (folder / "model.safetensors").exists():
        skip_for_missing(f"{folder} is absent: scripts/fetch_embedding_model.py fetches it")
    module = model_module("bert")
    reference = module.Model(
        module.ModelArgs.from_dict(json.loads((folder / "config.json").read_text()))
    )
    weights = mx.load(str(folder / "model.safetensors"))
    reference.load_weights(list(reference.sanitize(weights).items()), strict=True)
    reference.eval()  # its dropout off (an MLX module trains until told otherwise)
    model, _ = loaded(folder)
    rows = token_rows(folder, TEXTS)
    longest = max(map(len, rows))
    ids = mx.array([row + [0] * (longest - len(row)) for row in rows])
    mask = mx.array([[1] * len(row) + [0] * (longest - len(row)) for row in rows])
    expected = reference(ids, attention_mask=mask).text_embeds
    np.testing.assert_allclose(np.asarray(model.embed(rows)), np.asarray(expected), atol=1e-5)


def test_an_encoder_family_not_run_here_is_refused_by_name(tiny_bert, tmp_path):
    folder = tmp_path / "mpnet"
    folder.mkdir()
    config = json.loads((tiny_bert / "config.json").read_text()) | {"model_type": "mpnet"}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes((tiny_bert / "model.safetensors").read_bytes())
    engine = Engine(str(folder)).start()
    try:
        assert not engine.wait_ready(300)
        assert "mpnet encoders are not supported yet" in engine.error
    finally:
        engine.stop()


def test_beside_streams_an_encoders_batch_goes_through_its_layers_a_few_a_turn(tiny_bert):
    """With a budget too small for the whole pass (other models' streams wait on each turn),
    the first turns run one layer of one row, then as many as fit; the vectors are the same."""
    model, config = loaded(tiny_bert)
    queue = EmbeddingQueue(model)
    rows = token_rows(tiny_bert, TEXTS)
    loop = asyncio.new_event_loop()
    try:
        job = EmbedJob(rows, loop, loop.create_future())
        queue.add(job)
        turns, depths = 0, []
        while not job.future.done():
            queue.step(budget_s=1e-9)  # nothing fits: one layer of one row a turn
            if queue.current is not None:
                depths.append(queue.current[1].done)
            turns += 1
            loop.run_until_complete(asyncio.sleep(0))
        vectors = job.future.result()
    finally:
        loop.close()
    assert turns == len(rows) * model.layers and depths[0] == 1
    weights = numpy_bert.load_weights(tiny_bert)
    for row, vector in zip(rows, vectors):
        expected = numpy_bert.mean_pooled(weights, config, row)
        np.testing.assert_allclose(vector, expected, atol=TOLERANCE, rtol=TOLERANCE)
