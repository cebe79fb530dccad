"""The trade `--max-stream-gap` sets: a running stream's worst pause while a long prompt
prefills beside it, against that prompt's prefill time.

For each bound (`--gaps`, default 2, 3, 5 and off), one server with `--max-stream-gap` set to it:
first a `--prompt-tokens` prompt alone (a unique text, `max_tokens: 1`: its time to first token
is its prefill), then another unique prompt of the same length sent while `--streams` greedy
streams run (`ignore_eos`). Per bound: the prompt's time beside the streams over its time alone
(both measured on that server in that run), and the measured stream's longest gap while the
prompt waited over its median gap before it. With a bound of g, a prompt beside one stream can
have at most about (g-1)/g of the machine, so its prefill takes at least ~g/(g-1) times its
time alone (1.5x at g = 3). A prompt longer than the model's declared context is timed on the
model with that context raised (`bench_common.stretched_context`). This client's garbage
collector is off while the gaps are timed (`bench_common.no_client_gc`). This script only prints;
it asserts nothing.

    python scripts/bench_gap_curve.py [--model PATH] [--prompt-tokens 2000] [--streams 1]
                                      [--gaps 2 3 5 off] [--server-args '--flag value']
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from functools import partial

import bench_engine
from bench_common import (
    ROW_ERRORS,
    bench_parser,
    default_model,
    print_table,
    reexec_for_cpu,
    row_failed,
    served,
    start_server,
    stretched_context,
)
from bench_engine import beside, long_prompt, stream

CONTEXT_MARGIN = 1024  # room beside the prompt for the template and the streams' tokens


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = bench_parser("Stream gap bound -> prefill time beside streams.")
    parser.add_argument("--prompt-tokens", type=int, default=2000)
    parser.add_argument("--streams", type=int, default=1, help="streams running beside it")
    parser.add_argument("--gaps", nargs="+", default=["2", "3", "5", "off"])
    parser.add_argument(
        "--server-args",
        default="",
        help="more `mlxserve serve` flags, e.g. '--prefix-cache-dir none'",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    reexec_for_cpu()  # the process settings `mlxserve serve` runs under
    from transformers import AutoTokenizer

    model = args.model or default_model()
    bench_engine.TOKENIZER = AutoTokenizer.from_pretrained(model)
    served_model = stretched_context(model, args.prompt_tokens + CONTEXT_MARGIN)
    rows = [
        ("model", model if served_model == model else f"{model}, context raised"),
        ("prompt tokens / streams beside it", f"{args.prompt_tokens} / {args.streams}"),
        ("server flags", args.server_args or "(defaults)"),
    ]
    for gap in args.gaps:
        extra = ["--max-stream-gap", gap, *shlex.split(args.server_args)]
        start = partial(start_server, served_model, extra=extra)
        try:
            with served(start, f"gap-{gap}") as server:
                alone_prompt = long_prompt(args.prompt_tokens, f"alone-{time.time_ns()}")
                alone = stream(server.url, alone_prompt, 1).ttft
                seen = beside(server.url, args.prompt_tokens, args.streams)
        except ROW_ERRORS as error:
            row_failed(f"--max-stream-gap {gap}", error)
            continue
        rows.append(
            (
                f"--max-stream-gap {gap}: prefill beside / alone; worst gap / median",
                f"{seen.waited:.1f} / {alone:.1f} s = {seen.waited / alone:.2f}x; "
                f"{seen.worst:.3f} / {seen.median:.3f} s = {seen.worst / seen.median:.1f}x",
            )
        )
        print(f"--max-stream-gap {gap} done", file=sys.stderr)
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
