"""Model management: the registry in /v1/models, loading another model (requests in flight go
on), unloading on idle and reloading on the next request, the allow-list of names."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest

# The HTTP contract alone: the platform policy does not change it (not in the portable pass).
pytestmark = pytest.mark.http_only

PROMPT = "def main():\n"


def greedy(http, max_tokens=8, **extra):
    body = {"prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    response = http.post("/v1/completions", json=body | extra)
    assert response.status_code == 200, response.text
    return response.json()


def wait_for(http, state, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = http.get("/admin/status").json()
        if status["state"] == state:
            return status
        time.sleep(0.05)
    raise AssertionError(f"never {state}: {status}")


def test_models_lists_the_registry_with_facts_from_disk(live_server, tiny_model, tiny_models_dir):
    live = live_server(tiny_model, models_dirs=(str(tiny_models_dir),))
    with httpx.Client(base_url=live.url, timeout=60) as http:
        models = {m["id"]: m for m in http.get("/v1/models").json()["data"]}
    assert models["tiny"]["loaded"] is True and models["tiny2"]["loaded"] is False
    assert "broken" not in models or models["broken"]["loaded"] is False
    tiny2 = models["tiny2"]
    assert tiny2["context_length"] == 2048 and tiny2["quantization"] == "float32"
    assert tiny2["size_bytes"] > 100_000 and tiny2["fim"] is None
    assert models["mlxserve-demo-coder"]["fim"] == "starcoder-spm"


def test_unknown_names_and_paths_never_load(live_server, tiny_model, tiny_models_dir):
    """/admin/load refuses them; a request naming one is answered by the loaded model (404
    under --strict-model-names: tests/api/test_lenient_requests.py)."""
    live = live_server(tiny_model, models_dirs=(str(tiny_models_dir),), allow_switch=True)
    with httpx.Client(base_url=live.url, timeout=60) as http:
        for name in ("gpt-9", str(tiny_models_dir / "tiny2"), "/etc", "../shared/models/x"):
            response = http.post("/admin/load", json={"model": name})
            assert response.status_code == 404, name
            assert response.json()["error"]["code"] == "model_not_found"
            response = http.post("/v1/completions", json={"prompt": "x", "model": name})
            assert response.status_code == 200, name
            assert response.json()["model"] == "tiny"
        assert http.get("/admin/status").json()["model"] == "tiny"


def wait_until_default(http, name, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = http.get("/admin/status").json()
        if status["model"] == name and status["state"] == "ready":
            return status
        time.sleep(0.05)
    raise AssertionError(f"{name} never the default: {status}")


def test_admin_load_loads_beside_and_becomes_the_default_once_ready(
    live_server, tiny_model, tiny_models_dir
):
    """The request in flight finishes on the old model, untouched; the new one becomes the
    default once loaded, and both stay in memory (the budget holds both)."""
    live = live_server(tiny_model, own=True, models_dirs=(str(tiny_models_dir),))
    with httpx.Client(base_url=live.url, timeout=120) as http:
        old_text = greedy(http, max_tokens=200)["choices"][0]["text"]
        chunks: list[dict] = []

        def stream() -> None:
            body = {
                "prompt": PROMPT,
                "max_tokens": 200,
                "temperature": 0,
                "ignore_eos": True,
                "stream": True,
            }
            with httpx.Client(base_url=live.url, timeout=120) as own:
                with own.stream("POST", "/v1/completions", json=body) as response:
                    for line in response.iter_lines():
                        if line.startswith("data: {"):
                            chunks.append(json.loads(line[6:]))

        streaming = threading.Thread(target=stream)
        streaming.start()
        while not chunks:
            time.sleep(0.01)
        switched = http.post("/admin/load", json={"model": "tiny2"})
        assert switched.status_code == 202
        assert switched.json()["model"] == "tiny"  # the default until tiny2 is ready
        streaming.join(120)
        assert "".join(c["choices"][0]["text"] for c in chunks) == old_text
        assert chunks[-1]["model"] == "tiny"
        status = wait_until_default(http, "tiny2")
        after = greedy(http, max_tokens=200)
        assert after["model"] == "tiny2" and after["choices"][0]["text"] != old_text
        assert greedy(http, max_tokens=200, model="tiny")["choices"][0]["text"] == old_text
        models = {m["id"]: m["loaded"] for m in http.get("/v1/models").json()["data"]}
        assert models["tiny2"] is True and models["tiny"] is True
        resident = {m["model"]: m for m in status["models"]}
        assert resident["tiny2"]["default"] and not resident["tiny"]["default"]
        assert resident["tiny"]["memory_bytes"] > 0 and resident["tiny2"]["memory_bytes"] > 0


def test_a_failed_load_keeps_the_default_and_says_why(live_server, tiny_model, tiny_models_dir):
    live = live_server(tiny_model, own=True, models_dirs=(str(tiny_models_dir),))
    with httpx.Client(base_url=live.url, timeout=60) as http:
        if "broken" not in [m["id"] for m in http.get("/v1/models").json()["data"]]:
            pytest.skip("the registry did not list the broken folder")
        assert http.post("/admin/load", json={"model": "broken"}).status_code == 202
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            status = http.get("/admin/status").json()
            broken = {m["model"]: m for m in status["models"]}.get("broken")
            if broken is not None and broken["state"] == "error":
                break
            time.sleep(0.05)
        assert broken["state"] == "error" and "broken" in broken["error"]
        assert status["model"] == "tiny" and status["state"] == "ready"
        assert greedy(http)["model"] == "tiny"


def test_a_request_may_switch_only_with_allow_switch(live_server, tiny_model, tiny_models_dir):
    models_dirs = (str(tiny_models_dir),)
    with httpx.Client(
        base_url=live_server(tiny_model, models_dirs=models_dirs).url, timeout=60
    ) as http:
        # Without it, the loaded model answers (a 400 under --strict-model-names).
        assert greedy(http, model="tiny2")["model"] == "tiny"
    switching = live_server(tiny_model, own=True, models_dirs=models_dirs, allow_switch=True)
    with httpx.Client(base_url=switching.url, timeout=60) as http:
        assert greedy(http, model="tiny2")["model"] == "tiny2"
        assert greedy(http, model="tiny")["model"] == "tiny"


def test_idle_unload_frees_the_model_and_the_next_request_reloads_it(live_server, tiny_model):
    live = live_server(tiny_model, own=True, idle_unload_s=3)
    with httpx.Client(base_url=live.url, timeout=60) as http:
        first = greedy(http)
        loaded_memory = http.get("/admin/status").json()["memory_bytes"]
        status = wait_for(http, "unloaded")
        # MLX's counter is the process's (other test servers share it): the weights go.
        weights = (tiny_model / "model.safetensors").stat().st_size
        assert loaded_memory - status["memory_bytes"] >= 0.9 * weights
        assert live.engine.loaded is None
        again = greedy(http)  # waits for the reload
        assert again["choices"][0]["text"] == first["choices"][0]["text"]
        assert live.engine.loads == 2
        assert http.post("/admin/unload").status_code == 202
        wait_for(http, "unloaded")
        assert greedy(http)["choices"][0]["text"] == first["choices"][0]["text"]


def test_a_model_unloaded_again_before_its_request_reaches_it_is_loaded_once_more(
    live_server, tiny_model
):
    """A request waits for its model's load; before it reaches the model, the model is
    unloaded again (an idle unload shorter than the machine's pause): it is loaded once more,
    not a 503."""
    live = live_server(tiny_model, own=True)
    engine = live.engine
    ensure_loaded = engine.ensure_loaded
    unloaded: list[bool] = []

    async def then_unloaded(timeout: float) -> None:
        await ensure_loaded(timeout)
        if not unloaded:
            unloaded.append(True)
            engine.unload()
            while engine.state != "unloaded":
                await asyncio.sleep(0.01)

    engine.ensure_loaded = then_unloaded
    with httpx.Client(base_url=live.url, timeout=60) as http:
        greedy(http)
    assert unloaded and engine.loads == 2


def test_a_model_gone_by_the_time_a_request_is_submitted_is_a_503_in_each_doors_shape(
    live_server, tiny_model
):
    """The model leaves after the request's checks and before its submission (a failure, an
    unload an admin asked for): 503 with Retry-After in the door's own error shape, not a 500."""
    from mlxserve.engine import EngineError

    live = live_server(tiny_model, own=True)
    engine = live.engine
    check_ready = engine.check_ready
    calls = []

    def gone_at_submission():
        calls.append(None)
        if len(calls) % 2 == 0:  # the checks' call passes, the submission's finds it gone
            raise EngineError("engine is unloaded: no model loaded", "unloaded")
        return check_ready()

    engine.check_ready = gone_at_submission
    with httpx.Client(base_url=live.url, timeout=60) as http:
        openai_ = http.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
        ollama = http.post("/api/generate", json={"model": "tiny", "prompt": "x", "stream": False})
    assert openai_.status_code == 503 and openai_.headers["retry-after"] == "1"
    assert openai_.json()["error"]["code"] == "model_unavailable"
    assert ollama.status_code == 503
    assert "no model loaded" in ollama.json()["error"]


def test_health_while_an_unload_frees_the_memory_is_a_503_that_says_unloaded(
    live_server, tiny_model
):
    """The model is gone and the state still says ready until its memory is freed (seconds, on
    a large model): /health answers that window as unloaded, not with a 500."""
    live = live_server(tiny_model, own=True)
    slot = live.engine.slot
    freeing, freed = threading.Event(), threading.Event()
    on_unloaded = slot._on_unloaded

    def slow_to_free():
        freeing.set()
        freed.wait(30)
        on_unloaded()

    slot._on_unloaded = slow_to_free
    with httpx.Client(base_url=live.url, timeout=60) as http:
        assert http.post("/admin/unload").status_code == 202
        assert freeing.wait(30)
        try:
            response = http.get("/health")
        finally:
            freed.set()
        assert response.status_code == 503, response.text
        assert response.json()["status"] == "unloaded"
        assert response.json()["error"]["code"] == "engine_error"
        wait_for(http, "unloaded")


def test_the_registry_rereads_a_folder_only_when_its_files_change(tiny_model, tmp_path):
    import json
    import shutil

    from mlxserve.registry import Registry

    folder = tmp_path / "models" / "copy"
    shutil.copytree(tiny_model, folder)
    registry = Registry(models_dirs=[folder.parent], hf_cache=tmp_path / "none", lmstudio=[])
    assert registry.find("copy").context_length == 2048
    config = json.loads((folder / "config.json").read_text())
    config["max_position_embeddings"] = 4096
    (folder / "config.json").write_text(json.dumps(config))
    assert registry.find("copy").context_length == 4096
    (folder / "model.safetensors").unlink()
    assert registry.find("copy") is None  # no weights: not loadable, not listed
