"""Embeddings through every door on a real server beside a generation model: the official
openai client (base64, as it asks by default, and floats), the ollama client's embed and
embeddings, llama.cpp's own /embedding body; the vectors equal a NumPy BERT's
(tests/numpy_bert.py), normalised where the door normalises; each bad input a 400 in the door's
shape naming it, and generation asked of the embedding model (or embeddings of a generation
model) refused saying which is which."""

from __future__ import annotations

import json

import httpx
import numpy as np
import ollama
import openai
import pytest

from .. import numpy_bert
from ..embedding_models import (
    build_tiny_bert,
    build_tiny_cross_encoder,
    build_tiny_decoder_embedder,
    build_tiny_gte,
    build_tiny_modernbert,
    build_tiny_nomic,
    build_tiny_yes_no_reranker,
)

TEXTS = ["a man is eating food.", "why is the sky blue?", "hello"]
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    return build_tiny_bert(tmp_path_factory.mktemp("embedding") / "tiny-bert")


@pytest.fixture(scope="module")
def served(live_servers, tiny_model, tiny_bert):
    return live_servers.shared(tiny_model, models=(str(tiny_bert),))


@pytest.fixture(scope="module")
def reference(tiny_bert):
    """text -> (token ids, the model's mean-pooled vector) from NumPy's BERT."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_bert))
    weights = numpy_bert.load_weights(tiny_bert)
    config = json.loads((tiny_bert / "config.json").read_text())

    def of(text: str) -> tuple[list[int], np.ndarray]:
        ids = tokenizer.encode(text)
        return ids, numpy_bert.mean_pooled(weights, config, ids)

    return of


def unit(vector: np.ndarray) -> np.ndarray:
    return vector / np.linalg.norm(vector)


@pytest.fixture
def client(served) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0)


def test_openai_client_embeds_a_list_and_a_string(client, reference):
    answer = client.embeddings.create(model="tiny-bert", input=TEXTS)  # base64 on the wire
    assert [d.index for d in answer.data] == [0, 1, 2]
    tokens = 0
    for text, datum in zip(TEXTS, answer.data):
        ids, vector = reference(text)
        tokens += len(ids)
        np.testing.assert_allclose(datum.embedding, unit(vector), atol=TOLERANCE)
    assert answer.usage.prompt_tokens == answer.usage.total_tokens == tokens
    assert answer.model == "tiny-bert"
    one = client.embeddings.create(model="tiny-bert", input=TEXTS[1], encoding_format="float")
    np.testing.assert_allclose(one.data[0].embedding, answer.data[1].embedding, atol=1e-6)


def test_token_ids_embed_as_their_text_does(client, reference):
    ids = [reference(t)[0] for t in TEXTS]
    by_text = client.embeddings.create(model="tiny-bert", input=TEXTS[:2])
    by_ids = client.embeddings.create(model="tiny-bert", input=ids[:2])
    one = client.embeddings.create(model="tiny-bert", input=ids[0])
    for a, b in zip(by_text.data, by_ids.data):
        np.testing.assert_allclose(a.embedding, b.embedding, atol=1e-6)
    np.testing.assert_allclose(one.data[0].embedding, by_text.data[0].embedding, atol=1e-6)


@pytest.mark.parametrize(
    ("body", "param", "says"),
    [
        ({"input": []}, "input", "empty list"),
        ({"input": ""}, "input", "empty string"),
        ({"input": ["ok", ""]}, "input", "'input[1]' is an empty string"),
        ({"input": 5}, "input", "must be a string"),
        ({"input": [{"text": "x"}]}, "input", "must be a string or a list of token ids"),
        ({"input": [[1, 2], []]}, "input", "empty list of tokens"),
        ({"input": [10**6]}, "input", "outside the vocabulary"),
        ({"input": ["x"] * 2049}, "input", "at most 2048"),
        ({"input": "word " * 100}, "input", "reads at most 64 tokens"),
        ({"input": "x", "dimensions": 8}, "dimensions", "Matryoshka"),
        ({"input": "x", "encoding_format": "int8"}, "encoding_format", "float"),
    ],
)
def test_bad_inputs_are_a_400_naming_them(served, body, param, says):
    answer = httpx.post(
        f"{served.url}/v1/embeddings", json={"model": "tiny-bert", **body}, timeout=60
    )
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == param and says in error["message"], error


def test_each_model_answers_only_what_it_is_for(served, client):
    with pytest.raises(openai.BadRequestError, match="is an embedding model"):
        client.completions.create(model="tiny-bert", prompt="hi", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="not an embedding model"):
        client.embeddings.create(model=served.engine.model_name, input="hi")


def test_ollama_embed_and_embeddings(served, reference):
    olla = ollama.Client(host=served.url)
    answer = olla.embed(model="tiny-bert", input=TEXTS)
    assert len(answer.embeddings) == 3 and answer.prompt_eval_count > 0
    for text, vector in zip(TEXTS, answer.embeddings):
        np.testing.assert_allclose(vector, unit(reference(text)[1]), atol=TOLERANCE)
    older = olla.embeddings(model="tiny-bert", prompt=TEXTS[0])  # the model's own, unscaled
    np.testing.assert_allclose(older.embedding, reference(TEXTS[0])[1], atol=TOLERANCE)
    assert olla.embed(model="tiny-bert", input="").embeddings == []  # Ollama: loads, no vectors


def test_ollama_truncates_unless_told_not_to(served):
    olla = ollama.Client(host=served.url)
    long = "word " * 100
    assert len(olla.embed(model="tiny-bert", input=long).embeddings[0]) == 32
    with pytest.raises(ollama.ResponseError) as refused:
        olla.embed(model="tiny-bert", input=long, truncate=False)
    assert refused.value.status_code == 400 and "reads at most 64 tokens" in refused.value.error


def test_llamacpp_embedding_body_and_its_normalisations(served, reference):
    url = f"{served.url}/embedding"
    ids, vector = reference(TEXTS[0])
    answer = httpx.post(url, json={"model": "tiny-bert", "content": TEXTS[0]}, timeout=60).json()
    assert [a["index"] for a in answer] == [0]
    np.testing.assert_allclose(answer[0]["embedding"][0], unit(vector), atol=TOLERANCE)
    raw = httpx.post(
        url, json={"model": "tiny-bert", "content": [ids], "embd_normalize": -1}, timeout=60
    )
    np.testing.assert_allclose(raw.json()[0]["embedding"][0], vector, atol=TOLERANCE)
    largest = httpx.post(
        url, json={"model": "tiny-bert", "content": TEXTS[0], "embd_normalize": 0}, timeout=60
    )
    assert max(abs(v) for v in largest.json()[0]["embedding"][0]) == pytest.approx(32760, abs=1)
    missing = httpx.post(url, json={"model": "tiny-bert"}, timeout=60)
    assert missing.status_code == 400 and "must be provided" in missing.json()["error"]["message"]


@pytest.fixture(scope="module")
def reranker(live_servers, tiny_model, tmp_path_factory):
    folder = build_tiny_cross_encoder(tmp_path_factory.mktemp("rerank") / "tiny-reranker")
    return folder, live_servers.shared(tiny_model, models=(str(folder),))


QUERY = "why is the sky blue?"
DOCUMENTS = ["the sky is blue", "a man is eating food.", "hello world", "blue"]


def expected_scores(folder) -> list[float]:
    """Each pair's sigmoid(logit) from NumPy's BERT, token types as BERT reads a pair."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    weights = numpy_bert.load_weights(folder)
    config = json.loads((folder / "config.json").read_text())
    scores = []
    for document in DOCUMENTS:
        pair = tokenizer(QUERY, document, return_token_type_ids=True)
        logit = numpy_bert.pair_score(weights, config, pair["input_ids"], pair["token_type_ids"])
        scores.append(1 / (1 + np.exp(-logit)))
    return scores


def test_rerank_scores_each_pair_and_orders_them(reranker):
    folder, live = reranker
    expected = expected_scores(folder)
    body = {"model": "tiny-reranker", "query": QUERY, "documents": DOCUMENTS}
    answer = httpx.post(f"{live.url}/v1/rerank", json=body, timeout=60).json()
    order = sorted(range(len(DOCUMENTS)), key=lambda i: -expected[i])
    assert [r["index"] for r in answer["results"]] == order
    for result in answer["results"]:
        assert result["relevance_score"] == pytest.approx(expected[result["index"]], abs=1e-4)
        assert "document" not in result
    assert answer["usage"]["total_tokens"] > 0
    top = httpx.post(
        f"{live.url}/rerank",  # llama.cpp's name; Cohere's objects; two best, with their text
        json={
            **body,
            "documents": [{"text": d} for d in DOCUMENTS],
            "top_n": 2,
            "return_documents": True,
        },
        timeout=60,
    ).json()
    assert [r["index"] for r in top["results"]] == order[:2]
    assert top["results"][0]["document"] == {"text": DOCUMENTS[order[0]]}
    tei = httpx.post(
        f"{live.url}/rerank",
        json={"model": "tiny-reranker", "query": QUERY, "texts": DOCUMENTS, "return_text": True},
        timeout=60,
    ).json()
    assert [r["index"] for r in tei] == order and tei[0]["text"] == DOCUMENTS[order[0]]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"query": QUERY, "documents": []}, "documents"),
        ({"query": QUERY, "documents": ["ok", ""]}, "documents"),
        ({"query": QUERY, "documents": [{"title": "x"}]}, "documents"),
        ({"query": "", "documents": ["a"]}, "query"),
        ({"query": QUERY, "documents": ["a"], "top_n": 0}, "top_n"),
        ({"query": "word " * 100, "documents": ["a"]}, "query"),
        (
            {"query": QUERY, "documents": ["a"], "instruction": "x"},
            "instruction",
        ),  # a cross-encoder
    ],
)
def test_bad_rerank_requests_are_a_400_naming_the_field(reranker, body, param):
    _, live = reranker
    answer = httpx.post(
        f"{live.url}/v1/rerank", json={"model": "tiny-reranker", **body}, timeout=60
    )
    assert answer.status_code == 400 and answer.json()["error"]["param"] == param, answer.text


def test_a_reranker_does_not_embed_nor_an_embedder_rerank(reranker, served):
    _, live = reranker
    answer = httpx.post(
        f"{live.url}/v1/embeddings", json={"model": "tiny-reranker", "input": "x"}, timeout=60
    )
    assert answer.status_code == 400 and "is a reranker" in answer.text
    answer = httpx.post(
        f"{served.url}/v1/rerank",
        json={"model": "tiny-bert", "query": "q", "documents": ["d"]},
        timeout=60,
    )
    assert answer.status_code == 400 and "is an embedding model" in answer.text


def test_model_lists_say_what_each_model_is(served, reranker):
    cards = {c["id"]: c for c in httpx.get(f"{served.url}/v1/models", timeout=60).json()["data"]}
    assert cards["tiny-bert"]["kind"] == "embed" and cards["tiny-bert"]["dimensions"] == 32
    assert cards[served.engine.model_name]["kind"] == "generate"
    _, live = reranker
    cards = {c["id"]: c for c in httpx.get(f"{live.url}/v1/models", timeout=60).json()["data"]}
    assert cards["tiny-reranker"]["kind"] == "rerank"
    show = httpx.post(f"{served.url}/api/show", json={"model": "tiny-bert"}, timeout=60)
    assert show.status_code == 200, show.text
    assert show.json()["capabilities"] == ["embedding"]
    tags = [m["name"] for m in httpx.get(f"{served.url}/api/tags", timeout=60).json()["models"]]
    assert "tiny-bert:latest" in tags


def test_loading_an_embedding_model_leaves_the_default_as_it_was(served):
    """The menubar's Load (POST /admin/load, `default` true unless told): requests naming no
    model are generation's, so an embedding model never becomes their default."""
    answer = httpx.post(f"{served.url}/admin/load", json={"model": "tiny-bert"}, timeout=60)
    assert answer.status_code == 200, answer.text
    assert answer.json()["model"] == served.engine.model_name
    chat = httpx.post(
        f"{served.url}/v1/completions", json={"prompt": "Hello", "max_tokens": 2}, timeout=60
    )
    assert chat.status_code == 200, chat.text


def test_a_named_instruction_goes_before_each_text(client, served):
    """sentence-transformers' `prompt_name`: the model's own instruction (here "query: ")."""
    named = client.embeddings.create(
        model="tiny-bert", input=["why?"], extra_body={"prompt_name": "query"}
    )
    written = client.embeddings.create(model="tiny-bert", input=["query: why?"])
    plain = client.embeddings.create(model="tiny-bert", input=["why?"])
    np.testing.assert_allclose(named.data[0].embedding, written.data[0].embedding, atol=1e-6)
    assert not np.allclose(named.data[0].embedding, plain.data[0].embedding, atol=1e-3)
    answer = httpx.post(
        f"{served.url}/v1/embeddings",
        json={"model": "tiny-bert", "input": "x", "prompt_name": "passage"},
        timeout=60,
    )
    assert answer.status_code == 400 and "document, query" in answer.json()["error"]["message"]


def test_llamacpp_pooling_none_gives_each_tokens_state(served, tiny_bert, reference):
    ids, _ = reference(TEXTS[0])
    body = {"model": "tiny-bert", "content": [TEXTS[0], "hello"], "pooling": "none"}
    answer = httpx.post(f"{served.url}/embedding", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    first, second = answer.json()
    assert (first["index"], second["index"]) == (0, 1)
    weights = numpy_bert.load_weights(tiny_bert)
    config = json.loads((tiny_bert / "config.json").read_text())
    expected = numpy_bert.hidden_states(weights, config, ids)
    np.testing.assert_allclose(first["embedding"], expected, atol=TOLERANCE)
    assert len(second["embedding"]) == len(reference("hello")[0])


def test_a_decoder_embedding_model_answers_its_last_tokens_state(
    live_servers, tiny_model, tmp_path_factory
):
    """An mlx-lm model with a sentence-transformers Pooling module (Qwen3-Embedding's kind):
    the last token's hidden state, normalised, as mlx-lm's model gives it alone."""
    import mlx.core as mx
    import mlx_lm

    folder = build_tiny_decoder_embedder(tiny_model, tmp_path_factory.mktemp("dec") / "tiny-dec")
    live = live_servers.shared(tiny_model, models=(str(folder),))
    rows = [[1, 5, 6, 7, 8], [1, 9]]
    body = {"model": "tiny-dec", "input": rows, "encoding_format": "float"}
    answer = httpx.post(f"{live.url}/v1/embeddings", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    model, _ = mlx_lm.load(str(tiny_model))
    for row, datum in zip(rows, answer.json()["data"]):
        alone = np.asarray(model.model(mx.array(row)[None])[0, -1])
        np.testing.assert_allclose(datum["embedding"], unit(alone), atol=1e-5)


def test_the_other_encoder_families_serve_their_doors(live_servers, tiny_model, tmp_path_factory):
    """The other encoder families through the doors their users come by: a NomicBERT (Ollama's
    nomic-embed-text) on Ollama's /api/embed, a GTE v1.5 on the openai client's embeddings, a
    ModernBERT reranker (gte-reranker-modernbert) and a GTE one (gte-multilingual-reranker)
    on /v1/rerank; vectors as the NumPy references', scores as the models' own in-process."""
    from transformers import AutoTokenizer

    from mlxserve.embedding.model import embedding_architecture, embedding_model, load_network

    from .. import numpy_bert, numpy_gte, numpy_nomic

    root = tmp_path_factory.mktemp("families")
    nomic = build_tiny_nomic(root / "tiny-nomic")
    modernbert = build_tiny_modernbert(root / "tiny-modernbert-rr", reranker=True)
    gte = build_tiny_gte(root / "tiny-gte")
    gte_reranker = build_tiny_gte(root / "tiny-gte-rr", reranker=True)
    served = (nomic, modernbert, gte, gte_reranker)
    live = live_servers.shared(tiny_model, models=tuple(map(str, served)))

    answer = ollama.Client(host=live.url).embed(model="tiny-nomic", input=TEXTS)
    tokenizer = AutoTokenizer.from_pretrained(str(nomic))
    weights = numpy_bert.load_weights(nomic)
    config = json.loads((nomic / "config.json").read_text())
    for text, vector in zip(TEXTS, answer.embeddings):
        pooled = numpy_nomic.hidden_states(weights, config, tokenizer.encode(text)).mean(0)
        np.testing.assert_allclose(vector, unit(pooled), atol=TOLERANCE)

    client = openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0)
    answer = client.embeddings.create(model="tiny-gte", input=TEXTS)
    weights = numpy_bert.load_weights(gte)
    config = json.loads((gte / "config.json").read_text())
    for text, datum in zip(TEXTS, answer.data):
        first = numpy_gte.hidden_states(weights, config, tokenizer.encode(text))[0]
        np.testing.assert_allclose(datum.embedding, unit(first), atol=TOLERANCE)

    for reranker in (modernbert, gte_reranker):
        body = {"model": reranker.name, "query": QUERY, "documents": DOCUMENTS}
        ranked = httpx.post(f"{live.url}/v1/rerank", json=body, timeout=60)
        assert ranked.status_code == 200, ranked.text
        network, config = load_network(reranker, embedding_architecture(reranker))
        model = embedding_model(reranker, network, config)
        tokenizer = AutoTokenizer.from_pretrained(str(reranker))
        rows = [tokenizer(QUERY, document)["input_ids"] for document in DOCUMENTS]
        logits = np.asarray(model.embed(rows))[:, 0]
        for result in ranked.json()["results"]:
            expected = 1 / (1 + np.exp(-logits[result["index"]]))
            assert result["relevance_score"] == pytest.approx(expected, abs=1e-4)


def test_a_language_model_reranker_judges_each_pair_in_its_prompt(
    live_servers, tiny_model, tmp_path_factory
):
    """Qwen3-Reranker's kind on /v1/rerank: each score is softmax("yes", "no") of mlx-lm's own
    model at the end of the pair's judging prompt; `instruction` changes the prompt's task."""
    import mlx.core as mx
    import mlx_lm
    from transformers import AutoTokenizer

    from mlxserve.embedding.yes_no import pair_rows

    folder = build_tiny_yes_no_reranker(tiny_model, tmp_path_factory.mktemp("yn") / "tiny-yn")
    live = live_servers.shared(tiny_model, models=(str(folder),))
    model, _ = mlx_lm.load(str(folder))
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    yes, no = tokenizer.convert_tokens_to_ids(["yes", "no"])

    def expected(instruction: str | None) -> list[float]:
        scores = []
        for document in DOCUMENTS:
            [row] = pair_rows(tokenizer, QUERY, [document], 2048, instruction)
            logits = model(mx.array(row)[None])[0, -1]
            scores.append(1 / (1 + np.exp(-float(logits[yes] - logits[no]))))
        return scores

    for instruction in (None, "Find the document that answers the question"):
        body = {"model": "tiny-yn", "query": QUERY, "documents": DOCUMENTS}
        if instruction:
            body["instruction"] = instruction
        answer = httpx.post(f"{live.url}/v1/rerank", json=body, timeout=60)
        assert answer.status_code == 200, answer.text
        want = expected(instruction)
        results = answer.json()["results"]
        assert [r["index"] for r in results] == sorted(range(len(want)), key=lambda i: -want[i])
        for result in results:
            assert result["relevance_score"] == pytest.approx(want[result["index"]], abs=1e-4)
    cards = {c["id"]: c for c in httpx.get(f"{live.url}/v1/models", timeout=60).json()["data"]}
    assert cards["tiny-yn"]["kind"] == "rerank"
