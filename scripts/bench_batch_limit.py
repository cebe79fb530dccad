"""Batch throughput against the limit of this stack: mlx-lm's `BatchGenerator` decoding
`--concurrency` prompts in this process (no HTTP, no server), beside mlxserve serving the same
prompts over HTTP at that concurrency.

Both sides use the same model and the same weights: the in-process model gets the platform's
preparation the server gives it (float32 weights on MLX's CPU backend; none with
MLXSERVE_PORTABLE=1, where both stay quantized). Greedy, every sequence decodes exactly
`--max-tokens` tokens (no stop tokens in-process, `ignore_eos` over HTTP); tokens/s is all
sequences' tokens over the wall time from submitting to the last token, prefill included on both
sides. The two are interleaved `--repeats` times (limit, http, limit, http, ...) and the medians
compared; each repeat's prompts are new to both (the limit has no prefix cache). Target:
HTTP / limit >= 0.9. This script only prints; it asserts nothing.

With `--temperature T` (and `--top-p P`) the sequences sample: in-process they share one mlx-lm
sampler (its one batched call, the fastest it samples), over HTTP each request has its own seed.

With `--in-process`, mlxserve's engine runs in this process instead of a server, driven through
`Engine.submit` as the front doors drive it: the engine's own cost per step, without HTTP's.
(The engine then also steps the limit's batch with its decode step, which for one sampler
shared by every row is mlx-lm's.) `--stagger-ms MS` there submits request i at i x MS ms, as
a burst's requests reach a server spread out; each one's time to first token is then counted from
its own submission.

    python scripts/bench_batch_limit.py [--model PATH] [--concurrency 16] [--max-tokens 128]
                                        [--repeats 3] [--temperature 0.8 --top-p 0.95]
                                        [--clients processes|threads]
                                        [--switch-interval-ms 5]
                                        [--in-process [--profile] [--stagger-ms 30]]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from contextlib import nullcontext
from functools import partial

from bench_common import (
    ROW_ERRORS,
    bench_parser,
    default_model,
    print_table,
    reexec_for_cpu,
    row_failed,
    served,
    start_server,
)
from bench_engine import concurrency_row, story_prompts
from stack_sampler import StackSampler

from mlxserve.server import SWITCH_INTERVAL_ENV


def limit_rate(
    model,
    tokenizer,
    concurrency: int,
    max_tokens: int,
    temperature: float = 0.0,
    top_p=1.0,
    tag: str = "",
) -> float:
    """Tokens/s of mlx-lm's BatchGenerator on the prompts, in this process."""
    from mlx_lm.generate import BatchGenerator
    from mlx_lm.sample_utils import make_sampler

    ids = [tokenizer.encode(p) for p in story_prompts(concurrency, tag)]
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


def engine_rate(
    engine,
    tokenizer,
    concurrency: int,
    max_tokens: int,
    temperature: float,
    top_p: float,
    stagger_s: float = 0.0,
    tag: str = "",
) -> tuple[float, float]:
    """Tokens/s and median time to first token of mlxserve's engine in this process, the
    prompts submitted at once, or request i `i * stagger_s` seconds after the first (a seed
    each), every one decoding `max_tokens`."""
    from mlxserve.engine import GenerationRequest, StopSpec
    from mlxserve.sampling.params import SamplingParams

    sampling = SamplingParams(temperature=temperature, top_p=top_p)
    requests = [
        GenerationRequest(
            prompt_ids=tuple(tokenizer.encode(p)),
            max_tokens=max_tokens,
            sampling=sampling,
            seed=i,
            stop=StopSpec(ignore_eos=True),
        )
        for i, p in enumerate(story_prompts(concurrency, tag))
    ]

    async def one(request, delay_s: float) -> tuple[int, float]:
        await asyncio.sleep(delay_s)
        sent, tokens, first = time.perf_counter(), 0, None
        async for event in engine.submit([request]):
            if event.token_ids and first is None:
                first = time.perf_counter() - sent
            tokens += len(event.token_ids)
        return tokens, first

    async def together() -> tuple[float, float]:
        started = time.perf_counter()
        results = await asyncio.gather(*(one(r, i * stagger_s) for i, r in enumerate(requests)))
        wall = time.perf_counter() - started
        return sum(t for t, _ in results) / wall, statistics.median(f for _, f in results)

    return asyncio.run(together())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = bench_parser("mlxserve over HTTP against mlx-lm's BatchGenerator in-process.")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument(
        "--in-process", action="store_true", help="mlxserve's engine in this process, no HTTP"
    )
    parser.add_argument(
        "--clients",
        choices=("processes", "threads"),
        default="processes",
        help="over HTTP: a client process per request, or threads of one",
    )
    parser.add_argument(
        "--switch-interval-ms",
        type=float,
        help="over HTTP: the server's interpreter lock switch interval (default: mlxserve's)",
    )
    parser.add_argument(
        "--stagger-ms",
        type=float,
        default=0.0,
        help="with --in-process: request i submitted i x this many ms after the first",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="with --in-process: where the engine thread spends its time (stack_sampler.py)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    reexec_for_cpu()  # the process settings `mlxserve serve` runs under
    import mlx_lm

    from mlxserve.platform import current_policy

    path = args.model or default_model()
    model, tokenizer = mlx_lm.load(path)
    policy = current_policy()
    policy.prepare_model(model)
    limits, https, ttfts = [], [], []
    sampling = None
    if args.temperature > 0:
        sampling = {"temperature": args.temperature, "top_p": args.top_p}

    def the_limit(tag: str) -> float:
        return limit_rate(
            model, tokenizer, args.concurrency, args.max_tokens, args.temperature, args.top_p, tag
        )

    def repeat(measure) -> None:
        """Each repeat's prompts are new to both sides (`story_prompts`): the limit has no
        prefix cache, and mlxserve's would otherwise skip the prompts from the second on."""
        for i in range(args.repeats):
            tag = f"Repeat {i + 1}. "
            limits.append(the_limit(tag))
            rate, ttft = measure(tag)
            https.append(rate)
            ttfts.append(ttft)
            print(f"repeat {i + 1}: {limits[-1]:.1f} / {rate:.1f} tok/s", file=sys.stderr)

    if args.in_process:
        from mlxserve.engine import Engine

        engine = Engine(path).start()
        if not engine.wait_ready(600):
            row_failed("batch limit", RuntimeError(f"the engine did not load: {engine.error}"))
            return 1
        sampler = StackSampler("mlxserve-engine") if args.profile else nullcontext()

        def sampled(tag: str) -> tuple[float, float]:
            with sampler:
                return engine_rate(
                    engine,
                    tokenizer,
                    args.concurrency,
                    args.max_tokens,
                    args.temperature,
                    args.top_p,
                    args.stagger_ms / 1000,
                    tag,
                )

        try:
            repeat(sampled)
        finally:
            engine.stop()
        if args.profile:
            print(sampler.report(), file=sys.stderr)
    else:
        try:
            env = dict(os.environ)
            if args.switch_interval_ms is not None:
                env[SWITCH_INTERVAL_ENV] = str(args.switch_interval_ms)
            with served(partial(start_server, path, env=env), "batch-limit") as server:
                repeat(
                    lambda tag: concurrency_row(
                        server.url,
                        args.concurrency,
                        args.max_tokens,
                        sampling,
                        clients=args.clients,
                        tag=tag,
                    )[:2]
                )
        except ROW_ERRORS as error:
            row_failed("batch limit", error)
            return 1
    limit, http = statistics.median(limits), statistics.median(https)
    way = "in-process (no HTTP)"
    if args.in_process and args.stagger_ms:
        way += f", requests {args.stagger_ms:g} ms apart"
    if not args.in_process:
        interval = args.switch_interval_ms
        way = f"over HTTP ({args.clients} as clients, switch interval {interval or 'default'})"
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
            (f"mlxserve {way}, tok/s (each repeat)", ", ".join(f"{r:.1f}" for r in https)),
            ("mlxserve median time to first token", f"{statistics.median(ttfts):.3f} s"),
            (f"mlxserve {way} / limit (medians)", f"{http / limit:.2f}  (target >= 0.90)"),
        ]
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
