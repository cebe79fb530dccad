"""Multi-turn conversations, each turn's prompt on mlxserve as users run it against the same
prompt on a server with the prefix cache off: the cached share of each turn's prompt and the
time to first token it buys. `chat`: a chat through /v1/chat/completions; `agent`: a coding
agent's tool-using session through Anthropic's /v1/messages.

Both replay a scripted conversation on two servers of the same model started side by side: one
as users run it, one with the prefix cache off (`--prefix-cache-mb 0`), which sees every prompt
cold. Each turn goes first to the warm server (streamed, greedy), then the same messages to the
cold one (one token: only its time to first token counts). `--repeats` conversations, each with
new text (its system message names it, so none starts with an earlier one's prompt); medians.

`chat`: `--turns` turns, each a user message of about `--user-tokens` tokens and an answer of
exactly `--answer-tokens` (held there by `min_tokens`, since a small model answers noise
briefly); each turn's messages are the earlier turns with the answers the warm server gave.
Per turn: prompt tokens, `usage.prompt_tokens_details.cached_tokens` and its share, time to
first token warm / cold. What a turn can reuse is bounded by its new user message (and the few
template tokens around it). Targets for the last turn: >= 90% cached, >= 5x faster than cold.

`agent`: an agent (Claude Code and the like) resends its whole conversation every step: a
system prompt of about `--system-tokens` tokens, four tools, and per step a scripted assistant
`tool_use` turn and its `tool_result` (about `--result-tokens` tokens of code), as a recorded
session is replayed; `--answer-tokens` tokens an answer. Per step: the prompt's tokens
(`usage.input_tokens + cache_read_input_tokens`), the cached share, and the time to the first
content block on each server (a tool_use block comes whole, so where the model answers with a
call the time includes writing it). Target: from step 3 on, >= 90% of each prompt cached.

This script only prints; it asserts nothing.

    python benchmarks/multi_turn.py chat [--model PATH | --family NAME] [--turns 6]
                                         [--user-tokens 100] [--answer-tokens 200]
                                         [--system-tokens 0] [--repeats 3]
    python benchmarks/multi_turn.py agent [--model PATH] [--steps 8] [--system-tokens 1500]
                                          [--result-tokens 150] [--answer-tokens 16] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import httpx
from common import (
    ROW_ERRORS,
    ServerFailed,
    add_family_flag,
    bench_parser,
    chosen_model,
    load_tokenizer,
    print_table,
    reexec_for_cpu,
    row_failed,
    served,
    sse_chunks,
    start_server,
)

# -- a chat ---------------------------------------------------------------------------------------

TOPICS = (
    "the river",
    "a lighthouse",
    "the old library",
    "winter markets",
    "a clockmaker",
    "the night train",
    "mountain bees",
    "a paper kite",
    "the salt road",
    "harbour bells",
)


@dataclass
class Turn:
    prompt_tokens: int
    cached_tokens: int
    ttft: float
    answer: str
    answer_tokens: int


def user_message(tokenizer: Any, turn: int, tokens: int) -> str:
    """About `tokens` tokens of varied text on one topic, ending in a question."""
    topic = TOPICS[turn % len(TOPICS)]
    words = " ".join(f"{topic.split()[-1]}{i % 89} note{(i * 13) % 97}" for i in range(tokens))
    text = f"Turn {turn + 1}, about {topic}: {words}"
    ids = tokenizer.encode(text, add_special_tokens=False)[: tokens - 16]
    return tokenizer.decode(ids) + f"\nWhat is the most important thing about {topic}?"


def stream_turn(client: httpx.Client, url: str, messages: list[dict], answer_tokens: int) -> Turn:
    body = {
        "messages": messages,
        "max_tokens": answer_tokens,
        "min_tokens": answer_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    sent, first, answer, usage = time.perf_counter(), None, "", None
    with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        for chunk in sse_chunks(response, url):
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices") or []:
                text = (choice.get("delta") or {}).get("content") or ""
                if text and first is None:
                    first = time.perf_counter()
                answer += text
    if usage is None or first is None:
        raise ServerFailed(f"{url}: no text or no usage in the stream")
    details = usage.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens", 0)
    return Turn(usage["prompt_tokens"], cached, first - sent, answer, usage["completion_tokens"])


def conversation(
    warm_url: str, cold_url: str, tokenizer: Any, args: argparse.Namespace, number: int
) -> list[tuple[Turn, Turn]]:
    """Each turn on the warm server, then the same messages on the cold one. The system message
    names the conversation, so none starts with an earlier one's prompt."""
    system = f"You are a helpful assistant (conversation {number}). Answer in detail."
    if args.system_tokens:
        system += "\n" + user_message(tokenizer, number + 50, args.system_tokens)
    messages: list[dict] = [{"role": "system", "content": system}]
    turns = []
    with httpx.Client(timeout=600) as client:
        for turn in range(args.turns):
            messages.append(
                {"role": "user", "content": user_message(tokenizer, turn, args.user_tokens)}
            )
            warm = stream_turn(client, warm_url, messages, args.answer_tokens)
            cold = stream_turn(client, cold_url, messages, 1)
            turns.append((warm, cold))
            messages.append({"role": "assistant", "content": warm.answer})
    return turns


def medians(pairs: list[tuple[Any, Any]]) -> tuple[int, float, float, float]:
    """One turn (or agent step) over the runs, each a (warm, cold) pair of Turns or Steps: its
    prompt's tokens (the first run's), and the medians of the cached share and of the TTFTs warm
    and cold."""
    warm = [w for w, _ in pairs]
    return (
        warm[0].prompt_tokens,
        statistics.median(w.cached_tokens / w.prompt_tokens for w in warm),
        statistics.median(w.ttft for w in warm),
        statistics.median(c.ttft for _, c in pairs),
    )


def chat_report(model: str, args: argparse.Namespace, runs: list[list[tuple[Turn, Turn]]]) -> None:
    answers = statistics.median(w.answer_tokens for run in runs for w, _ in run)
    rows = [
        ("model", model),
        (
            "turns / user tokens a turn / answer tokens",
            f"{args.turns} / ~{args.user_tokens} / {answers:.0f}",
        ),
        ("repeats", f"{len(runs)} conversations (medians of the TTFTs below)"),
    ]
    for turn in range(args.turns):
        prompt, share, ttft_warm, ttft_cold = medians([run[turn] for run in runs])
        rows.append(
            (
                f"turn {turn + 1}: prompt, cached, TTFT warm / cold",
                f"{prompt} tok, {share:.1%} cached, {ttft_warm:.3f} / "
                f"{ttft_cold:.3f} s = {ttft_cold / ttft_warm:.1f}x",
            )
        )
    for number, run in enumerate(runs, 1):
        warm, cold = run[-1]
        first = run[0][0]
        rows.append(
            (
                f"conversation {number}, turn {args.turns} / turn 1 TTFT (warm)",
                f"{warm.ttft / first.ttft:.2f}  (target <= 0.3)",
            )
        )
        rows.append(
            (
                f"conversation {number}, turn {args.turns}: cached, cold / warm TTFT",
                f"{warm.cached_tokens} of {warm.prompt_tokens} tokens = "
                f"{warm.cached_tokens / warm.prompt_tokens:.1%}, {cold.ttft / warm.ttft:.1f}x"
                "  (targets >= 90%, >= 5x)",
            )
        )
    print_table(rows)


# -- an agent's session ---------------------------------------------------------------------------

TOOLS = [
    {
        "name": "list_dir",
        "description": "List the files of a folder of the repository.",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        },
    },
    {
        "name": "read_file",
        "description": "Read a file of the repository.",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        },
    },
    {
        "name": "edit_file",
        "description": "Replace text in a file.",
        "input_schema": {
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "old": {"type": "string"},
                "new": {"type": "string"},
            },
            "required": ["path", "old", "new"],
        },
    },
    {
        "name": "run_tests",
        "description": "Run the test suite and report failures.",
        "input_schema": {"type": "object", "properties": {"filter": {"type": "string"}}},
    },
]
CALLS = [
    ("list_dir", {"path": "."}),
    ("read_file", {"path": "src/app.py"}),
    ("read_file", {"path": "tests/test_app.py"}),
    ("run_tests", {"filter": "test_app"}),
    ("read_file", {"path": "src/util.py"}),
    ("edit_file", {"path": "src/util.py", "old": "return a - b", "new": "return a + b"}),
    ("run_tests", {"filter": "test_app"}),
    ("list_dir", {"path": "docs"}),
]


@dataclass
class Step:
    prompt_tokens: int
    cached_tokens: int
    ttft: float


def filler(tokenizer: Any, tokens: int, kind: str, seed: int) -> str:
    """About `tokens` tokens of varied text: agent rules, or code a tool returned."""
    if kind == "rules":
        lines = [
            f"Rule {i}: when task {(i * 7 + seed) % 101} touches module m{i % 13}, check "
            f"its tests t{(i * 3) % 17} and keep the style of file f{(i * 11) % 23}."
            for i in range(tokens)
        ]
    else:
        lines = [
            f"def handler_{seed}_{i}(value):\n    return value * {i % 9} + {(i * 5) % 7}\n"
            for i in range(tokens)
        ]
    ids = tokenizer.encode("\n".join(lines), add_special_tokens=False)[:tokens]
    return tokenizer.decode(ids)


def stream_step(client: httpx.Client, url: str, body: dict[str, Any]) -> Step:
    sent, first, usage = time.perf_counter(), None, {}
    with client.stream("POST", f"{url}/v1/messages", json=body) as response:
        if response.status_code != 200:
            response.read()
            raise ServerFailed(f"{url}: HTTP {response.status_code}: {response.text}")
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if event["type"] == "error":
                raise ServerFailed(f"{url}: stream error: {event['error']}")
            if event["type"] == "content_block_start" and first is None:
                first = time.perf_counter()
            if event["type"] == "message_delta":
                usage = event["usage"]
    if first is None or not usage:
        raise ServerFailed(f"{url}: no content block or no usage in the stream")
    cached = usage.get("cache_read_input_tokens", 0)
    return Step(usage["input_tokens"] + cached, cached, first - sent)


def session(
    warm_url: str, cold_url: str, tokenizer: Any, args: argparse.Namespace, number: int
) -> list[tuple[Step, Step]]:
    """Each step on the warm server, then the same request on the cold one. The system prompt
    names the session, so none starts with an earlier one's prompt."""
    system = f"You are a coding agent (session {number}).\n" + filler(
        tokenizer, args.system_tokens, "rules", number
    )
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the failing test."}]
    steps = []
    with httpx.Client(timeout=600) as client:
        for step in range(args.steps):
            body = {
                "model": "agent",
                "system": system,
                "tools": TOOLS,
                "messages": messages,
                "max_tokens": args.answer_tokens,
                "temperature": 0,
                "stream": True,
            }
            warm = stream_step(client, warm_url, body)
            cold = stream_step(client, cold_url, {**body, "max_tokens": 1})
            steps.append((warm, cold))
            name, arguments = CALLS[step % len(CALLS)]
            call_id = f"toolu_{number}_{step}"
            messages.append(
                {
                    "role": "assistant",
                    "content": [
                        {"type": "tool_use", "id": call_id, "name": name, "input": arguments}
                    ],
                }
            )
            result = filler(tokenizer, args.result_tokens, "code", number * 100 + step)
            messages.append(
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": call_id, "content": result}],
                }
            )
    return steps


def agent_report(model: str, args: argparse.Namespace, runs: list[list[tuple[Step, Step]]]) -> None:
    rows = [
        ("model", model),
        (
            "steps / system tokens / tool result tokens / answer tokens",
            f"{args.steps} / ~{args.system_tokens} / ~{args.result_tokens} / {args.answer_tokens}",
        ),
        ("repeats", f"{len(runs)} sessions (each step: the median of the sessions)"),
    ]
    for step in range(args.steps):
        prompt, share, ttft_warm, ttft_cold = medians([run[step] for run in runs])
        target = "  (target >= 90%)" if step >= 2 else ""
        rows.append(
            (
                f"step {step + 1}: prompt, cached, first block warm / cold",
                f"{prompt} tok, {share:.1%} cached{target}, {ttft_warm:.3f} / "
                f"{ttft_cold:.3f} s = {ttft_cold / ttft_warm:.1f}x",
            )
        )
    for number, run in enumerate(runs, 1):
        shares = [w.cached_tokens / w.prompt_tokens for w, _ in run[2:]]
        rows.append(
            (
                f"session {number}: least cached share from step 3 on",
                f"{min(shares):.1%}  (target >= 90%)" if shares else "n/a",
            )
        )
    print_table(rows)


def parse_args() -> argparse.Namespace:
    parser = bench_parser(
        "Multi-turn conversations (a chat, an agent's tool loop): each turn's cached share and "
        "time to first token on mlxserve against the same server with its prefix cache off."
    )
    kinds = parser.add_subparsers(dest="kind", required=True)
    defaults = argparse.ArgumentDefaultsHelpFormatter
    chat = kinds.add_parser(
        "chat", help="a chat through /v1/chat/completions", formatter_class=defaults
    )
    chat.add_argument("--turns", type=int, default=6)
    chat.add_argument("--user-tokens", type=int, default=100, help="tokens in each user turn")
    chat.add_argument("--answer-tokens", type=int, default=200, help="tokens in each answer")
    chat.add_argument("--repeats", type=int, default=3, help="conversations (new text each)")
    chat.add_argument(
        "--system-tokens", type=int, default=0, help="tokens of system prompt (0: one line)"
    )
    chat.add_argument(
        "--chat-template",
        default=None,
        help="the servers' --chat-template (a Jinja file: Qwen3's drops earlier reasoning)",
    )
    add_family_flag(chat)
    agent = kinds.add_parser(
        "agent", help="an agent's tool-using session through /v1/messages", formatter_class=defaults
    )
    agent.add_argument("--steps", type=int, default=8)
    agent.add_argument("--system-tokens", type=int, default=1500)
    agent.add_argument("--result-tokens", type=int, default=150)
    agent.add_argument("--answer-tokens", type=int, default=16)
    agent.add_argument("--repeats", type=int, default=3, help="sessions (new text each)")
    return parser.parse_args()


def warm_and_cold(
    name: str,
    tag: str,
    model: str,
    repeats: int,
    run: Callable[[str, str, int], Any],
    extra: list[str] | None = None,
) -> list[Any] | None:
    """`run(warm_url, cold_url, number)` for numbers 1..`repeats` on two servers of `model` side
    by side: one as users run it, one with the prefix cache off (`--prefix-cache-mb 0`), which
    sees every prompt cold. None, the row's failure printed, when a server fails."""
    extra = extra or []
    cold_start = partial(start_server, model, extra=[*extra, "--prefix-cache-mb", "0"])
    try:
        with (
            served(partial(start_server, model, extra=extra), f"{tag}-warm") as warm,
            served(cold_start, f"{tag}-cold") as cold,
        ):
            runs = []
            for number in range(1, repeats + 1):
                runs.append(run(warm.url, cold.url, number))
                print(f"{name}: {number} of {repeats} done", file=sys.stderr)
            return runs
    except ROW_ERRORS as error:
        row_failed(name, error)
        return None


def main() -> int:
    args = parse_args()
    reexec_for_cpu()  # the process settings `mlxserve serve` runs under
    model = chosen_model(args)
    tokenizer = load_tokenizer(model)
    converse, report = (
        (conversation, chat_report) if args.kind == "chat" else (session, agent_report)
    )
    runs = warm_and_cold(
        f"multi-turn {args.kind}",
        args.kind,
        model,
        args.repeats,
        lambda warm, cold, number: converse(warm, cold, tokenizer, args, number),
        ["--chat-template", args.chat_template] if getattr(args, "chat_template", None) else [],
    )
    if runs is None:
        return 1
    report(model, args, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
