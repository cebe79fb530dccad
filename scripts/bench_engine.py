"""The engine benchmark: mlxserve beside mlx_lm.server, same model, same machine, one run.

- aggregate output tokens/s and p50/p95 time to first token at concurrency 1, 4 and 16
  (distinct prompts, greedy, `max_tokens` each, streamed; a token is a streamed text chunk);
- time to first token of a ~2k-token prompt, cold and then repeated (the prefix cache);
- the largest inter-token gap of a running stream while another request prefills a long prompt,
  over that stream's median gap.

Used by scripts/bench.py (`--skip-engine` leaves it out); prints a table, asserts nothing.
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial

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


def concurrency_row(
    base_url: str, c: int, max_tokens: int, sampling: dict | None = None, seeded: bool = True
) -> tuple[float, float, float]:
    """`c` distinct prompts at once: tokens/s over all of them, ttft p50 and p95. With
    `sampling` and `seeded`, request i is seeded with i."""
    prompts = [f"Story {i} of {c}: once upon a time, {WORDS[i % len(WORDS)]}" for i in range(c)]

    def one(i: int) -> Streamed:
        body = sampling
        if sampling is not None and seeded:
            body = sampling | {"seed": i}
        return stream(base_url, prompts[i], max_tokens, sampling=body)

    start = time.perf_counter()
    with ThreadPoolExecutor(c) as pool:
        results = list(pool.map(one, range(c)))
    wall = time.perf_counter() - start
    ttfts = sorted(r.ttft for r in results)
    p95 = ttfts[min(len(ttfts) - 1, int(round(0.95 * (len(ttfts) - 1))))]
    return sum(r.tokens for r in results) / wall, statistics.median(ttfts), p95


def prefix_row(base_url: str, tokens: int) -> tuple[float, float]:
    prompt = long_prompt(tokens, f"prefix-{time.time_ns()}")  # unique: cold on either server
    cold = stream(base_url, prompt, 4).ttft
    warm = stream(base_url, prompt, 4).ttft
    return cold, warm


def gap_row(base_url: str, prefill_tokens: int) -> tuple[float, float, float, float]:
    """Max inter-token gap of a stream while a long prompt is prefilled beside it, the stream's
    median gap before that, the share of the prompt's wait the stream lasted (under 1: the
    stream reached its token limit first, so the end of the prefill, and the prompt joining the
    decode batch, fell outside the measurement), and the stream's median gap after the prompt is
    answered (its own decode step, at the depth it reached meanwhile)."""
    started, finished = threading.Event(), threading.Event()
    window: list[float] = []
    after_finish = [0]

    def on_token(n: int) -> bool:
        if n == GAP_TOKENS_BEFORE:
            started.set()
        if finished.is_set():
            after_finish[0] += 1
        return after_finish[0] >= GAP_TOKENS_AFTER

    # built before any stream starts: tokenizing it (~30 ms of this client's CPU) inside the
    # window, as it was, landed in a server step on a 2-core machine and was measured as a gap
    prompt = long_prompt(prefill_tokens, f"gap-{time.time_ns()}")

    def other() -> None:
        started.wait()
        window.append(time.perf_counter())
        stream(base_url, prompt, 1)
        window.append(time.perf_counter())
        finished.set()

    helper = threading.Thread(target=other)
    with no_client_gc():
        helper.start()
        result = stream(base_url, "Count slowly: one, two, three,", GAP_STREAM_MAX_TOKENS, on_token)
        helper.join()
    pairs = list(zip(result.stamps, result.stamps[1:]))
    before = [b - a for a, b in pairs if b < window[0]]
    during = [b - a for a, b in pairs if b >= window[0] and a <= window[1]]
    after = [b - a for a, b in pairs if a > window[1]]
    covered = min(1.0, (result.stamps[-1] - window[0]) / (window[1] - window[0]))
    median_after = statistics.median(after) if after else float("nan")
    return max(during), statistics.median(before), covered, median_after


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
