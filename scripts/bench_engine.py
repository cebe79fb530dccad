"""The engine's benchmark rows, each a ratio measured in one run; it prints, asserts nothing.

    python scripts/bench_engine.py versus [--model PATH] [--max-tokens 64] [--concurrency-only]
                                          [--temperature 0.8 [--seeded]] [--prefill-tokens 8000]
    python scripts/bench_engine.py limit [--temperature 0.8 --top-p 0.95] [--in-process] ...
    python scripts/bench_engine.py curve [--prompt-tokens 8000] [--streams 1] [--gaps 2 3 5 off]
    python scripts/bench_engine.py carried [--decode-depth 300] ...
    python scripts/bench_engine.py restart [--prompt-tokens 8000] [--repeats 1]
    python scripts/bench_engine.py kv [--kv-budget-mb 1024] [--sequence-tokens 4096] ...
    python scripts/bench_engine.py all [--model PATH]

- `versus`: mlxserve beside mlx_lm.server, same model, same machine: aggregate output tokens/s
  and p50/p95 time to first token at concurrency 1, 4 and 16 (distinct prompts, greedy unless
  `--temperature`, `max_tokens` each, streamed; a token is a streamed text chunk); time to first
  token of a ~2k-token prompt, cold and then repeated (the prefix cache); the largest
  inter-token gap of a running stream while another request prefills a long prompt, over that
  stream's median gap. With equal weights quantized on both sides, run it under
  MLXSERVE_PORTABLE=1 (else mlxserve's CPU policy serves float32 weights).
- `limit`: mlxserve at concurrency 16 against mlx-lm's BatchGenerator in-process
  (scripts/bench_batch_limit.py).
- `curve`: `--max-stream-gap` against the prefill time of a prompt beside streams
  (scripts/bench_gap_curve.py).
- `carried`: a decode pass's cost by the prompt tokens it carries
  (scripts/bench_carried_chunk.py).
- `restart`: a repeated long prompt's time to first token on a restarted server, its KV read
  from the prefix cache on disk, against its cold time.
- `kv`: quantized KV (`--kv-bits`) against float KV: bytes per token, quality, sequences
  admitted within one KV budget (scripts/bench_kv.py).
- `all`: the rows above as docs/benchmarks.md quotes them, one after the other (long).

scripts/bench.py runs `versus` after its own rows (`--skip-engine` leaves it out).
"""

from __future__ import annotations

import functools
import multiprocessing
import statistics
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import httpx
from bench_common import (
    ROW_ERRORS,
    ServerFailed,
    Streamed,
    no_client_gc,
    openblas_library,
    print_table,
    row_failed,
    served,
    start_mlx_lm_server,
    start_server,
    stream_completion,
)

CONCURRENCY = (1, 4, 16)
# The gap row's stream may run this long: it stops GAP_TOKENS_AFTER tokens after the long prompt
# is answered, and it must outlive the whole prefill, join included. With 1024 it ended 60-84%
# into a 7,500-token prompt's wait, so the deepest chunks and the join (the worst step) went
# unmeasured.
GAP_STREAM_MAX_TOKENS = 7000  # under SmolLM2's 8192-token context with the short stream prompt
GAP_TOKENS_AFTER = 32  # the stream's tokens after the long prompt's answer: its gap alone, later
# The stream's tokens before the long prompt is sent: its median gap, the row's yardstick, is
# taken over these. Over 16 (one second) it measured 0.050-0.072 s from run to run on the 2-core
# VM, whose speed drifts, and moved the ratio as much as the worst gap did.
GAP_TOKENS_BEFORE = 64
GAP_STREAM_PROMPT = "Count slowly: one, two, three,"
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron".split()


def stream(
    base_url: str, prompt: str, max_tokens: int, on_token=None, sampling: dict | None = None
) -> Streamed:
    """One streamed completion, greedy unless `sampling` says otherwise: time to first text
    chunk, tokens (the usage chunk's count, else text chunks), and each text chunk's time.

    `on_token(count)` may return True to stop reading (the client leaves).
    """
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    body |= sampling or {}
    body["ignore_eos"] = True  # mlxserve: every run decodes max_tokens (mlx_lm.server ignores it)
    body["stream_options"] = {"include_usage": True}
    sent = time.perf_counter()
    with httpx.Client(timeout=httpx.Timeout(900.0, connect=10.0)) as client:
        result = stream_completion(client, base_url, body, on_token)
    result.sent = sent  # as it always was: the new client's setup counts in the ttft
    if not result.stamps:
        raise ServerFailed(f"{base_url} streamed no text")
    return result


TOKENIZER = None  # the model's, set by run(): prompts are cut to an exact token count


def long_prompt(tokens: int, tag: str) -> str:
    """Varied text of about `tokens` tokens of the served model's tokenizer, starting with `tag`."""
    words = [f"{WORDS[(i * 7 + len(tag)) % len(WORDS)]}{i % 97}" for i in range(tokens)]
    text = f"{tag}: " + " ".join(words)
    ids = TOKENIZER.encode(text, add_special_tokens=False)[: tokens - 8]
    return TOKENIZER.decode(ids) + "\n"


@functools.cache
def client_processes(c: int) -> ProcessPoolExecutor:
    """`c` client processes, started once and warmed (each has imported the client): every
    concurrent request streams in a process of its own, so what is measured is the server, not
    one client interpreter parsing every stream's lines under its one lock."""
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


def story_prompts(c: int, tag: str = "") -> list[str]:
    """The concurrency row's `c` prompts, each starting with `tag`: a bench that repeats the row
    tags each repeat, so that no repeat finds the last one's prompts in the prefix cache."""
    return [f"{tag}Story {i} of {c}: once upon a time, {WORDS[i % len(WORDS)]}" for i in range(c)]


def prefix_row(base_url: str, tokens: int) -> tuple[float, float]:
    prompt = long_prompt(tokens, f"prefix-{time.time_ns()}")  # unique: cold on either server
    cold = stream(base_url, prompt, 4).ttft
    warm = stream(base_url, prompt, 4).ttft
    return cold, warm


@dataclass
class Beside:
    """A long prompt sent while streams run: what it waited and what the streams saw."""

    waited: float  # the prompt's time to first token beside the streams
    worst: float  # the measured stream's longest gap while the prompt waited
    median: float  # its median gap before the prompt was sent (the yardstick)
    # the share of the prompt's wait the stream lasted: under 1, the stream reached its token
    # limit first, so the end of the prefill (the prompt joining the batch) went unmeasured
    covered: float
    median_after: float  # its median gap after the prompt's answer (nan: not measured)


def beside(
    base_url: str, tokens: int, streams: int = 1, tokens_after: int = 0, prompt: str | None = None
) -> Beside:
    """Send a unique `tokens`-token prompt (or `prompt`; `max_tokens` 1) once the first of
    `streams` greedy streams has run GAP_TOKENS_BEFORE tokens; the streams stop when it is
    answered, the first `tokens_after` tokens later (its own decode step afterwards, at the depth
    it reached)."""
    # built before any stream starts: tokenizing it (~30 ms of this client's CPU) inside the
    # window, as it was, landed in a server step on a 2-core machine and was measured as a gap
    prompt = prompt or long_prompt(tokens, f"beside-{time.time_ns()}")
    started, finished = threading.Event(), threading.Event()
    window: list[float] = []
    after_finish = [0]

    def measured_token(n: int) -> bool:
        if n == GAP_TOKENS_BEFORE:
            started.set()
        if finished.is_set():
            after_finish[0] += 1
        return after_finish[0] >= max(tokens_after, 1)

    def other_token(n: int) -> bool:
        return finished.is_set()

    def prompt_beside() -> None:
        started.wait()
        window.append(time.perf_counter())
        stream(base_url, prompt, 1)
        window.append(time.perf_counter())
        finished.set()

    limit = GAP_STREAM_MAX_TOKENS
    others = [
        threading.Thread(
            target=stream, args=(base_url, f"{GAP_STREAM_PROMPT} ({i})", limit, other_token)
        )
        for i in range(streams - 1)
    ]
    helper = threading.Thread(target=prompt_beside)
    with no_client_gc():
        for thread in [*others, helper]:
            thread.start()
        result = stream(base_url, GAP_STREAM_PROMPT, limit, measured_token)
        for thread in [*others, helper]:
            thread.join()
    pairs = list(zip(result.stamps, result.stamps[1:]))
    before = [b - a for a, b in pairs if b < window[0]]
    during = [b - a for a, b in pairs if b >= window[0] and a <= window[1]]
    after = [b - a for a, b in pairs if a > window[1]]
    return Beside(
        waited=window[1] - window[0],
        worst=max(during),
        median=statistics.median(before),
        covered=min(1.0, (result.stamps[-1] - window[0]) / (window[1] - window[0])),
        median_after=statistics.median(after) if after else float("nan"),
    )


def gap_row(base_url: str, prefill_tokens: int) -> tuple[float, float, float, float]:
    """Max inter-token gap of a stream while a long prompt is prefilled beside it, its median
    gap before, the share of the prompt's wait it covered, its median gap after (`Beside`)."""
    seen = beside(base_url, prefill_tokens, 1, GAP_TOKENS_AFTER)
    return seen.worst, seen.median, seen.covered, seen.median_after


def measure(
    name: str,
    base_url: str,
    max_tokens: int,
    prefix_tokens: int,
    prefill_tokens: int,
    warm_rows: bool = False,
    sampling: dict | None = None,
    concurrency_only: bool = False,
    seeded: bool = False,
) -> dict[str, float]:
    """One server's numbers: concurrency (greedy, or with `sampling`, and with `seeded` a seed a
    request: mlx_lm.server runs seeded requests one at a time), the repeated prompt, the gap
    beside a prefill (not with `concurrency_only`). With `warm_rows`, each concurrency row runs
    once unmeasured first (a GPU backend compiles kernels for each new batch shape on first
    use)."""
    stream(base_url, "warm up", 4)
    row: dict[str, float] = {}
    for c in CONCURRENCY:
        if warm_rows:
            concurrency_row(base_url, c, max_tokens, sampling, seeded)
        tps, p50, p95 = concurrency_row(base_url, c, max_tokens, sampling, seeded)
        row[f"c{c} tok/s"], row[f"c{c} ttft p50"], row[f"c{c} ttft p95"] = tps, p50, p95
        print(f"{name} c={c}: {tps:.1f} tok/s, ttft p50 {p50:.3f} s", file=sys.stderr)
    if concurrency_only:
        return row
    row["prefix cold ttft"], row["prefix warm ttft"] = prefix_row(base_url, prefix_tokens)
    gaps = gap_row(base_url, prefill_tokens)
    row["gap max"], row["gap median"], row["gap covered"], row["gap after"] = gaps
    print(f"{name}: {row}", file=sys.stderr)
    return row


def run(
    model: str,
    max_tokens: int,
    prefix_tokens: int,
    prefill_tokens: int,
    warm_rows: bool = False,
    temperature: float = 0.0,
    concurrency_only: bool = False,
    seeded: bool = False,
) -> None:
    """Measure both servers, one after the other, and print the comparison; a server that does
    not start (or fails) prints `row engine (NAME): ...` instead, and the bench goes on."""
    from transformers import AutoTokenizer

    global TOKENIZER
    TOKENIZER = AutoTokenizer.from_pretrained(model)
    TOKENIZER.model_max_length = 10**9
    rows: dict[str, dict[str, float]] = {}
    sampling = {"temperature": temperature, "top_p": 0.95} if temperature > 0 else None
    for name, start in (("mlxserve", start_server), ("mlx_lm.server", start_mlx_lm_server)):
        try:
            with served(partial(start, model), f"engine-{name}") as server:
                rows[name] = measure(
                    name,
                    server.url,
                    max_tokens,
                    prefix_tokens,
                    prefill_tokens,
                    warm_rows,
                    sampling,
                    concurrency_only,
                    seeded,
                )
        except ROW_ERRORS as error:
            row_failed(f"engine ({name})", error)
            if name == "mlxserve":
                print("row engine (mlx_lm.server): skipped, nothing to compare it with")
            return
    ours_row, theirs = rows["mlxserve"], rows["mlx_lm.server"]
    blas = "OpenBLAS, both servers" if openblas_library() else "MLX's own"
    table = [("model", model), ("max tokens per request", str(max_tokens)), ("CPU BLAS", blas)]
    table.append(
        (
            "sampling",
            f"temperature {temperature}, top_p 0.95"
            + (", a seed a request" if seeded else ", unseeded")
            if sampling
            else "greedy",
        )
    )
    for c in CONCURRENCY:
        a, b = ours_row[f"c{c} tok/s"], theirs[f"c{c} tok/s"]
        table.append(
            (
                f"concurrency {c}: tok/s (ours / mlx_lm.server)",
                f"{a:.1f} / {b:.1f} = {a / b:.2f}x" + ("  (target >= 1.5x)" if c == 16 else ""),
            )
        )
        table.append(
            (
                f"concurrency {c}: ttft p50, p95 (ours | theirs)",
                f"{ours_row[f'c{c} ttft p50']:.3f}, {ours_row[f'c{c} ttft p95']:.3f} s | "
                f"{theirs[f'c{c} ttft p50']:.3f}, {theirs[f'c{c} ttft p95']:.3f} s",
            )
        )
    for name, row in rows.items():
        if concurrency_only:
            break
        cold, warm = row["prefix cold ttft"], row["prefix warm ttft"]
        table.append(
            (
                f"{name}: ~{prefix_tokens}-token prompt ttft cold / repeated",
                f"{cold:.3f} / {warm:.3f} s = {cold / warm:.1f}x faster"
                + ("  (target >= 10x)" if name == "mlxserve" else ""),
            )
        )
        table.append(
            (
                f"{name}: max gap while ~{prefill_tokens} tokens prefill / median gap",
                f"{row['gap max']:.3f} / {row['gap median']:.3f} s = "
                f"{row['gap max'] / row['gap median']:.1f}x"
                + ("  (target <= 3x)" if name == "mlxserve" else "")
                + (
                    f"; the stream ended {row['gap covered']:.0%} into the prompt's wait"
                    if row["gap covered"] < 1
                    else f"; median gap after it {row['gap after']:.3f} s"
                ),
            )
        )
    print_table(table)


def versus(argv: list[str] | None = None) -> int:
    from bench_common import bench_parser, default_model, reexec_for_cpu

    parser = bench_parser("mlxserve beside mlx_lm.server on the same model.")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per request")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy; top_p 0.95")
    parser.add_argument("--seeded", action="store_true", help="a seed a sampled request")
    parser.add_argument("--concurrency-only", action="store_true", help="only those rows")
    parser.add_argument("--prefix-tokens", type=int, default=2000, help="repeated prompt")
    parser.add_argument("--prefill-tokens", type=int, default=8000, help="beside a stream")
    parser.add_argument("--warm-rows", action="store_true", help="each row once unmeasured")
    args = parser.parse_args(argv)
    reexec_for_cpu()  # the process settings `mlxserve serve` runs under
    run(
        args.model or default_model(),
        args.max_tokens,
        args.prefix_tokens,
        args.prefill_tokens,
        args.warm_rows,
        args.temperature,
        args.concurrency_only,
        args.seeded,
    )
    return 0


def restart(argv: list[str] | None = None) -> int:
    """A repeated long prompt's time to first token on a restarted server (its KV read from the
    prefix cache on disk) against its first, cold time, on the same folder and model; on the
    restarted server it is sent beside a running stream, whose gaps the read should not hold."""
    import tempfile

    from bench_common import bench_parser, default_model, reexec_for_cpu, stretched_context
    from transformers import AutoTokenizer

    parser = bench_parser("A repeated long prompt after a restart against cold.")
    parser.add_argument("--prompt-tokens", type=int, default=8000)
    parser.add_argument("--repeats", type=int, default=1, help="prompts, each on a restart")
    args = parser.parse_args(argv)
    reexec_for_cpu()
    global TOKENIZER
    model = args.model or default_model()
    TOKENIZER = AutoTokenizer.from_pretrained(model)
    TOKENIZER.model_max_length = 10**9
    served_model = stretched_context(model, args.prompt_tokens + 64)
    rows = [("model, prompt tokens", f"{model}, {args.prompt_tokens}")]
    with tempfile.TemporaryDirectory(prefix="mlxserve-bench-restart-") as folder:
        start = partial(start_server, served_model, extra=["--prefix-cache-dir", folder])
        for number in range(1, args.repeats + 1):
            prompt = long_prompt(args.prompt_tokens, f"restart-{time.time_ns()}")
            try:
                with served(start, "restart-cold") as server:
                    cold = stream(server.url, prompt, 1).ttft
                with served(start, "restart-warm") as server:
                    warm = beside(server.url, args.prompt_tokens, prompt=prompt)
            except ROW_ERRORS as error:
                row_failed("restart", error)
                return 1
            rows.append(
                (
                    f"run {number}: time to first token cold / after a restart (a stream "
                    "beside it); the stream's worst gap meanwhile / its median",
                    f"{cold:.2f} / {warm.waited:.3f} s = {cold / warm.waited:.0f}x  (target "
                    f">= 10x); {warm.worst:.3f} / {warm.median:.3f} s = "
                    f"{warm.worst / warm.median:.1f}x",
                )
            )
        size = sum(f.stat().st_size for f in Path(folder).iterdir())
    rows.append(("files written", f"{size / (1 << 20):,.0f} MiB"))
    print_table(rows)
    return 0


def kv(argv: list[str]) -> int:
    import bench_kv

    return bench_kv.main(argv)


def limit(argv: list[str]) -> int:
    import bench_batch_limit

    return bench_batch_limit.main(argv)


def curve(argv: list[str]) -> int:
    import bench_gap_curve

    return bench_gap_curve.main(argv)


def carried(argv: list[str]) -> int:
    import bench_carried_chunk

    return bench_carried_chunk.main(argv)


# `all`: what docs/benchmarks.md quotes for the engine, in this order.
ALL_ROWS = (
    (versus, ["--concurrency-only"]),
    (versus, ["--concurrency-only", "--temperature", "0.8"]),
    (versus, ["--concurrency-only", "--temperature", "0.8", "--seeded"]),
    (limit, []),
    (limit, ["--temperature", "0.8", "--top-p", "0.95"]),
    (curve, ["--prompt-tokens", "8000", "--gaps", "2", "3", "5", "off"]),
    (curve, ["--prompt-tokens", "8000", "--streams", "4", "--gaps", "3"]),
    (curve, ["--prompt-tokens", "16000", "--gaps", "3"]),
    (restart, ["--prompt-tokens", "8000"]),
    (kv, []),
)
COMMANDS = {
    "versus": versus,
    "limit": limit,
    "curve": curve,
    "carried": carried,
    "restart": restart,
    "kv": kv,
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in [*COMMANDS, "all"]:
        print(__doc__, file=sys.stderr)
        return 2
    command, rest = argv[0], argv[1:]
    if command != "all":
        return COMMANDS[command](rest)
    failed = 0
    for row, options in ALL_ROWS:
        print(f"== {row.__name__} {' '.join(options)}", flush=True)
        failed |= row([*options, *rest])
    return failed


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
