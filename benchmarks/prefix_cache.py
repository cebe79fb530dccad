"""A repeated long prompt's time to first token against its cold time: on mlxserve and on
mlx_lm.server (`repeat`), or on a restarted mlxserve, the prompt's KV read from the prefix cache
on disk (`restart`).

`repeat` (the default): on each server in turn (mlxserve, then mlx_lm.server), a unique
`--prompt-tokens` prompt (4 tokens to generate) sent twice: the first time cold, the second
served from the prefix cache. Target for mlxserve: >= 10x faster repeated.

`restart`: a server with `--prefix-cache-dir` on a fresh temporary folder; each of `--repeats`
runs sends a unique `--prompt-tokens` prompt (`max_tokens` 1) to that server, which is then
stopped (SIGTERM: it writes what waits), and the same prompt to a new server over the same
folder, sent beside a running greedy stream whose gaps are timed (the read should not hold
them). Per run: time to first token cold / after the restart (target >= 10x), and the stream's
worst gap meanwhile over its median gap; then the size of the files written. A prompt longer
than the model's declared context is timed on the model with that context raised.

This script only prints; it asserts nothing.

    python benchmarks/prefix_cache.py [repeat] [--model PATH] [--prompt-tokens 2000]
    python benchmarks/prefix_cache.py restart [--model PATH] [--prompt-tokens 8000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from functools import partial
from pathlib import Path

from common import (
    ROW_ERRORS,
    bench_parser,
    beside,
    default_model,
    load_tokenizer,
    long_prompt,
    print_table,
    reexec_for_cpu,
    row_failed,
    served,
    start_mlx_lm_server,
    start_server,
    stream,
    stretched_context,
    unique_tag,
)

CONTEXT_MARGIN = 64  # room beside the prompt for the template and its answer


def parse_args() -> argparse.Namespace:
    parser = bench_parser(
        "A repeated long prompt's time to first token against its cold time: mlxserve's prefix "
        "cache against mlx_lm.server's (repeat), or read from disk after a restart (restart)."
    )
    parser.add_argument("what", nargs="?", choices=("repeat", "restart"), default="repeat")
    parser.add_argument("--prompt-tokens", type=int, help="default: 2000 (repeat), 8000 (restart)")
    parser.add_argument("--repeats", type=int, default=1, help="restart: prompts, each restarted")
    args = parser.parse_args()
    args.prompt_tokens = args.prompt_tokens or (2000 if args.what == "repeat" else 8000)
    return args


def repeat(args: argparse.Namespace, model: str) -> int:
    tokenizer = load_tokenizer(model)
    rows = [("model", model)]
    for name, start in (("mlxserve", start_server), ("mlx_lm.server", start_mlx_lm_server)):
        try:
            with served(partial(start, model), f"repeat-{name}") as server:
                stream(server.url, "warm up", 4)
                prompt = long_prompt(tokenizer, args.prompt_tokens, unique_tag("prefix"))
                cold = stream(server.url, prompt, 4).ttft
                warm = stream(server.url, prompt, 4).ttft
        except ROW_ERRORS as error:
            row_failed(f"repeat ({name})", error)
            return 1
        rows.append(
            (
                f"{name}: ~{args.prompt_tokens}-token prompt ttft cold / repeated",
                f"{cold:.3f} / {warm:.3f} s = {cold / warm:.1f}x faster"
                + ("  (target >= 10x)" if name == "mlxserve" else ""),
            )
        )
    print_table(rows)
    return 0


def restart(args: argparse.Namespace, model: str) -> int:
    tokenizer = load_tokenizer(model)
    served_model = stretched_context(model, args.prompt_tokens + CONTEXT_MARGIN)
    rows = [("model, prompt tokens", f"{model}, {args.prompt_tokens}")]
    with tempfile.TemporaryDirectory(prefix="mlxserve-bench-restart-") as folder:
        start = partial(start_server, served_model, extra=["--prefix-cache-dir", folder])
        for number in range(1, args.repeats + 1):
            prompt = long_prompt(tokenizer, args.prompt_tokens, unique_tag("restart"))
            try:
                with served(start, "restart-cold") as server:
                    cold = stream(server.url, prompt, 1).ttft
                with served(start, "restart-warm") as server:
                    warm = beside(server.url, prompt)
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


def main() -> int:
    args = parse_args()
    reexec_for_cpu()  # the process settings `mlxserve serve` runs under
    model = args.model or default_model()
    return (repeat if args.what == "repeat" else restart)(args, model)


if __name__ == "__main__":
    sys.exit(main())
