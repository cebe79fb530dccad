"""Single-stream decode: mlxserve over streaming HTTP against a bare mlx-lm loop.

Both sides use the same model, prompt and token budget, greedy, with EOS banned so every run
decodes exactly `--max-tokens` tokens:

- bare: `mlx_lm.generate.stream_generate` in this process (detokenizing, as the server does),
  on the model prepared as the server prepares it (`current_policy().prepare_model`);
- http: `python -m mlxserve serve` in a subprocess, `POST /v1/completions` with `stream: true`,
  `ignore_eos: true` and `stream_options.include_usage`, read as server-sent events.

Only the decode rate counts, prompt processing and the first token are left out:
(tokens - 1) / (time of the last token - time of the first token). The two measurements are
interleaved (bare, http, bare, http, ...) so machine noise hits both alike, and the medians are
compared. The server is idle while the bare loop runs, and holds its own copy of the model.
Target: HTTP / bare >= 0.95 for a model of >= 100M parameters (the server's per-token work
should be small next to one forward pass of a real model).

A second table compares decode tok/s through HTTP with penalties + DRY + mirostat on against
plain seeded sampling (target >= 0.90), and with a JSON-schema grammar mask (llguidance) against
the same plain sampling (target >= 0.85).

One stream against `mlx_lm.server` (time to first token and tokens/s) is the first row of
benchmarks/concurrency.py (`--concurrency 1`). This script only prints; it asserts nothing.

    python benchmarks/single_stream.py [--model PATH] [--max-tokens 128] [--repeats 3]
                                       [--prompt TEXT] [--skip-samplers]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import httpx
from common import (
    ROW_ERRORS,
    ServerFailed,
    add_engine_flag,
    bench_parser,
    default_model,
    engine_flags,
    print_table,
    reexec_for_cpu,
    row_failed,
    served,
    start_server,
    stream_completion,
)

DEFAULT_PROMPT = "def fibonacci(n):\n"


def parse_args() -> argparse.Namespace:
    parser = bench_parser(
        "Single-stream decode tok/s: mlxserve over streaming HTTP against a bare mlx-lm loop "
        "(and the sampler chain and a grammar against plain sampling)."
    )
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens decoded per run")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each side")
    parser.add_argument("--prompt", default=DEFAULT_PROMPT, help="prompt text")
    parser.add_argument(
        "--skip-samplers", action="store_true", help="leave out the sampler and grammar rows"
    )
    add_engine_flag(parser)
    return parser.parse_args()


def http_decode_rate(
    client: httpx.Client, base_url: str, prompt: str, max_tokens: int, sampling: dict | None = None
) -> tuple[float, int]:
    """Decode tokens/s seen by a streaming client, greedy with EOS ignored unless `sampling`
    says otherwise: (usage's tokens - 1) over first text chunk to last, and usage's tokens."""
    body = {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
        **(sampling or {}),
    }
    result = stream_completion(client, base_url, body)
    if not result.done:
        raise ServerFailed("stream ended without data: [DONE]")
    if len(result.stamps) < 2 or result.stamps[-1] <= result.stamps[0]:
        raise ServerFailed("stream carried fewer than two text chunks")
    if result.usage_tokens is None:
        raise ServerFailed("no usage chunk despite stream_options.include_usage")
    tokens = result.usage_tokens
    return (tokens - 1) / (result.stamps[-1] - result.stamps[0]), tokens


def count_parameters(model: Any) -> int:
    """Logical parameter count: quantized weights are packed into uint32, so unpack by bits.

    Scales and biases of quantized layers are quantization metadata, not parameters: skipped.
    """
    from mlx.utils import tree_flatten

    total = 0
    for _, module in model.named_modules():
        bits = getattr(module, "bits", None)
        for name, value in tree_flatten(module.parameters()):
            if "." in name:  # counted at the leaf module that owns it
                continue
            if bits is not None and name in ("scales", "biases"):
                continue
            if bits is not None and name == "weight":
                total += value.size * 32 // bits
            else:
                total += value.size
    return total


def eos_ban(eos_ids: list[int]) -> Callable[[Any, Any], Any]:
    """A logits processor that never samples EOS, mirroring the server's `ignore_eos`."""
    import mlx.core as mx

    banned = mx.array(sorted(eos_ids))

    def process(tokens: Any, logits: Any) -> Any:
        logits[:, banned] = -float("inf")
        return logits

    return process


def bare_decode_rate(model: Any, tokenizer: Any, prompt: str, max_tokens: int) -> tuple[float, int]:
    """Decode tokens/s of mlx-lm's own loop, timed from the first token to the last."""
    from mlx_lm.generate import stream_generate
    from mlx_lm.sample_utils import make_sampler

    stamps: list[float] = []
    for _ in stream_generate(
        model,
        tokenizer,
        prompt,
        max_tokens=max_tokens,
        sampler=make_sampler(temp=0.0),
        logits_processors=[eos_ban(list(tokenizer.eos_token_ids))],
    ):
        stamps.append(time.perf_counter())
    return (len(stamps) - 1) / (stamps[-1] - stamps[0]), len(stamps)


# Issue 5's row: the whole custom chain against plain seeded sampling, both through HTTP.
PLAIN_SAMPLING = {"temperature": 0.8, "seed": 1}
FULL_CHAIN = {
    **PLAIN_SAMPLING,
    "repetition_penalty": 1.1,
    "presence_penalty": 0.3,
    "frequency_penalty": 0.3,
    "dry_multiplier": 0.8,
    "mirostat": 2,
    "mirostat_tau": 5.0,
}

# Issue 6's row: a JSON-schema grammar (an array of at least 40 records) against plain sampling.
JSON_SCHEMA = {
    "type": "array",
    "minItems": 40,
    "items": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 16},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
        },
        "required": ["name", "age", "tags"],
        "additionalProperties": False,
    },
}
GRAMMAR = {**PLAIN_SAMPLING, "json_schema": JSON_SCHEMA}


def main() -> int:
    args = parse_args()
    reexec_for_cpu()  # the process settings `mlxserve serve` runs under, for the bare loop too
    decode_and_sampler_rows(args, args.model or default_model())
    return 0


def decode_and_sampler_rows(args: argparse.Namespace, model_path: str) -> None:
    """Bare against HTTP, then the sampler chain and the grammar against plain sampling; a
    server that does not start (or fails) prints `row decode: ...` instead of the tables."""
    from mlx_lm import load

    from mlxserve.platform import current_policy

    print(f"loading {model_path} ...", file=sys.stderr)
    model, tokenizer = load(model_path)
    params = count_parameters(model)
    # the model as the server runs it, so only the server's overhead differs
    current_policy().prepare_model(model)

    bare: list[float] = []
    http: list[float] = []
    plain: list[float] = []
    chain: list[float] = []
    grammar: list[float] = []
    try:
        with (
            served(partial(start_server, model_path, extra=engine_flags(args)), "bench") as server,
            httpx.Client(timeout=httpx.Timeout(600.0, connect=10.0)) as client,
        ):
            base_url = server.url
            print("warming up ...", file=sys.stderr)
            bare_decode_rate(model, tokenizer, args.prompt, 8)
            http_decode_rate(client, base_url, args.prompt, 8)
            for run in range(1, args.repeats + 1):
                rate, n = bare_decode_rate(model, tokenizer, args.prompt, args.max_tokens)
                bare.append(rate)
                print(f"run {run} bare: {rate:.2f} tok/s ({n} tokens)", file=sys.stderr)
                rate, n = http_decode_rate(client, base_url, args.prompt, args.max_tokens)
                http.append(rate)
                print(f"run {run} http: {rate:.2f} tok/s ({n} tokens)", file=sys.stderr)
                if args.skip_samplers:
                    continue
                for label, sampling, rates in (
                    ("plain sampling", PLAIN_SAMPLING, plain),
                    ("full chain", FULL_CHAIN, chain),
                    ("json schema", GRAMMAR, grammar),
                ):
                    rate, n = http_decode_rate(
                        client, base_url, args.prompt, args.max_tokens, sampling
                    )
                    rates.append(rate)
                    print(f"run {run} {label}: {rate:.2f} tok/s ({n} tokens)", file=sys.stderr)
    except ROW_ERRORS as error:
        row_failed("decode (bare vs HTTP, samplers)", error)
        return

    print_table(
        [
            ("model", model_path),
            ("params", f"{params:,} (counted, quantized weights unpacked; no scales/biases)"),
            ("max tokens / repeats", f"{args.max_tokens} / {args.repeats} (medians below)"),
            ("bare tok/s", median_cell(bare)),
            ("HTTP tok/s", median_cell(http)),
            ("ratio HTTP/bare", ratio_cell(http, bare, ">= 0.95")),
        ]
    )
    if chain:
        print_table(
            [
                ("plain sampling tok/s", median_cell(plain)),
                ("penalties+DRY+mirostat", median_cell(chain)),
                ("ratio chain/plain", ratio_cell(chain, plain, ">= 0.90")),
            ]
        )
        print_table(
            [
                ("json-schema grammar tok/s", median_cell(grammar)),
                ("ratio grammar/plain", ratio_cell(grammar, plain, ">= 0.85")),
            ]
        )


def runs_text(rates: list[float]) -> str:
    return ", ".join(f"{r:.2f}" for r in rates)


def median_cell(rates: list[float]) -> str:
    """`12.34  runs: 12.00, 12.34, 13.10`"""
    return f"{statistics.median(rates):.2f}  runs: {runs_text(rates)}"


def ratio_cell(rates: list[float], baseline: list[float], target: str) -> str:
    """The ratio of two medians: `0.987  (target >= 0.95)`"""
    return f"{statistics.median(rates) / statistics.median(baseline):.3f}  (target {target})"


if __name__ == "__main__":
    sys.exit(main())
