"""Batch throughput against the limit of this stack: mlx-lm's `BatchGenerator` decoding
`--concurrency` prompts in this process (no HTTP, no server), beside mlxserve serving the same
prompts over HTTP at that concurrency.

Both sides use the same model and the same weights: the in-process model gets the platform's
preparation the server gives it (float32 weights on MLX's CPU backend; none with
MLXSERVE_PORTABLE=1, where both stay quantized). Greedy, every sequence decodes exactly
`--max-tokens` tokens (no stop tokens in-process, `ignore_eos` over HTTP); tokens/s is all
sequences' tokens over the wall time from submitting to the last token, prefill included on both
sides. The two are interleaved `--repeats` times (limit, http, limit, http, ...) and the medians
compared. Target: HTTP / limit >= 0.9. This script only prints; it asserts nothing.

With `--temperature T` (and `--top-p P`) the sequences sample: in-process they share one mlx-lm
sampler (its one batched call, the fastest it samples), over HTTP each request has its own seed.

    python scripts/bench_batch_limit.py [--model PATH] [--concurrency 16] [--max-tokens 128]
                                        [--repeats 3] [--temperature 0.8 --top-p 0.95]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from functools import partial

from bench_common import (
    ROW_ERRORS,
    default_model,
    print_table,
    reexec_for_cpu,
    row_failed,
    served,
    start_server,
)
from bench_engine import WORDS, concurrency_row


def prompts(concurrency: int) -> list[str]:
    """The prompts bench_engine's concurrency row sends."""
    return [
        f"Story {i} of {concurrency}: once upon a time, {WORDS[i % len(WORDS)]}"
        for i in range(concurrency)
    ]


def limit_rate(
    model, tokenizer, concurrency: int, max_tokens: int, temperature: float = 0.0, top_p=1.0
) -> float:
    """Tokens/s of mlx-lm's BatchGenerator on the prompts, in this process."""
    from mlx_lm.generate import BatchGenerator
    from mlx_lm.sample_utils import make_sampler

    ids = [tokenizer.encode(p) for p in prompts(concurrency)]
    generator = BatchGenerator(
        model,
        stop_tokens=[],
        completion_batch_size=max(32, concurrency),
        sampler=make_sampler(temperature, top_p=top_p if top_p < 1 else 0.0),
    )
    started = time.perf_counter()
    generator.insert(ids, max_tokens=[max_tokens] * len(ids))
    tokens, finished = 0, 0
    while finished < len(ids):
        _, responses = generator.next()
        tokens += len(responses)
        finished += sum(r.finish_reason is not None for r in responses)
    elapsed = time.perf_counter() - started
    return tokens / elapsed


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="mlxserve over HTTP against mlx-lm's BatchGenerator in-process.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--model", default=None, help="model folder (default: shared SmolLM2)")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    parser.add_argument("--top-p", type=float, default=1.0)
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    reexec_for_cpu()  # the process settings `mlxserve serve` runs under
    import mlx_lm

    from mlxserve.platform import current_policy

    path = args.model or default_model()
    model, tokenizer = mlx_lm.load(path)
    policy = current_policy()
    policy.prepare_model(model)
    limits, https, ttfts = [], [], []
    try:
        with served(partial(start_server, path), "batch-limit") as server:
            sampling = None
            if args.temperature > 0:
                sampling = {"temperature": args.temperature, "top_p": args.top_p}
            for repeat in range(args.repeats):
                limits.append(
                    limit_rate(
                        model,
                        tokenizer,
                        args.concurrency,
                        args.max_tokens,
                        args.temperature,
                        args.top_p,
                    )
                )
                rate, ttft, _ = concurrency_row(
                    server.url, args.concurrency, args.max_tokens, sampling
                )
                https.append(rate)
                ttfts.append(ttft)
                print(f"repeat {repeat + 1}: {limits[-1]:.1f} / {rate:.1f} tok/s", file=sys.stderr)
    except ROW_ERRORS as error:
        row_failed("batch limit", error)
        return 1
    limit, http = statistics.median(limits), statistics.median(https)
    print_table(
        [
            ("model, platform", f"{path}, {policy.description}"),
            (
                "concurrency / tokens each / repeats",
                f"{args.concurrency} / {args.max_tokens} / {args.repeats}",
            ),
            (
                "sampling",
                f"temperature {args.temperature}, top_p {args.top_p}, a seed a request"
                if args.temperature > 0
                else "greedy",
            ),
            (
                "BatchGenerator in-process, tok/s (each repeat)",
                ", ".join(f"{r:.1f}" for r in limits),
            ),
            ("mlxserve over HTTP, tok/s (each repeat)", ", ".join(f"{r:.1f}" for r in https)),
            ("mlxserve median time to first token", f"{statistics.median(ttfts):.3f} s"),
            ("HTTP / limit (medians)", f"{http / limit:.2f}  (target >= 0.90)"),
        ]
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
