"""Ollama's model routes through the official `ollama` client on a real server: the probes,
the list, one model's details, the loaded one, and the routes a registry would have."""

from __future__ import annotations

import httpx
import ollama
import pytest


@pytest.fixture
def client(server) -> ollama.Client:
    return ollama.Client(host=server.url)


def test_the_probes_say_it_is_running(server):
    root = httpx.get(server.url + "/", timeout=60)
    assert root.status_code == 200 and "Ollama is running" in root.text
    assert httpx.head(server.url + "/", timeout=60).status_code == 200
    version = httpx.get(server.url + "/api/version", timeout=60).json()["version"]
    assert [int(part) for part in version.split(".")] >= [0, 5, 0]


def test_list_names_the_served_model_with_a_tag_and_its_details(client, server):
    models = client.list().models
    served = models[0]
    assert served.model == f"{server.engine.model_name}:latest"
    assert served.size > 0 and len(served.digest) == 64 and served.modified_at is not None
    details = served.details
    assert details.format == "safetensors" and details.family == "llama"
    assert details.parameter_size.endswith(("K", "M", "B"))
    assert {m.model for m in models} == {m.model for m in client.list().models}  # stable


def test_show_gives_details_template_context_and_capabilities(client, server):
    name = server.engine.model_name
    for asked in (name, f"{name}:latest"):
        shown = client.show(asked)
        assert "completion" in shown.capabilities and "tools" in shown.capabilities
        info = shown.modelinfo
        assert info["general.architecture"] == "llama"
        assert info["llama.context_length"] == server.engine.loaded.context_length
        assert info["general.parameter_count"] > 0
        assert shown.details.family == "llama"
    assert isinstance(client.show(name).template, str)


def test_show_says_a_fim_model_can_insert(live_server, tiny_coder):
    live = live_server(tiny_coder)
    shown = ollama.Client(host=live.url).show(live.engine.model_name)
    assert "insert" in shown.capabilities


def test_ps_lists_the_loaded_model(client, server):
    running = client.ps().models
    assert len(running) == 1
    model = running[0]
    assert model.model == f"{server.engine.model_name}:latest"
    assert model.size > 0 and model.size_vram == model.size
    assert model.expires_at is not None


def test_an_unknown_model_is_ollamas_404(client):
    with pytest.raises(ollama.ResponseError) as raised:
        client.show("llama3.2:3b")
    assert raised.value.status_code == 404
    assert raised.value.error == 'model "llama3.2:3b" not found, try pulling it first'


def test_registry_routes_say_what_this_server_does_instead(client, server):
    with pytest.raises(ollama.ResponseError) as raised:
        client.pull("llama3.2")
    assert raised.value.status_code == 501 and "Hugging Face cache" in raised.value.error
    for method, path in (("POST", "/api/copy"), ("DELETE", "/api/delete"), ("POST", "/api/push")):
        response = httpx.request(method, server.url + path, json={"model": "x"}, timeout=60)
        assert response.status_code == 501 and set(response.json()) == {"error"}


def test_the_api_key_applies_but_probes_stay_open(live_server, tiny_model):
    live = live_server(tiny_model, api_key="s3cret")
    assert httpx.get(live.url + "/", timeout=60).status_code == 200
    assert httpx.get(live.url + "/api/version", timeout=60).status_code == 200
    refused = httpx.get(live.url + "/api/tags", timeout=60)
    assert refused.status_code == 401 and set(refused.json()) == {"error"}
    keyed = ollama.Client(host=live.url, headers={"Authorization": "Bearer s3cret"})
    assert keyed.list().models
