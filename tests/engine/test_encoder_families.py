"""Embedding and reranking families beside BERT, each against a reference in a padded batch of
unequal inputs: ModernBERT's hidden states and reranker scores equal mlx-embeddings' own
ModernBERT's (read one input at a time), NomicBERT's vectors a NumPy model of Nomic's reference,
GTE v1.5's vectors and its reranker's scores a NumPy model of Alibaba-NLP's reference,
and each one's batch gone through its layers a few a turn (beside streams) gives the same
vectors; a language-model reranker (Qwen3-Reranker's kind) scores as mlx-lm's model alone."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from safetensors.numpy import load_file

from mlxserve.embedding.kinds import YES_NO, model_kind
from mlxserve.embedding.model import (
    ENCODER,
    RERANKER,
    embedding_architecture,
)

from .. import numpy_bert, numpy_gte, numpy_nomic
from ..embedding_models import (
    TINY_MODERNBERT,
    build_tiny_gte,
    build_tiny_modernbert,
    build_tiny_nomic,
    build_tiny_yes_no_reranker,
    loaded,
    token_rows,
)
from ..mlx_embeddings_reference import model_module

# Longer than ModernBERT's tiny sliding window (2 tokens each side), of unequal lengths
TEXTS = [
    "a man is eating food with a child and a dog.",
    "why is the sky blue?",
    "hello",
    "def f(x): return x + 1",
]
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {
        "modernbert": build_tiny_modernbert(root / "modernbert"),
        "modernbert-reranker": build_tiny_modernbert(root / "modernbert-rr", reranker=True),
        "nomic": build_tiny_nomic(root / "nomic"),
        "gte": build_tiny_gte(root / "gte"),
        "gte-reranker": build_tiny_gte(root / "gte-rr", reranker=True),
    }


def reference_modernbert(folder: Path):
    """mlx-embeddings' ModernBERT with the folder's config and weights."""
    module = model_module("modernbert")
    config = json.loads((folder / "config.json").read_text())
    args = module.ModelArgs.from_dict(config)
    if "id2label" in config:
        args.id2label = config["id2label"]
    reference = module.Model(args)
    weights = {k: mx.array(v) for k, v in load_file(str(folder / "model.safetensors")).items()}
    if args.architectures == ["ModernBertForMaskedLM"]:
        weights["decoder.weight"] = weights["model.embeddings.tok_embeddings.weight"]
    reference.load_weights(list(weights.items()), strict=False)
    reference.eval()  # its dropout off (an MLX module trains until told otherwise)
    # mlx-embeddings 0.1.0 runs ModernBERT's "gelu" as the tanh approximation; Hugging Face's
    # model (the checkpoints' own) runs it exact, as mlxserve does
    for layer in reference.model.layers:
        layer.mlp.act = nn.GELU()
    if hasattr(reference, "head"):
        reference.head.act = nn.GELU()
    return reference


def test_the_folders_say_what_they_are(folders):
    assert embedding_architecture(folders["modernbert"]) == ENCODER
    assert embedding_architecture(folders["modernbert-reranker"]) == RERANKER
    assert embedding_architecture(folders["nomic"]) == ENCODER
    model, _ = loaded(folders["modernbert"])
    assert (model.dimensions, model.max_tokens, model.layers) == (32, 64, 4)
    model, _ = loaded(folders["nomic"])
    assert (model.dimensions, model.max_tokens, model.layers) == (32, 64, 2)
    assert model.pooling.normalize and model.prompts["query"] == "search_query: "
    assert embedding_architecture(folders["gte"]) == ENCODER
    assert embedding_architecture(folders["gte-reranker"]) == RERANKER
    model, _ = loaded(folders["gte"])
    assert (model.dimensions, model.max_tokens, model.layers) == (32, 32, 2)


def test_modernbert_states_equal_mlx_embeddings_one_input_at_a_time(folders):
    folder = folders["modernbert"]
    model, _ = loaded(folder)
    rows = token_rows(folder, TEXTS)
    assert max(map(len, rows)) > TINY_MODERNBERT["local_attention"] + 2  # windows matter
    states = np.asarray(model.token_states(rows))
    reference = reference_modernbert(folder)
    for row, state in zip(rows, states):
        ids = mx.array([row])
        alone = reference.model(ids, attention_mask=mx.ones(ids.shape))["last_hidden_state"]
        np.testing.assert_allclose(state[: len(row)], np.asarray(alone[0]), atol=TOLERANCE)


def test_modernbert_reranker_scores_equal_mlx_embeddings(folders):
    folder = folders["modernbert-reranker"]
    model, _ = loaded(folder)
    rows = token_rows(folder, [f"{a} [SEP] {b}" for a, b in zip(TEXTS, TEXTS[::-1])])
    scores = np.asarray(model.embed(rows))[:, 0]
    reference = reference_modernbert(folder)
    expected = []
    for row in rows:
        ids = mx.array([row])
        probability = reference(ids, attention_mask=mx.ones(ids.shape)).pooler_output
        expected.append(float(probability[0, 0]))
    np.testing.assert_allclose(1 / (1 + np.exp(-scores)), expected, atol=TOLERANCE)
    assert np.ptp(scores) > 0.1  # the pairs score apart


def test_nomic_vectors_equal_a_numpy_model_of_nomics_reference(folders):
    folder = folders["nomic"]
    model, config = loaded(folder)
    rows = token_rows(folder, TEXTS)
    vectors = np.asarray(model.embed(rows))
    weights = numpy_bert.load_weights(folder)
    for row, vector in zip(rows, vectors):
        pooled = numpy_nomic.hidden_states(weights, config, row).mean(0)
        np.testing.assert_allclose(vector, pooled / np.linalg.norm(pooled), atol=TOLERANCE)


def test_gte_vectors_equal_a_numpy_model_of_alibabas_reference(folders):
    """NTK-scaled rotary positions and each row's own log-length query scale, in a padded
    batch: the first token's state, normalised, as the reference's."""
    folder = folders["gte"]
    model, config = loaded(folder)
    rows = token_rows(folder, TEXTS)
    assert len({len(row) for row in rows}) == len(rows)  # each row its own query scale
    vectors = np.asarray(model.embed(rows))
    weights = numpy_bert.load_weights(folder)
    for row, vector in zip(rows, vectors):
        first = numpy_gte.hidden_states(weights, config, row)[0]
        np.testing.assert_allclose(vector, first / np.linalg.norm(first), atol=TOLERANCE)


def test_gte_reranker_scores_equal_a_numpy_model_of_alibabas_reference(folders):
    folder = folders["gte-reranker"]
    model, config = loaded(folder)
    rows = token_rows(folder, [f"{a} [SEP] {b}" for a, b in zip(TEXTS, TEXTS[::-1])])
    scores = np.asarray(model.embed(rows))[:, 0]
    weights = numpy_bert.load_weights(folder)
    expected = [numpy_gte.pair_score(weights, config, row) for row in rows]
    np.testing.assert_allclose(scores, expected, atol=TOLERANCE)
    assert np.ptp(scores) > 0.1  # the pairs score apart


@pytest.mark.parametrize(
    "name", ["modernbert", "modernbert-reranker", "nomic", "gte", "gte-reranker"]
)
def test_a_padded_batch_a_layer_a_turn_gives_what_one_pass_gives(folders, name):
    """Beside streams a batch goes through its layers over several turns (`begin`, `advance`,
    `finish`, as EmbeddingQueue runs it): ModernBERT's two masks and its final norm, the
    reranker's pooled head, come out as in one pass."""
    model, _ = loaded(folders[name])
    rows = token_rows(folders[name], TEXTS)
    whole = np.asarray(model.embed(rows))
    part = model.begin(rows)
    turns = 0
    while part.done < model.layers:
        model.advance(part, 1)
        mx.eval(part.x)
        turns += 1
    assert turns == model.layers
    np.testing.assert_allclose(np.asarray(model.finish(part)), whole, atol=1e-5)


def qwen3_config_folder(root: Path, *parts: str) -> Path:
    folder = root.joinpath(*parts)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    return folder


def test_a_qwen3_named_a_reranker_is_one_and_a_qwen3_chat_model_is_not(tmp_path):
    """Qwen3-Reranker's config says only "Qwen3ForCausalLM": the name tells it, in a Hugging
    Face cache's repository folder or LM Studio's."""
    cached = ("models--Qwen--Qwen3-Reranker-0.6B", "snapshots", "0123abc")
    assert embedding_architecture(qwen3_config_folder(tmp_path, *cached)) == YES_NO
    lmstudio = qwen3_config_folder(tmp_path, "mlx-community", "Qwen3-Reranker-4B-4bit")
    assert model_kind(lmstudio) == "rerank"
    chat = qwen3_config_folder(tmp_path, "models--Qwen--Qwen3-0.6B", "snapshots", "0123abc")
    assert embedding_architecture(chat) is None and model_kind(chat) == "generate"


def test_a_language_model_reranker_scores_yes_against_no_at_its_prompts_end(tiny_model, tmp_path):
    """Each pair in the judging prompt (the model card's), scored in one padded batch as
    mlx-lm's model scores it alone: the "yes" logit less the "no" one at the last position."""
    import mlx_lm
    from transformers import AutoTokenizer

    from mlxserve.embedding.yes_no import HEAD, TAIL, pair_rows

    folder = build_tiny_yes_no_reranker(tiny_model, tmp_path / "tiny-yn")
    model, _ = loaded(folder)
    assert model.kind == "rerank" and model.dimensions == 1 and model.layers == 0
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    yes, no = tokenizer.convert_tokens_to_ids(["yes", "no"])
    assert model.answer_ids == (yes, no)
    rows = pair_rows(tokenizer, "why is the sky blue?", TEXTS, 512, None)
    assert rows[0][: len(tokenizer.encode(HEAD, add_special_tokens=False))] == tokenizer.encode(
        HEAD, add_special_tokens=False
    )
    assert rows[0][-len(tokenizer.encode(TAIL, add_special_tokens=False)) :] == tokenizer.encode(
        TAIL, add_special_tokens=False
    )
    assert len({len(r) for r in rows}) > 1  # the batch pads
    scores = np.asarray(model.embed(rows))[:, 0]
    reference, _ = mlx_lm.load(str(folder))
    for row, score in zip(rows, scores):
        logits = reference(mx.array(row)[None])[0, -1]
        assert score == pytest.approx(float(logits[yes] - logits[no]), abs=1e-4)
    assert np.ptp(scores) > 0.01  # the documents score apart
    limit = len(rows[0]) + 8
    [short] = pair_rows(tokenizer, "why is the sky blue?", [TEXTS[0] * 20], limit, None)
    assert len(short) == limit and short[-3:] == rows[0][-3:]  # the document cut, not the tail
    assert pair_rows(tokenizer, "why " * 200, ["a"], limit, None) is None
