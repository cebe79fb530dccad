"""`python tests/system/front_alone.py MODEL`: the front process as `mlxserve serve` runs it, its
engine in a process of its own, asked for each kind of work (a completion, a chat with tools, a
JSON schema, an infill, tokenizing, the model list); prints the statuses and any MLX module the
front loaded, as one JSON line (tests/system/test_engine_process.py)."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time

from mlxserve.ipc.mlx_lm_text import use_text_only_mlx_lm

use_text_only_mlx_lm()  # first, as serve_forever does

import httpx  # noqa: E402

from mlxserve.server import run_front  # noqa: E402
from mlxserve.settings import Settings  # noqa: E402

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def ask(url: str) -> list[int]:
    with httpx.Client(base_url=url, timeout=120) as http:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if http.get("/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        chat = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "max_tokens": 8}
        schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
        return [
            http.post("/v1/completions", json={"prompt": "Once", "max_tokens": 4}).status_code,
            http.post("/v1/chat/completions", json={**chat, "tools": [TOOL]}).status_code,
            http.post(
                "/completion", json={"prompt": "{", "json_schema": schema, "n_predict": 16}
            ).status_code,
            http.post("/infill", json={"input_prefix": "def f(", "n_predict": 4}).status_code,
            http.post("/tokenize", json={"content": "Once upon"}).status_code,
            http.get("/v1/models").status_code,
            http.get("/api/tags").status_code,
        ]


def main() -> None:
    settings = Settings(model=sys.argv[1], port=int(sys.argv[2]) if len(sys.argv) > 2 else 0)
    shutdown_ready = threading.Event()
    result: dict = {}

    async def serve() -> None:
        shutdown = asyncio.Event()
        loop = asyncio.get_running_loop()

        def requests() -> None:
            result["statuses"] = ask(f"http://127.0.0.1:{settings.port}")
            loop.call_soon_threadsafe(shutdown.set)
            shutdown_ready.set()

        threading.Thread(target=requests, daemon=True).start()
        await run_front(settings, shutdown)

    asyncio.run(serve())
    result["mlx_modules"] = sorted(m for m in sys.modules if m == "mlx" or m.startswith("mlx."))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
