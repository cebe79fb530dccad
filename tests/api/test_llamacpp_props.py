"""llama.cpp's GET /props on a real server: what llama.vscode and llama.cpp's web UI read."""

from __future__ import annotations

import httpx

from mlxserve.settings import ChatSettings

from ..helpers import error_of


def test_props_says_the_defaults_a_completion_runs_with(server, http):
    props = http.get("/props").json()
    defaults = props["default_generation_settings"]
    loaded = server.engine.loaded
    assert props["n_ctx"] == defaults["n_ctx"] == loaded.context_length
    assert props["model_path"] == loaded.path and props["total_slots"] >= 1
    assert props["modalities"] == {"vision": False, "audio": False}
    assert props["build_info"].startswith("mlxserve ")
    answered = http.post("/completion", json={"prompt": "def f", "n_predict": 1}).json()
    ran = answered["generation_settings"]
    for key in ("temperature", "top_k", "top_p", "min_p", "samplers", "stop", "cache_prompt"):
        assert defaults["params"][key] == ran[key], key
    assert defaults["params"]["n_predict"] == -1 and defaults["is_processing"] is False


def test_props_gives_the_chat_template_text(live_server, tiny_model):
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    chat = ChatSettings(template=template, template_source="template.jinja")
    live = live_server(tiny_model, chat=chat)
    assert httpx.get(live.url + "/props", timeout=60).json()["chat_template"] == template


def test_props_cannot_be_changed_over_http(http):
    error_of(http.post("/props", json={}), 405)
