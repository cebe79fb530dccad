"""Two models on one server: an editor's infill on one model beside a chat stream on the other
against the same infill alone (`infill`), or a running stream's gaps while the server loads
another model beside it against its gaps before (`load`).

`infill` (the default): one server serves both (`--model CODE --model CHAT`). An infill request
goes to the code model (`--model`, default the demo model) every 300 ms (llama.vim's /infill
body, typing a line one character a request, so each request shares its prompt with the one
before, as an editor's do; a new line's first is a prompt the prefix cache has not seen: the 32
lines before it and the 8 after, from a held-out standard-library file), streamed so its time to
first token can be read. Each repeat runs two trains of as many lines and characters, one after
the other: the infill train alone, then the next lines' train while a chat stream runs on the
other model (`--other-model`, default SmolLM2), whose own gaps are first taken alone for
`--chat-alone-s`. It reports the infill's time to first token (p50, p95) in each phase and
their ratio (target: p95 beside <= 2x alone), and the chat stream's gaps while the infill train
ran, against its gaps with no infill (median, p95, max).

`load`: one server serves `--model` (default the demo model); a chat stream runs on it. Each
repeat loads `--other-model` (`POST /admin/load`, not made the default), waits until it is
ready, then unloads it again. A load runs on the one MLX thread, a slice of weights (or a timed
pass) at a time, and the stream steps between the slices: its worst gap during a load is
reported against the load's length and against its own median gap.

This script only prints; it asserts nothing.

    python benchmarks/two_models.py [infill] [--repeats 3] [--lines 3] [--chars 16]
                                    [--model CODE] [--other-model CHAT]
    python benchmarks/two_models.py load [--repeats 3] [--model PATH] [--other-model PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx
from common import (
    REPO_ROOT,
    SHARED_MODEL,
    ServerFailed,
    bench_parser,
    demo_model,
    print_table,
    served,
    sse_chunks,
    start_server,
)

# -- an editor's infill beside a chat stream ------------------------------------------------------

INTERVAL_S = 0.3  # an editor's request a keystroke, about as fast as people type
CHAT_PROMPT = "Write a long story about a lighthouse keeper and the sea, in many chapters."


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def typed_lines(prefix_lines: int, suffix_lines: int, chars: int) -> list[list]:
    """Per line of a held-out standard-library file, what an editor sends as a user types its
    first `chars` characters: (prefix, line typed so far, suffix), one character more each.
    The first of a line is a prompt the prefix cache has not seen; the rest extend it."""
    sys.path.insert(0, str(REPO_ROOT / "scripts"))  # the demo model's held-out files
    from demo_data import split_files

    text = next(f.text for f in split_files()[1] if f.text.count("\n") > 200)
    lines = text.split("\n")
    typed = []
    for index in range(prefix_lines, len(lines) - suffix_lines):
        line = lines[index]
        indent = len(line) - len(line.lstrip())
        if len(line) - indent < chars:
            continue
        prefix = "\n".join(lines[index - prefix_lines : index]) + "\n"
        suffix = "\n".join(lines[index + 1 : index + 1 + suffix_lines])
        typed.append(
            [(prefix, line[:cut], suffix) for cut in range(indent + 1, indent + chars + 1)]
        )
    return typed


def infill_body(prefix: str, typed: str, suffix: str, n_predict: int) -> dict:
    """llama.vim's FIM request (see replay_llama_vim.py), streamed, without the ring buffer."""
    return {
        "input_prefix": prefix,
        "input_suffix": suffix,
        "input_extra": [],
        "prompt": typed,
        "n_predict": n_predict,
        "n_indent": len(typed) - len(typed.lstrip()),
        "top_k": 40,
        "top_p": 0.90,
        "stream": True,
        "samplers": ["top_k", "top_p", "infill"],
        "cache_prompt": True,
        "t_max_prompt_ms": 500,
        "t_max_predict_ms": 1000,
    }


def infill_ttft(client: httpx.Client, url: str, body: dict) -> float:
    """Seconds from sending to the first streamed chunk; read to the end."""
    sent = time.perf_counter()
    first = None
    with client.stream("POST", f"{url}/infill", json=body) as response:
        for _ in sse_chunks(response, "/infill"):
            if first is None:
                first = time.perf_counter()
    if first is None:
        raise ServerFailed("/infill streamed nothing")
    return first - sent


def infill_train(url: str, code_model: str, lines: list[list], n_predict: int) -> list[float]:
    """The typing of `lines`, a request every INTERVAL_S (or as soon as the one before ends):
    each request's time to first token."""
    ttfts = []
    with httpx.Client(timeout=120) as client:
        began = time.perf_counter()
        for index, (prefix, typed, suffix) in enumerate(s for line in lines for s in line):
            time.sleep(max(0.0, began + index * INTERVAL_S - time.perf_counter()))
            body = infill_body(prefix, typed, suffix, n_predict) | {"model": code_model}
            ttfts.append(infill_ttft(client, url, body))
    return ttfts


class ChatStream:
    """A chat stream on `model` read on a thread of its own: the time of each text chunk."""

    def __init__(self, url: str, model: str):
        self.stamps: list[float] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._read, args=(url, model), daemon=True)
        self._thread.start()

    def _read(self, url: str, model: str) -> None:
        body = {
            "model": model,
            "messages": [{"role": "user", "content": CHAT_PROMPT}],
            "max_tokens": 20_000,
            "ignore_eos": True,
            "stream": True,
        }
        try:
            with httpx.Client(timeout=600) as client:
                with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
                    for chunk in sse_chunks(response, "the chat stream"):
                        delta = (chunk.get("choices") or [{}])[0].get("delta") or {}
                        if delta.get("content"):
                            self.stamps.append(time.perf_counter())
                        if self.stop.is_set():
                            return
        except BaseException as error:
            self.error = error

    def gaps_between(self, start: float, end: float) -> list[float]:
        stamps = [s for s in self.stamps if start <= s <= end]
        return [b - a for a, b in zip(stamps, stamps[1:])]

    def wait_for_tokens(self, count: int, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while len(self.stamps) < count:
            if self.error is not None:
                raise self.error
            if time.monotonic() > deadline:
                raise ServerFailed("the chat stream did not start")
            time.sleep(0.05)

    def close(self) -> None:
        self.stop.set()
        self._thread.join(60)


def one_repeat(url: str, code: str, chat: str, alone_lines, beside_lines, args) -> dict:
    """The infill train alone, then the chat stream alone for a while, then both: the same
    number of lines typed in each train, so as many prompts miss the prefix cache."""
    alone = infill_train(url, code, alone_lines, args.n_predict)
    stream = ChatStream(url, chat)
    try:
        stream.wait_for_tokens(8)
        quiet_from = time.perf_counter()
        time.sleep(args.chat_alone_s)
        quiet_to = train_from = time.perf_counter()
        beside = infill_train(url, code, beside_lines, args.n_predict)
        train_to = time.perf_counter()
        if stream.error is not None:
            raise stream.error
    finally:
        stream.close()
    return {
        "alone": alone,
        "beside": beside,
        "chat_alone_gaps": stream.gaps_between(quiet_from, quiet_to),
        "chat_beside_gaps": stream.gaps_between(train_from, train_to),
    }


def ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.0f} / {quantile(values, 0.95) * 1000:.0f}"


# -- a model loaded beside a stream ---------------------------------------------------------------

POLL_S = 0.02


def state_of(client: httpx.Client, url: str, name: str) -> dict:
    models = client.get(f"{url}/admin/status").json()["models"]
    return next((m for m in models if m["model"] == name), {"state": "unloaded", "memory_bytes": 0})


def wait_state(client: httpx.Client, url: str, name: str, done, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not done(state_of(client, url, name)):
        if time.monotonic() > deadline:
            raise ServerFailed(f"{name}: {state_of(client, url, name)}")
        time.sleep(POLL_S)


def one_load(client: httpx.Client, url: str, name: str, stream: ChatStream) -> dict:
    """Load `name` beside the stream, then unload it: the load's seconds and the stream's gaps
    during it."""
    began = time.perf_counter()
    response = client.post(f"{url}/admin/load", json={"model": name, "default": False})
    if response.status_code not in (200, 202):
        raise ServerFailed(f"/admin/load: HTTP {response.status_code}: {response.text}")
    wait_state(client, url, name, lambda m: m["state"] == "ready" and m["memory_bytes"] > 0)
    ended = time.perf_counter()
    time.sleep(0.5)  # the stream's first gap after the load counts too
    gaps = stream.gaps_between(began, time.perf_counter())
    client.post(f"{url}/admin/unload", json={"model": name})
    wait_state(client, url, name, lambda m: m["memory_bytes"] == 0)
    time.sleep(1.0)
    return {"load_s": ended - began, "gaps": gaps}


def parse_args() -> argparse.Namespace:
    parser = bench_parser(
        "Two models on one server: an editor's infill beside a chat stream on another model "
        "against the infill alone (infill), or a stream's gaps while another model loads "
        "against its gaps before (load).",
        model_help="the infill's model, or the stream's in load (default: the demo model)",
    )
    parser.add_argument("what", nargs="?", choices=("infill", "load"), default="infill")
    parser.add_argument(
        "--other-model", default=None, help="the chat's model, or the one loaded (default: SmolLM2)"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--lines", type=int, default=3, help="infill: lines typed in each train")
    parser.add_argument("--chars", type=int, default=16, help="infill: characters typed a line")
    parser.add_argument("--chat-alone-s", type=float, default=10.0, help="infill: the chat alone")
    parser.add_argument("--n-predict", type=int, default=16, help="tokens an infill asks for")
    parser.add_argument("--prefix-lines", type=int, default=32)
    parser.add_argument("--suffix-lines", type=int, default=8)
    parser.add_argument("--json", type=Path, default=None, help="infill: every run's figures")
    return parser.parse_args()


def infill(args: argparse.Namespace, code: str, chat: str) -> int:
    names = [Path(code).name, Path(chat).name]
    typed = iter(typed_lines(args.prefix_lines, args.suffix_lines, args.chars))
    extra = ["--model", chat, "--memory-budget", "90%"]
    runs = []
    with served(lambda port, log: start_server(code, port, log, extra=extra), "models") as server:
        infill_train(server.url, names[0], [next(typed)], args.n_predict)  # warm both paths
        for repeat in range(args.repeats):
            alone_lines = [next(typed) for _ in range(args.lines)]
            beside_lines = [next(typed) for _ in range(args.lines)]
            run = one_repeat(server.url, names[0], names[1], alone_lines, beside_lines, args)
            runs.append(run)
            ratio = quantile(run["beside"], 0.95) / quantile(run["alone"], 0.95)
            print(
                f"repeat {repeat + 1}: infill TTFT p50/p95 ms alone {ms(run['alone'])}, beside "
                f"{ms(run['beside'])} (p95 ratio {ratio:.2f}); chat gaps p50/p95 ms alone "
                f"{ms(run['chat_alone_gaps'])}, beside {ms(run['chat_beside_gaps'])}, max "
                f"{max(run['chat_beside_gaps']) * 1000:.0f}",
                flush=True,
            )
    ratios = [quantile(r["beside"], 0.95) / quantile(r["alone"], 0.95) for r in runs]
    rows = [
        ("code model (infill)", names[0]),
        ("chat model (stream)", names[1]),
        ("infill every", f"{INTERVAL_S * 1000:.0f} ms, {args.n_predict} tokens, streamed"),
        ("each train", f"{args.lines} lines x {args.chars} characters typed"),
        ("infill TTFT p95 ratio beside/alone", ", ".join(f"{r:.2f}" for r in ratios)),
        ("target", "<= 2.00 in every run"),
    ]
    print_table(rows)
    if args.json is not None:
        args.json.write_text(
            json.dumps({"args": vars(args) | {"json": str(args.json)}, "runs": runs})
        )
    return 0


def load(args: argparse.Namespace, model: str, other_model: str) -> int:
    other = Path(other_model)
    extra = ["--models-dir", str(other.parent), "--memory-budget", "90%"]
    rows = []
    with served(lambda port, log: start_server(model, port, log, extra=extra), "load") as server:
        stream = ChatStream(server.url, Path(model).name)
        try:
            stream.wait_for_tokens(8)
            time.sleep(3.0)
            quiet = stream.gaps_between(0.0, time.perf_counter())
            with httpx.Client(timeout=300) as client:
                for repeat in range(args.repeats):
                    run = one_load(client, server.url, other.name, stream)
                    worst = max(run["gaps"])
                    median = statistics.median(quiet)
                    print(
                        f"repeat {repeat + 1}: load {run['load_s']:.2f} s; the stream's worst gap "
                        f"{worst * 1000:.0f} ms = {worst / run['load_s']:.2f} of the load, "
                        f"{worst / median:.1f}x its median gap ({median * 1000:.0f} ms)",
                        flush=True,
                    )
                    rows.append((run["load_s"], worst, median))
            if stream.error is not None:
                raise stream.error
        finally:
            stream.close()
    print_table(
        [
            ("stream on", Path(model).name),
            ("model loaded beside it", other.name),
            ("load, s", ", ".join(f"{r[0]:.2f}" for r in rows)),
            ("worst gap / load", ", ".join(f"{r[1] / r[0]:.2f}" for r in rows)),
            ("worst gap / median gap", ", ".join(f"{r[1] / r[2]:.1f}" for r in rows)),
        ]
    )
    return 0


def main() -> int:
    args = parse_args()
    model = args.model or demo_model()
    other = args.other_model or str(SHARED_MODEL)
    if not Path(other).is_dir():
        print(f"no model at {other}: pass --other-model", file=sys.stderr)
        return 2
    return (infill if args.what == "infill" else load)(args, model, other)


if __name__ == "__main__":
    sys.exit(main())
