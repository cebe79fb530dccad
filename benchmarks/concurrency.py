"""Concurrent streams: mlxserve's aggregate tokens/s and time to first token at N streams at
once, against mlx_lm.server (the default) or against mlx-lm's BatchGenerator in this process.

`--against mlx_lm.server`: both servers on the same model and machine, one after the other; at
each of `--concurrency` (1, 4 and 16), that many distinct prompts at once, each streamed from a
client process of its own (so what is measured is the server, not one client interpreter
parsing every stream's lines under its one lock), `--max-tokens` each, greedy unless
`--temperature` (then top_p `--top-p`; `--seeded`: a seed a request, which mlx_lm.server runs
one at a time). Before each row every client process makes one `GET /v1/models`, so both servers
meet warm clients. Aggregate tokens/s is all streams' tokens (each stream's usage chunk) over
the wall time from the first request to the last token; time to first token p50 / p95 over the
streams. `--concurrency 1` is one stream against mlx_lm.server. mlxserve's CPU policy serves a
quantized model's weights as float32; for equal quantized weights on both sides run it under
MLXSERVE_PORTABLE=1, for equal float weights pass a float model (`mlx_lm.convert --dequantize
--dtype float32`). `--warm-rows`: each row once unmeasured first (a GPU backend compiles
kernels for each new batch shape on first use).

`--against batch-generator`: the limit of this stack, mlx-lm's `BatchGenerator` decoding the
same prompts in this process (no HTTP, no server), on the model prepared as the server prepares
it, beside mlxserve serving them over HTTP (a seed a request when sampled; in-process one mlx-lm
sampler shared by all rows, its fastest). Every sequence decodes exactly `--max-tokens` tokens;
tokens/s from submitting to the last token, prefill included on both sides. The two are
interleaved `--repeats` times and the medians compared; each repeat's prompts are new to both
(the limit has no prefix cache). Target: mlxserve / limit >= 0.90. `--in-process`: mlxserve's
engine in this process instead of a server, driven through `Engine.submit` as the front doors
drive it (its own cost per step, without HTTP's); `--stagger-ms MS` there submits request i at
i x MS ms, as a burst's requests reach a server spread out, each one's time to first token
counted from its own submission; `--profile`: where the engine thread's time goes;
`--no-drafts`: the engine without prompt lookup, so that two runs show what drafting costs or
gives a batch.

This script only prints; it asserts nothing.

    python benchmarks/concurrency.py [--model PATH] [--concurrency 1 4 16] [--max-tokens 64]
                                     [--temperature 0.8 [--top-p 0.95] [--seeded]] [--warm-rows]
    python benchmarks/concurrency.py --against batch-generator [--concurrency 16]
                                     [--max-tokens 128] [--repeats 3] [--temperature 0.8]
                                     [--clients processes|threads] [--switch-interval-ms 5]
                                     [--in-process [--stagger-ms 30] [--profile] [--no-drafts]]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import multiprocessing
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import nullcontext
from functools import partial

import httpx
from common import (
    ROW_ERRORS,
    WORDS,
    Streamed,
    add_engine_flag,
    bench_parser,
    default_model,
    engine_flags,
    openblas_library,
    print_table,
    reexec_for_cpu,
    row_failed,
    served,
    start_mlx_lm_server,
    start_server,
    stream,
)

SERVER, LIMIT = "mlx_lm.server", "batch-generator"
DEFAULTS = {  # per baseline: concurrency levels, tokens a request
    SERVER: ((1, 4, 16), 64),
    LIMIT: ((16,), 128),
}
MLX_LM_SERVER_TARGET = "  (target >= 1.5x)"


def parse_args() -> argparse.Namespace:
    parser = bench_parser(
        "Aggregate tokens/s and time to first token at N concurrent streams: mlxserve against "
        "mlx_lm.server (default) or against mlx-lm's BatchGenerator in-process (the limit)."
    )
    parser.add_argument("--against", choices=(SERVER, LIMIT), default=SERVER)
    parser.add_argument(
        "--concurrency", type=int, nargs="+", help="streams at once (default: 1 4 16; 16)"
    )
    parser.add_argument("--max-tokens", type=int, help="tokens a request (default: 64; 128)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    parser.add_argument("--top-p", type=float, default=0.95, help="when sampled")
    parser.add_argument(
        "--seeded",
        action="store_true",
        help=f"against {SERVER}: a seed a sampled request (it then runs them one at a time)",
    )
    parser.add_argument(
        "--warm-rows", action="store_true", help=f"against {SERVER}: each row once unmeasured"
    )
    parser.add_argument("--repeats", type=int, default=3, help=f"against {LIMIT}")
    parser.add_argument(
        "--clients",
        choices=("processes", "threads"),
        default="processes",
        help=f"against {LIMIT}, over HTTP: a client process per request, or threads of one",
    )
    parser.add_argument(
        "--switch-interval-ms",
        type=float,
        help=f"against {LIMIT}, over HTTP: the server's interpreter lock switch interval",
    )
    parser.add_argument(
        "--in-process",
        action="store_true",
        help=f"against {LIMIT}: mlxserve's engine in this process, no HTTP",
    )
    parser.add_argument(
        "--stagger-ms",
        type=float,
        default=0.0,
        help="with --in-process: request i submitted i x this many ms after the first",
    )
    parser.add_argument(
        "--no-drafts",
        action="store_true",
        help="with --in-process: the engine without prompt lookup (what drafting costs or gives)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="with --in-process: where the engine thread spends its time (stack_sampler.py)",
    )
    add_engine_flag(parser)
    args = parser.parse_args()
    levels, max_tokens = DEFAULTS[args.against]
    args.concurrency = args.concurrency or list(levels)
    args.max_tokens = args.max_tokens or max_tokens
    if not args.in_process and (args.stagger_ms or args.profile or args.no_drafts):
        parser.error("--stagger-ms, --profile and --no-drafts go with --in-process")
    if args.against == LIMIT and len(args.concurrency) > 1:
        parser.error(f"against {LIMIT}, one --concurrency")
    return args


# -- the concurrency rows over HTTP ---------------------------------------------------------


def story_prompts(c: int, tag: str = "") -> list[str]:
    """A row's `c` distinct prompts, each starting with `tag`: a benchmark that repeats the row
    tags each repeat, so that no repeat finds the last one's prompts in the prefix cache."""
    return [f"{tag}Story {i} of {c}: once upon a time, {WORDS[i % len(WORDS)]}" for i in range(c)]


@functools.cache
def client_processes(c: int) -> ProcessPoolExecutor:
    """`c` client processes, started once and warmed (each has imported the client)."""
    pool = ProcessPoolExecutor(c, mp_context=multiprocessing.get_context("spawn"))
    list(pool.map(_ready, range(c), chunksize=1))
    return pool


def _ready(i: int) -> int:
    return i


def warm_clients(base_url: str, c: int) -> None:
    """Each of the `c` client processes makes one request of `base_url` (`GET /v1/models`, no
    generation) before a row is timed: a process's first request costs it its lazy imports,
    which in a burst of 16 fresh processes contend with the server for the CPU; both servers
    are measured with clients warmed alike, whichever goes first."""
    list(client_processes(c).map(_warm_client, [base_url] * c, chunksize=1))


def _warm_client(base_url: str) -> None:
    with httpx.Client(timeout=30.0) as client:
        client.get(f"{base_url}/v1/models")
    time.sleep(0.2)  # held, so that every process of the pool takes one


def _stream_one(base_url: str, prompt: str, max_tokens: int, body: dict | None) -> Streamed:
    return stream(base_url, prompt, max_tokens, sampling=body)


def concurrency_row(
    base_url: str,
    c: int,
    max_tokens: int,
    sampling: dict | None = None,
    seeded: bool = True,
    clients: str = "processes",
    tag: str = "",
) -> tuple[float, float, float]:
    """`c` distinct prompts at once, each from its own client process (`clients="threads"`:
    threads of this one): tokens/s over all of them, ttft p50 and p95. With `sampling` and
    `seeded`, request i is seeded with i. `tag` starts every prompt (`story_prompts`)."""
    prompts = story_prompts(c, tag)
    bodies = [
        sampling | {"seed": i} if sampling is not None and seeded else sampling for i in range(c)
    ]
    if clients == "processes":
        warm_clients(base_url, c)
    pool = client_processes(c) if clients == "processes" else ThreadPoolExecutor(c)
    start = time.perf_counter()
    futures = [
        pool.submit(_stream_one, base_url, prompts[i], max_tokens, bodies[i]) for i in range(c)
    ]
    results = [f.result() for f in futures]
    wall = time.perf_counter() - start
    if clients != "processes":
        pool.shutdown()
    ttfts = sorted(r.ttft for r in results)
    p95 = ttfts[min(len(ttfts) - 1, int(round(0.95 * (len(ttfts) - 1))))]
    return sum(r.tokens for r in results) / wall, statistics.median(ttfts), p95


def against_mlx_lm_server(args: argparse.Namespace, model: str, sampling: dict | None) -> int:
    """Both servers' rows, one server after the other; a server that does not start (or fails)
    prints `row NAME: ...` instead of the table."""
    rows: dict[str, dict[int, tuple[float, float, float]]] = {}
    for name, start in (("mlxserve", start_server), (SERVER, start_mlx_lm_server)):
        try:
            with served(partial(start, model), f"concurrency-{name}") as server:
                stream(server.url, "warm up", 4)
                rows[name] = {}
                for c in args.concurrency:
                    if args.warm_rows:
                        concurrency_row(server.url, c, args.max_tokens, sampling, args.seeded)
                    row = concurrency_row(server.url, c, args.max_tokens, sampling, args.seeded)
                    rows[name][c] = row
                    print(
                        f"{name} c={c}: {row[0]:.1f} tok/s, ttft p50 {row[1]:.3f} s",
                        file=sys.stderr,
                    )
        except ROW_ERRORS as error:
            row_failed(f"concurrency ({name})", error)
            if name == "mlxserve":
                print(f"row concurrency ({SERVER}): skipped, nothing to compare it with")
            return 1
    ours, theirs = rows["mlxserve"], rows[SERVER]
    blas = "OpenBLAS, both servers" if openblas_library() else "MLX's own"
    sampled = f"temperature {args.temperature}, top_p {args.top_p}"
    sampled += ", a seed a request" if args.seeded else ", unseeded"
    table = [
        ("model", model),
        ("max tokens per request", str(args.max_tokens)),
        ("CPU BLAS", blas),
        ("sampling", sampled if sampling else "greedy"),
    ]
    for c in args.concurrency:
        (a, ours_p50, ours_p95), (b, their_p50, their_p95) = ours[c], theirs[c]
        target = MLX_LM_SERVER_TARGET if c == 16 else ""
        table.append(
            (
                f"concurrency {c}: tok/s (ours / {SERVER})",
                f"{a:.1f} / {b:.1f} = {a / b:.2f}x{target}",
            )
        )
        table.append(
            (
                f"concurrency {c}: ttft p50, p95 (ours | theirs)",
                f"{ours_p50:.3f}, {ours_p95:.3f} s | {their_p50:.3f}, {their_p95:.3f} s",
            )
        )
    print_table(table)
    return 0


# -- the limit: mlx-lm's BatchGenerator in this process --------------------------------------


def limit_rate(
    model, tokenizer, concurrency: int, max_tokens: int, temperature: float, top_p: float, tag: str
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
    stagger_s: float,
    tag: str,
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


def against_batch_generator(args: argparse.Namespace, path: str, sampling: dict | None) -> int:
    """The limit and mlxserve (over HTTP, or its engine in-process) interleaved, one table."""
    import mlx_lm

    from mlxserve.platform import current_policy

    model, tokenizer = mlx_lm.load(path)
    policy = current_policy()
    policy.prepare_model(model)
    (c,) = args.concurrency
    top_p = args.top_p if sampling else 1.0
    limits, ours, ttfts = [], [], []

    def repeat(measure) -> None:
        """Each repeat's prompts are new to both sides (`story_prompts`): the limit has no
        prefix cache, and mlxserve's would otherwise skip the prompts from the second on."""
        for i in range(args.repeats):
            tag = f"Repeat {i + 1}. "
            limits.append(
                limit_rate(model, tokenizer, c, args.max_tokens, args.temperature, top_p, tag)
            )
            rate, ttft = measure(tag)
            ours.append(rate)
            ttfts.append(ttft)
            print(f"repeat {i + 1}: {limits[-1]:.1f} / {rate:.1f} tok/s", file=sys.stderr)

    if args.in_process:
        from mlxserve.engine import Engine

        engine = Engine(path, **({"speculation": None} if args.no_drafts else {})).start()
        if not engine.wait_ready(600):
            row_failed("batch limit", RuntimeError(f"the engine did not load: {engine.error}"))
            return 1
        if args.profile:
            from stack_sampler import StackSampler

            sampler = StackSampler("mlxserve-engine")
        else:
            sampler = nullcontext()

        def in_process(tag: str) -> tuple[float, float]:
            with sampler:
                return engine_rate(
                    engine,
                    tokenizer,
                    c,
                    args.max_tokens,
                    args.temperature,
                    top_p,
                    args.stagger_ms / 1000,
                    tag,
                )

        try:
            repeat(in_process)
        finally:
            engine.stop()
        if args.profile:
            print(sampler.report(), file=sys.stderr)
        way = "in-process (no HTTP" + (", no drafts)" if args.no_drafts else ")")
        if args.stagger_ms:
            way += f", requests {args.stagger_ms:g} ms apart"
    else:
        from mlxserve.server import SWITCH_INTERVAL_ENV

        env = dict(os.environ)
        if args.switch_interval_ms is not None:
            env[SWITCH_INTERVAL_ENV] = str(args.switch_interval_ms)
        try:
            start = partial(start_server, path, extra=engine_flags(args), env=env)
            with served(start, "batch-limit") as server:
                repeat(
                    lambda tag: concurrency_row(
                        server.url, c, args.max_tokens, sampling, clients=args.clients, tag=tag
                    )[:2]
                )
        except ROW_ERRORS as error:
            row_failed("batch limit", error)
            return 1
        interval = args.switch_interval_ms or "default"
        way = f"over HTTP ({args.clients} as clients, switch interval {interval})"
    limit, rate = statistics.median(limits), statistics.median(ours)
    sampled = f"temperature {args.temperature}, top_p {top_p}, a seed a request"
    print_table(
        [
            ("model, platform", f"{path}, {policy.description}"),
            ("concurrency / tokens each / repeats", f"{c} / {args.max_tokens} / {args.repeats}"),
            ("sampling", sampled if sampling else "greedy"),
            (
                "BatchGenerator in-process, tok/s (each repeat)",
                ", ".join(f"{r:.1f}" for r in limits),
            ),
            (f"mlxserve {way}, tok/s (each repeat)", ", ".join(f"{r:.1f}" for r in ours)),
            ("mlxserve median time to first token", f"{statistics.median(ttfts):.3f} s"),
            (f"mlxserve {way} / limit (medians)", f"{rate / limit:.2f}  (target >= 0.90)"),
        ]
    )
    return 0


def main() -> int:
    args = parse_args()
    reexec_for_cpu()  # the process settings `mlxserve serve` runs under
    model = args.model or default_model()
    sampling = None
    if args.temperature > 0:
        sampling = {"temperature": args.temperature, "top_p": args.top_p}
    if args.against == SERVER:
        return against_mlx_lm_server(args, model, sampling)
    return against_batch_generator(args, model, sampling)


if __name__ == "__main__":
    sys.exit(main())
