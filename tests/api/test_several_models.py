"""Several models at once: requests route by name to their own engine and batch, within a memory
budget; pins, least-recently-used eviction, a 503 when nothing can make room, aliases, LoRA
adapters on their base's weights. Real servers, real tiny models, the official clients."""

from __future__ import annotations

import threading
import time

import httpx
import mlx.core as mx
import ollama
import openai
import pytest

from mlxserve.engine.models.pool import estimate_weight_bytes
from mlxserve.tiny_model import build_tiny_adapter, build_tiny_model

from ..helpers import BackgroundStream, error_of, streamed_texts, wait_until

PROMPT = "def main():\n"
LONG = 400  # tokens of a stream that is still running while the test does something else


@pytest.fixture(scope="module")
def tiny3(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("more-models") / "tiny3", seed=2)


@pytest.fixture(scope="module")
def tiny_lora(tiny_model, tmp_path_factory):
    return build_tiny_adapter(tiny_model, tmp_path_factory.mktemp("adapters") / "tiny-lora")


def budget_for(models: float, tiny_model) -> int:
    """A memory budget that holds `models` of the tiny models' weights (they are one size)."""
    return int(models * estimate_weight_bytes(str(tiny_model)))


def greedy(http: httpx.Client, model: str | None = None, max_tokens: int = 24) -> dict:
    body = {"prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    if model is not None:
        body["model"] = model
    response = http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def resident(http: httpx.Client) -> dict[str, dict]:
    return {m["model"]: m for m in http.get("/admin/status").json()["models"]}


def in_memory(http: httpx.Client) -> set[str]:
    return {name for name, m in resident(http).items() if m["memory_bytes"] > 0}


def test_two_models_stream_at_once_each_as_it_does_alone(live_server, tiny_model, tiny_models_dir):
    """One client on each model (openai's and ollama's packages), streaming at the same time:
    each answer is exactly its model's answer alone, and both batches ran together."""
    live = live_server(tiny_model, own=True, models=(str(tiny_models_dir / "tiny2"),))
    openai_client = openai.OpenAI(base_url=live.url + "/v1", api_key="none", max_retries=0)
    ollama_client = ollama.Client(host=live.url)

    def on_tiny() -> str:
        stream = openai_client.completions.create(
            model="tiny",
            prompt=PROMPT,
            max_tokens=LONG,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        return "".join(chunk.choices[0].text for chunk in stream)

    def on_tiny2() -> str:
        options = {"temperature": 0, "num_predict": LONG // 2}
        parts = ollama_client.generate(
            model="tiny2", prompt=PROMPT, options=options, stream=True, raw=True
        )
        return "".join(part.response for part in parts)

    alone = {"tiny": on_tiny(), "tiny2": on_tiny2()}
    assert alone["tiny"] != alone["tiny2"]
    together: dict[str, str] = {}
    seen_both = threading.Event()

    def watch() -> None:
        engines = {e.model_name: e for e in live.engine.thread.engines}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not seen_both.is_set():
            if all(engines[n].stats.active_sequences for n in ("tiny", "tiny2")):
                seen_both.set()
            time.sleep(0.002)

    threads = [
        threading.Thread(target=lambda: together.update(tiny=on_tiny())),
        threading.Thread(target=lambda: together.update(tiny2=on_tiny2())),
        threading.Thread(target=watch),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert together == alone
    assert seen_both.is_set(), "the two models' requests never ran at the same time"
    with httpx.Client(base_url=live.url, timeout=60) as http:
        assert in_memory(http) == {"tiny", "tiny2"}
        listed = {m["name"] for m in http.get("/api/ps").json()["models"]}
        assert listed == {"tiny:latest", "tiny2:latest"}
        cards = {m["id"]: m for m in http.get("/v1/models").json()["data"]}
        assert cards["tiny"]["loaded"] and cards["tiny2"]["loaded"]
        assert cards["tiny"]["default"] and not cards["tiny2"]["default"]
        assert cards["tiny2"]["memory_bytes"] > 0 and cards["tiny2"]["pending_sequences"] == 0


def test_the_least_recently_used_idle_model_makes_room_and_a_pinned_one_stays(
    live_server, tiny_model, tiny_models_dir, tiny3
):
    """Room for two: asking for a third unloads the one used longest ago, never the pinned
    one (the default here, used least recently of all)."""
    tiny2 = str(tiny_models_dir / "tiny2")
    live = live_server(
        tiny_model,
        own=True,
        models=(tiny2,),
        pins=(str(tiny_model),),
        memory_budget_bytes=budget_for(2.5, tiny_model),
        allow_switch=True,
        models_dirs=(str(tiny_models_dir), str(tiny3.parent)),
    )
    with httpx.Client(base_url=live.url, timeout=60) as http:
        assert wait_until(lambda: in_memory(http) == {"tiny", "tiny2"}, 60)
        first = {name: greedy(http, name)["choices"][0]["text"] for name in ("tiny", "tiny2")}
        assert greedy(http, "tiny2")["model"] == "tiny2"  # tiny2 is now the most recent
        assert greedy(http, "tiny3")["model"] == "tiny3"
        assert in_memory(http) == {"tiny", "tiny3"}  # tiny is pinned: tiny2 went
        assert resident(http)["tiny"]["pinned"] is True
        # tiny2 again: tiny3 goes (tiny is pinned), and tiny2 answers as before its unload
        assert greedy(http, "tiny2")["choices"][0]["text"] == first["tiny2"]
        assert in_memory(http) == {"tiny", "tiny2"}
        # unpinned, tiny is the least recently used: it makes room for tiny3
        assert http.post("/admin/pin", json={"model": "tiny", "pinned": False}).status_code == 200
        greedy(http, "tiny3")
        assert in_memory(http) == {"tiny2", "tiny3"}
        assert greedy(http)["choices"][0]["text"] == first["tiny"]  # the default, reloaded
        status = http.get("/admin/status").json()
        assert status["models_memory_bytes"] <= status["memory_budget_bytes"]


def test_503_with_retry_after_when_no_model_can_make_room(live_server, tiny_model, tiny_models_dir):
    """Room for one: while the default streams, a request for another model gets a 503 with
    Retry-After in each protocol's shape; once the stream's client leaves, it loads in the
    default's place."""
    live = live_server(
        tiny_model,
        own=True,
        memory_budget_bytes=budget_for(1.5, tiny_model),
        allow_switch=True,
        models_dirs=(str(tiny_models_dir),),
    )
    body = {"prompt": PROMPT, "max_tokens": 3000, "ignore_eos": True, "stream": True}
    running = BackgroundStream(live.url, body)
    with httpx.Client(base_url=live.url, timeout=60) as http:
        assert wait_until(lambda: live.engine.stats.active_sequences == 1, 30)
        refused = http.post("/v1/completions", json={"prompt": "x", "model": "tiny2"})
        error = error_of(refused, 503)
        assert error["code"] == "model_memory_full" and "tiny2" in error["message"]
        assert int(refused.headers["Retry-After"]) > 0
        ollama_refused = http.post("/api/generate", json={"model": "tiny2", "prompt": "x"})
        assert ollama_refused.status_code == 503 and "tiny2" in ollama_refused.json()["error"]
        assert in_memory(http) == {"tiny"}
        assert wait_until(lambda: len(running.chunks) >= 10, 30)  # the stream goes on
        running.leave()
        assert "".join(streamed_texts(running.chunks).values())  # unharmed
        assert not any("error" in chunk for chunk in running.chunks), running.chunks[-1]
        assert greedy(http, "tiny2")["model"] == "tiny2"
        assert in_memory(http) == {"tiny2"}


def test_aliases_route_hard_coded_names(live_server, tiny_model, tiny_models_dir):
    live = live_server(
        tiny_model,
        models=(str(tiny_models_dir / "tiny2"),),
        aliases=(("gpt-4o-mini", "tiny2"), ("codellama:7b", "tiny")),
    )
    with httpx.Client(base_url=live.url, timeout=60) as http:
        assert greedy(http, "gpt-4o-mini")["choices"] == greedy(http, "tiny2")["choices"]
        assert greedy(http, "gpt-4o-mini")["model"] == "tiny2"
        answer = ollama.Client(host=live.url).generate(
            model="codellama:7b", prompt=PROMPT, raw=True, options={"num_predict": 4}
        )
        assert answer.model == "codellama:7b" and answer.done
        cards = {m["id"]: m for m in http.get("/v1/models").json()["data"]}
        assert cards["gpt-4o-mini"]["alias_of"] == "tiny2"


def test_a_lora_adapter_is_a_model_on_its_base_weights(live_server, tiny_model, tiny_lora):
    """Its answers are mlx-lm's own for base + adapter, not the base's; it is listed with its
    base, and its memory is the adapter's alone."""
    import mlx_lm
    from mlx_lm.generate import generate_step
    from mlx_lm.sample_utils import make_sampler

    live = live_server(tiny_model, adapters=(("tiny-lora", str(tiny_lora)),))
    client = openai.OpenAI(base_url=live.url + "/v1", api_key="none", max_retries=0)

    def ask(model: str):
        return client.completions.create(
            model=model,
            prompt=PROMPT,
            max_tokens=16,
            temperature=0,
            extra_body={"ignore_eos": True},
        )

    base, adapted = ask("tiny"), ask("tiny-lora")
    assert adapted.model == "tiny-lora"
    assert adapted.choices[0].text != base.choices[0].text
    model, tokenizer = mlx_lm.load(str(tiny_model), adapter_path=str(tiny_lora))
    prompt = tokenizer.encode(PROMPT)
    expected = [
        token
        for token, _ in generate_step(
            mx.array(prompt), model, max_tokens=16, sampler=make_sampler(0.0)
        )
    ]
    assert tokenizer.decode(expected) == adapted.choices[0].text
    with httpx.Client(base_url=live.url, timeout=60) as http:
        cards = {m["id"]: m for m in http.get("/v1/models").json()["data"]}
        assert cards["tiny-lora"]["parent"] == "tiny" and cards["tiny-lora"]["loaded"]
        models = resident(http)
        adapter_bytes = sum(f.stat().st_size for f in tiny_lora.glob("*.safetensors"))
        assert 0 < models["tiny-lora"]["memory_bytes"] <= adapter_bytes
        assert models["tiny-lora"]["memory_bytes"] < models["tiny"]["memory_bytes"] / 4
        assert models["tiny-lora"]["base_model"] == "tiny"


def test_keep_alive_and_idle_unload_are_per_model(live_server, tiny_model, tiny_models_dir):
    """Ollama's keep_alive 0 unloads the model it names, and only that one; a request's
    keep_alive is its model's own idle time, and --idle-unload frees each other model after
    the server's, and a request loads it again."""
    live = live_server(
        tiny_model, own=True, models=(str(tiny_models_dir / "tiny2"),), idle_unload_s=2.0
    )
    client = ollama.Client(host=live.url)
    with httpx.Client(base_url=live.url, timeout=60) as http:
        # both loaded (a load request waits for a load under way), for ten minutes
        client.generate(model="tiny", prompt="", keep_alive="10m")
        client.generate(model="tiny2", prompt="", keep_alive="10m")
        client.generate(model="tiny2", prompt="", keep_alive=0)
        assert wait_until(lambda: in_memory(http) == {"tiny"}, 60)
        assert [m["name"] for m in http.get("/api/ps").json()["models"]] == ["tiny:latest"]
        # loaded again on request, with the server's idle time (its own went with it)
        assert greedy(http, "tiny2")["model"] == "tiny2"
        # tiny2's idle unload, after the server's two seconds; tiny's ten minutes hold
        assert wait_until(lambda: "tiny2" not in in_memory(http), 60)
        assert in_memory(http) == {"tiny"}


def test_a_pinned_model_is_not_unloaded_for_being_idle(live_server, tiny_model, tiny_models_dir):
    live = live_server(
        tiny_model,
        own=True,
        models=(str(tiny_models_dir / "tiny2"),),
        pins=(str(tiny_model),),
        idle_unload_s=1.0,
    )
    with httpx.Client(base_url=live.url, timeout=60) as http:
        # tiny2 served (it may already have gone idle once since the start: a poll for it in
        # memory can miss its second of idleness on a loaded machine), then gone when idle
        assert greedy(http, "tiny2")["model"] == "tiny2"
        assert wait_until(lambda: in_memory(http) == {"tiny"}, 30)
        time.sleep(2.0)
        assert in_memory(http) == {"tiny"}
        (listed,) = http.get("/api/ps").json()["models"]
        assert listed["expires_at"].startswith("2318")  # Ollama's "never"
        assert http.post("/admin/pin", json={"model": "tiny", "pinned": False}).status_code == 200
        assert wait_until(lambda: not in_memory(http), 60)


def test_a_base_stays_loaded_while_its_adapter_is(live_server, tiny_model, tiny_lora):
    """The adapter's weights are its base's arrays: the base is not unloaded for being idle
    while the adapter is loaded (here pinned), and goes once the adapter does."""
    live = live_server(
        tiny_model,
        own=True,
        adapters=(("tiny-lora", str(tiny_lora)),),
        pins=("tiny-lora",),
        idle_unload_s=1.0,
    )
    with httpx.Client(base_url=live.url, timeout=60) as http:
        assert wait_until(lambda: in_memory(http) == {"tiny", "tiny-lora"}, 30)
        time.sleep(2.5)
        assert in_memory(http) == {"tiny", "tiny-lora"}
        assert http.post("/admin/pin", json={"model": "tiny-lora", "pinned": False}).status_code
        assert wait_until(lambda: not in_memory(http), 60)
