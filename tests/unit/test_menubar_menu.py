"""The menubar's Models menu as data: each model's submenu from a hand-made snapshot (titles,
what is enabled and checked, the actions), the merge of /admin/status with /v1/models it is
built from, and a refused action said in the snapshot instead of raised."""

from __future__ import annotations

from menubar import menu
from menubar.controller import ModelChoice, ServerController, Snapshot, model_choices

from ..live_server import free_port

MB = 1_000_000


def two_models(state: str = "ready") -> Snapshot:
    return Snapshot(
        state=state,
        url="http://127.0.0.1:8080",
        model="coder",
        models=(
            ModelChoice(
                "coder", True, 900 * MB, "ready", default=True, memory_bytes=512 * MB, queue=3
            ),
            ModelChoice("chat", True, 400 * MB, "ready", pinned=True, memory_bytes=700 * MB),
            ModelChoice("big", False, 9_000 * MB),
            ModelChoice("tuned", False, 2 * MB, "unloaded", base_model="coder"),
            ModelChoice("new", False, 300 * MB, "loading"),
        ),
        memory_budget_bytes=12_000 * MB,
        models_memory_bytes=1_212 * MB,
    )


def submenu(items: list[menu.Item], name: str) -> dict[str, menu.Item]:
    found = menu.find_model(items, name)
    assert found is not None, [i.title for i in menu.find(items, "Models").children]
    return {child.title: child for child in found.children}


def test_each_model_is_a_submenu_titled_with_its_state_and_roles():
    items = menu.build(two_models(), launch_at_login=False)
    models = menu.find(items, "Models")
    assert [m.title for m in models.children] == [
        "● coder (default)",
        "● chat (pinned)",
        "big",
        "tuned",
        "◌ new",
    ]
    assert all(m.children for m in models.children)
    assert menu.find(items, "Models: 1.2 GB of 12.0 GB") is not None
    assert menu.title(two_models()) == "● coder"  # the menu bar shows the default model
    assert items[0].title == "Ready: coder"


def test_the_default_loaded_model_offers_unload_and_pin():
    coder = submenu(menu.build(two_models(), False), "coder")
    assert list(coder) == ["Make default", "Unload", "Pin", "-", "512.0 MB in memory", "3 in queue"]
    make_default = coder["Make default"]
    assert make_default.checked and not make_default.enabled and make_default.action is None
    assert coder["Unload"].action == "unload:coder" and coder["Unload"].enabled
    pin = coder["Pin"]
    assert (pin.action, pin.enabled, pin.checked, pin.checkable) == ("pin:coder", True, False, True)
    assert not coder["512.0 MB in memory"].enabled


def test_a_loaded_pinned_model_that_is_not_the_default_can_become_it_and_be_unpinned():
    chat = submenu(menu.build(two_models(), False), "chat")
    assert chat["Make default"].action == "load:chat" and chat["Make default"].enabled
    assert not chat["Make default"].checked
    assert chat["Unpin"].action == "unpin:chat" and chat["Unpin"].checked
    assert chat["Unload"].enabled and "700.0 MB in memory" in chat


def test_a_model_not_loaded_can_be_loaded_not_unloaded():
    items = menu.build(two_models(), False)
    big = submenu(items, "big")
    assert big["Load"].action == "load:big" and big["Load"].enabled
    assert big["Unload"].action == "unload:big" and not big["Unload"].enabled
    assert not big["Pin"].enabled  # not served yet: a pin would not show
    assert "9.0 GB on disk" in big
    tuned = submenu(items, "tuned")  # served, unloaded: its pin shows in /admin/status
    assert tuned["Load"].enabled and not tuned["Unload"].enabled and tuned["Pin"].enabled
    assert "Adapter on coder" in tuned
    new = submenu(items, "new")  # on its way: it becomes the default once ready
    assert new["Make default"].action == "load:new" and "Loading" in new


def test_nothing_can_be_done_to_models_of_a_stopped_server():
    items = menu.build(two_models("stopped"), False)
    for name in ("coder", "chat", "big"):
        actions = [c for c in menu.find_model(items, name).children if c.action]
        assert actions and not any(c.enabled for c in actions)
    assert not [i for i in items if i.title.startswith("Models:")]


def test_a_model_that_failed_to_load_says_why():
    failed = ModelChoice("broken", False, 10, "error", error="not safetensors")
    snapshot = Snapshot(state="ready", model="coder", models=(failed,))
    assert menu.model_title(failed) == "⚠ broken"
    broken = submenu(menu.build(snapshot, False), "broken")
    assert broken["Load"].enabled and "Error: not safetensors" in broken


def test_the_models_come_from_v1_models_with_the_served_ones_status():
    status = {
        "model": "a",
        "models": [
            {"model": "a", "state": "ready", "default": True, "pinned": True,
             "memory_bytes": 5, "pending_sequences": 2, "base_model": None},
            {"model": "b", "state": "unloaded", "default": False, "pinned": False,
             "memory_bytes": 0, "load_error": None, "error": None},
        ],
    }  # fmt: skip
    cards = [
        {"id": "a", "loaded": True, "size_bytes": 10},
        {"id": "b", "loaded": False, "size_bytes": 20},
        {"id": "c", "loaded": False, "size_bytes": 30},
        {"id": "fast", "alias_of": "a"},
    ]
    a, b, c = model_choices(status, cards)
    assert a == ModelChoice("a", True, 10, "ready", True, True, 5, 2)
    assert b == ModelChoice("b", False, 20, "unloaded")
    assert c == ModelChoice("c", False, 30)


def test_a_refused_action_is_the_snapshots_error_not_an_exception(tmp_path):
    controller = ServerController(port=free_port(), log_path=tmp_path / "server.log")
    assert controller.load("coder") is False
    assert controller.snapshot.error.startswith(f"no answer from {controller.url}")
    assert menu.find(menu.build(controller.snapshot, False), f"Error: {controller.snapshot.error}")


def test_an_embedding_model_and_a_reranker_say_what_they_are_and_never_become_default():
    snapshot = Snapshot(
        state="ready",
        url="http://127.0.0.1:8080",
        model="coder",
        models=(
            ModelChoice("coder", True, 900 * MB, "ready", default=True, memory_bytes=512 * MB),
            ModelChoice("minilm", True, 90 * MB, "ready", memory_bytes=90 * MB, kind="embed"),
            ModelChoice("bge-reranker", False, 300 * MB, kind="rerank"),
            ModelChoice("qwen2-vl", False, 2000 * MB, vision=True),
        ),
    )
    items = menu.build(snapshot, launch_at_login=False)
    titles = [m.title for m in menu.find(items, "Models").children]
    assert titles == [
        "● coder (default)",
        "● minilm (embeddings)",
        "bge-reranker (reranker)",
        "qwen2-vl (images)",  # a vision model: a chat model too, so it may become the default
    ]
    assert "Load" in submenu(items, "qwen2-vl")
    minilm = submenu(items, "minilm")
    assert "Make default" not in minilm and not minilm["Load"].enabled  # loaded already
    assert minilm["Unload"].enabled
    reranker = submenu(items, "bge-reranker")
    assert reranker["Load"].enabled and reranker["Load"].action == "load:bge-reranker"
    cards = [{"id": "coder"}, {"id": "minilm", "kind": "embed"}]
    status = {"model": "coder", "models": [{"model": "minilm", "state": "ready"}]}
    assert [c.kind for c in model_choices(status, cards)] == ["generate", "embed"]
