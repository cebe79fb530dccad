"""Whether a pipeline of layers keeps its ranks busy at once (issue 62): a long prompt's prefill
and 16 streams' decoding over 1, 2 and 3 local ranks, and what cutting a pass into micro-batches
would cost.

Every process computes on one core (OPENBLAS_NUM_THREADS=1), as each Mac of a pool computes on
its own device: 2 ranks on this 2-core machine then each have a core, and what the stages do at
once shows as more than one rank's rate; 3 ranks share the 2 cores.

1. Served, SmolLM2 (`--parallel pipeline` over 2 and 3 ranks): prompt tokens/s of a 1,024-token
   prompt (unique: no prefix cache holds it; `max_tokens` 1), and decode tokens/s of 16 streams
   at once. Each ratio is against the one rank of the same run.
2. One process, one core: a pass cut into parts against the same work whole (time of the parts
   / time of the whole): a prompt's chunk cut along its tokens, and a decode step's rows cut
   into separate groups. A pipeline of N stages would run M parts in (M + N - 1) / M times a
   part's time, against N whole ones when the stages take turns: parts pay only where a part
   costs about its share of the whole.

    python benchmarks/pipeline_overlap.py [--runs 3] [--prompt-tokens 1024] [--model PATH]
"""

from __future__ import annotations

import copy
import os
import sys
import time
from pathlib import Path

os.environ["OPENBLAS_NUM_THREADS"] = "1"  # before MLX loads OpenBLAS; the ranks inherit it

import httpx  # noqa: E402
from common import (  # noqa: E402
    ROW_ERRORS,
    SHARED_MODEL,
    bench_parser,
    decode_rate,
    how_split,
    load_tokenizer,
    long_prompt,
    print_median_ratios,
    print_table,
    reexec_for_cpu,
    row_failed,
    served_ranks,
    unique_tag,
)

PIPELINE = ["--parallel", "pipeline", "--num-draft-tokens", "0"]
CONFIGS = [
    ("1 rank", 1, ["--num-draft-tokens", "0"]),
    ("2 ranks", 2, PIPELINE),
    ("3 ranks", 3, PIPELINE),
]
STREAMS = 16
STREAM_TOKENS = 48
CHUNK = 512  # tokens of the prompt chunk cut in part 2
ROWS = 16  # rows of the decode step cut in part 2


def parse_args():
    parser = bench_parser("A pipeline of layers: prefill and decode over 1, 2 and 3 ranks")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--prompt-tokens", type=int, default=1024)
    return parser.parse_args()


def timed(work, repeats: int = 3) -> float:
    """The fastest of `repeats` runs of `work()` (which evaluates what it computes), after one
    to warm."""
    work()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - start)
    return best


def part_costs(model_path: str) -> dict[str, float]:
    """Time of the parts over time of the whole: a chunk cut along its tokens, a decode step
    cut along its rows, into 2 and 4."""
    import mlx.core as mx
    import mlx_lm
    from mlx_lm.models.cache import make_prompt_cache

    from mlxserve.platform.policy import current_policy

    model = mlx_lm.load(model_path)[0]
    current_policy().prepare_model(model)
    tokens = mx.random.randint(1, 1000, (1, CHUNK), key=mx.random.key(0))

    def chunk(parts: int) -> None:
        cache = make_prompt_cache(model)
        step = CHUNK // parts
        for start in range(0, CHUNK, step):  # built in turn, evaluated at once, as a rank does
            model(tokens[:, start : start + step], cache=cache)
        mx.eval([c.state for c in cache])

    context = make_prompt_cache(model)
    model(mx.random.randint(1, 1000, (ROWS, 64), key=mx.random.key(1)), cache=context)
    mx.eval([c.state for c in context])
    step_tokens = mx.random.randint(1, 1000, (ROWS, 1), key=mx.random.key(2))

    def decode(parts: int) -> None:
        rows = ROWS // parts
        logits = []
        for start in range(0, ROWS, rows):  # each group of rows its own batch
            group = [copy.copy(c) for c in context]
            for layer, whole in zip(group, context):
                layer.keys, layer.values = (
                    whole.keys[start : start + rows],
                    whole.values[start : start + rows],
                )
            logits.append(model(step_tokens[start : start + rows], cache=group))
        mx.eval(logits)

    costs = {}
    for name, work in (("prompt chunk", chunk), ("decode step", decode)):
        whole = timed(lambda work=work: work(1))
        for parts in (2, 4):
            costs[f"{name} in {parts} parts / whole"] = timed(lambda w=work, p=parts: w(p)) / whole
    return costs


def prefill_rate(url: str, prompt: str) -> float:
    """Prompt tokens/s of one request for `prompt` and one token."""
    body = {"prompt": prompt, "max_tokens": 1, "temperature": 0}
    start = time.perf_counter()
    reply = httpx.post(f"{url}/v1/completions", json=body, timeout=600)
    elapsed = time.perf_counter() - start
    reply.raise_for_status()
    return reply.json()["usage"]["prompt_tokens"] / elapsed


def main() -> int:
    args = parse_args()
    reexec_for_cpu()
    model = args.model or str(SHARED_MODEL)
    tokenizer = load_tokenizer(model)
    rates: dict[str, list[tuple[float, float]]] = {}  # (prefill, decode) by run
    for name, count, flags in CONFIGS:
        try:
            with served_ranks(model, count, flags) as (url, log):
                prefill_rate(url, long_prompt(tokenizer, 128, unique_tag("warm")))
                decode_rate(url, 8, 2)
                print(f"{name}: {how_split(log)}", flush=True)
                rates[name] = []
                for run in range(args.runs):
                    prompt = long_prompt(tokenizer, args.prompt_tokens, unique_tag(name))
                    prefill = prefill_rate(url, prompt)
                    decode = decode_rate(url, STREAM_TOKENS, STREAMS)
                    rates[name].append((prefill, decode))
                    print(
                        f"{name}, run {run + 1}: prefill {prefill:.0f} tok/s, "
                        f"decode {decode:.1f} tok/s",
                        flush=True,
                    )
        except ROW_ERRORS as error:
            row_failed(name, error)
    costs = part_costs(model)
    base = rates.get("1 rank", [])
    rows, ratios = [], {}
    for name, runs in rates.items():
        rows.append(
            (
                f"{name}: prefill / decode tok/s by run",
                "; ".join(f"{p:.0f} / {d:.1f}" for p, d in runs),
            )
        )
        if name != "1 rank" and base:
            ratios[f"{name}, prefill / 1 rank"] = [p / b[0] for (p, _), b in zip(runs, base)]
            ratios[f"{name}, decode c{STREAMS} / 1 rank"] = [
                d / b[1] for (_, d), b in zip(runs, base)
            ]
    print()
    print(
        f"{Path(model).name}, {args.prompt_tokens}-token prompts, {STREAMS} streams of "
        f"{STREAM_TOKENS} tokens, one core a rank, {time.strftime('%Y-%m-%d')}"
    )
    print_table(rows)
    print_median_ratios(ratios)
    print()
    print("one process, one core: the parts' time over the whole's")
    print_table([(name, f"{ratio:.2f}x") for name, ratio in costs.items()])
    return 0 if len(rates) == len(CONFIGS) else 1


if __name__ == "__main__":
    sys.exit(main())
