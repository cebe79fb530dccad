"""A coding agent's loop through Anthropic's `/v1/messages`: how much of each step's prompt the
prefix cache serves, and the time to first token it buys.

An agent (Claude Code and the like) resends its whole conversation every step: a long system
prompt and tool definitions, then every tool call and result so far. This replays such a
session of `--steps` steps: a system prompt of about `--system-tokens` tokens, four tools, and
per step a scripted assistant `tool_use` turn and its `tool_result` (about `--result-tokens`
tokens of code), as a recorded session is replayed. At each step the conversation so far goes
to `POST /v1/messages` (streamed, greedy, `--answer-tokens` tokens) on two servers started side
by side on the same model: one as users run it, one with the prefix cache off
(`--prefix-cache-mb 0`), which sees every prompt cold. Per step: the prompt's tokens
(`usage.input_tokens + cache_read_input_tokens`), the cached share, and the time to the first
content block on each server (a tool_use block comes whole, so where the model answers with a
call the time includes writing it). Target: from step 3 on, >= 90% of each prompt from the
cache. This script only prints; it asserts nothing.

    python scripts/bench_agent_loop.py [--model PATH] [--steps 8] [--system-tokens 1500]
                                       [--result-tokens 150] [--answer-tokens 16] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

import httpx
from bench_common import (
    ServerFailed,
    bench_parser,
    default_model,
    print_table,
    reexec_for_cpu,
    warm_and_cold,
)

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


def report(model: str, args: argparse.Namespace, runs: list[list[tuple[Step, Step]]]) -> None:
    rows = [
        ("model", model),
        (
            "steps / system tokens / tool result tokens / answer tokens",
            f"{args.steps} / ~{args.system_tokens} / ~{args.result_tokens} / {args.answer_tokens}",
        ),
        ("repeats", f"{len(runs)} sessions (each step: the median of the sessions)"),
    ]
    for step in range(args.steps):
        warm = [run[step][0] for run in runs]
        cold = [run[step][1] for run in runs]
        share = statistics.median(w.cached_tokens / w.prompt_tokens for w in warm)
        ttft_warm = statistics.median(w.ttft for w in warm)
        ttft_cold = statistics.median(c.ttft for c in cold)
        target = "  (target >= 90%)" if step >= 2 else ""
        rows.append(
            (
                f"step {step + 1}: prompt, cached, first block warm / cold",
                f"{warm[0].prompt_tokens} tok, {share:.1%} cached{target}, {ttft_warm:.3f} / "
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
    parser = bench_parser("Prefix-cache reuse and TTFT across an agent's steps on /v1/messages.")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--system-tokens", type=int, default=1500)
    parser.add_argument("--result-tokens", type=int, default=150)
    parser.add_argument("--answer-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3, help="sessions (new text each)")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    reexec_for_cpu()  # the process settings `mlxserve serve` runs under
    from transformers import AutoTokenizer

    model = args.model or default_model()
    tokenizer = AutoTokenizer.from_pretrained(model)
    runs = warm_and_cold(
        "agent loop",
        "agent",
        model,
        args.repeats,
        lambda warm, cold, number: session(warm, cold, tokenizer, args, number),
    )
    if runs is None:
        return 1
    report(model, args, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
