"""Multi-turn chat: how much of each turn's prompt the prefix cache reuses, and what that does
to the time to first token.

A conversation of `--turns` turns of about 300 tokens each (a user message of `--user-tokens`;
an answer of exactly `--answer-tokens`, held there by `min_tokens`, since a small model answers
noise briefly) goes to `POST /v1/chat/completions` (streamed, greedy) on two servers started
side by side on the same model: one as users run it, one with the prefix cache off
(`--prefix-cache-mb 0`), which sees every turn's prompt cold. Each turn's messages are the
earlier turns with the answers the first server gave, so both servers get the same prompt (the
cold one answers a token: only its time to first token counts). Per turn: prompt tokens,
`usage.prompt_tokens_details.cached_tokens` and its share, and the time to first token on each
server. What a turn can reuse is bounded by its new user message (and the few template tokens
around it). Targets for the last turn: >= 90% of the prompt cached, TTFT >= 5x faster than
cold. This script only prints; it asserts nothing.

    python scripts/bench_chat_turns.py [--model PATH] [--turns 6] [--user-tokens 100]
                                       [--answer-tokens 200] [--repeats 3]
"""

from __future__ import annotations

import argparse
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
    sse_chunks,
    warm_and_cold,
)

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


def report(model: str, args: argparse.Namespace, runs: list[list[tuple[Turn, Turn]]]) -> None:
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
        warm = [run[turn][0] for run in runs]
        cold = [run[turn][1] for run in runs]
        share = statistics.median(w.cached_tokens / w.prompt_tokens for w in warm)
        ttft_warm = statistics.median(w.ttft for w in warm)
        ttft_cold = statistics.median(c.ttft for c in cold)
        rows.append(
            (
                f"turn {turn + 1}: prompt, cached, TTFT warm / cold",
                f"{warm[0].prompt_tokens} tok, {share:.1%} cached, {ttft_warm:.3f} / "
                f"{ttft_cold:.3f} s = {ttft_cold / ttft_warm:.1f}x",
            )
        )
    for number, run in enumerate(runs, 1):
        warm, cold = run[-1]
        rows.append(
            (
                f"conversation {number}, turn {args.turns}: cached, cold / warm TTFT",
                f"{warm.cached_tokens} of {warm.prompt_tokens} tokens = "
                f"{warm.cached_tokens / warm.prompt_tokens:.1%}, {cold.ttft / warm.ttft:.1f}x"
                "  (targets >= 90%, >= 5x)",
            )
        )
    print_table(rows)


def parse_args() -> argparse.Namespace:
    parser = bench_parser("Prefix-cache reuse and TTFT across the turns of a chat.")
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--user-tokens", type=int, default=100, help="tokens in each user turn")
    parser.add_argument("--answer-tokens", type=int, default=200, help="tokens in each answer")
    parser.add_argument("--repeats", type=int, default=3, help="conversations (new text each)")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    reexec_for_cpu()  # the process settings `mlxserve serve` runs under
    from transformers import AutoTokenizer

    model = args.model or default_model()
    tokenizer = AutoTokenizer.from_pretrained(model)
    runs = warm_and_cold(
        "chat turns",
        "chat",
        model,
        args.repeats,
        lambda warm, cold, number: conversation(warm, cold, tokenizer, args, number),
    )
    if runs is None:
        return 1
    report(model, args, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
