"""A long prompt prefilled beside running streams: the streams' worst pause against the prompt's
prefill time, per `--max-stream-gap` bound (the gap curve), or against mlx_lm.server's.

The curve (the default): for each bound (`--gaps`, default 2, 3, 5 and off), one server with
`--max-stream-gap` set to it: first a `--prompt-tokens` prompt alone (a unique text,
`max_tokens: 1`: its time to first token is its prefill), then another unique prompt of the
same length sent while `--streams` greedy streams run (`ignore_eos`). Per bound: the prompt's
time beside the streams over its time alone (both measured on that server in that run), and the
measured stream's longest gap while the prompt waited over its median gap before it. With a
bound of g, a prompt beside one stream can have at most about (g-1)/g of the machine, so its
prefill takes at least ~g/(g-1) times its time alone (1.5x at g = 3). A prompt longer than the
model's declared context is timed on the model with that context raised
(`common.stretched_context`: the answers past it mean nothing, the time they take is real).

`--against mlx_lm.server`: the same measured stream, and a unique `--prompt-tokens` prompt sent
beside it, on mlxserve (its default bound) and then on mlx_lm.server: each one's worst gap while
the prompt waited over its median gap before (target for mlxserve: <= 3x), and the stream's
median gap after the prompt's answer.

This client's garbage collector is off while the gaps are timed (`common.no_client_gc`). This
script only prints; it asserts nothing.

    python benchmarks/prefill_beside_streams.py [--model PATH] [--prompt-tokens 2000]
                                                [--streams 1] [--gaps 2 3 5 off]
                                                [--server-args '--flag value']
    python benchmarks/prefill_beside_streams.py --against mlx_lm.server [--prompt-tokens 8000]
"""

from __future__ import annotations

import argparse
import shlex
import sys
from functools import partial

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

CONTEXT_MARGIN = 1024  # room beside the prompt for the template and the streams' tokens
TOKENS_AFTER = 32  # the stream's tokens after the prompt's answer: its gap alone, later


def parse_args() -> argparse.Namespace:
    parser = bench_parser(
        "Stream gaps while a long prompt prefills beside them, against the prompt's prefill "
        "time per --max-stream-gap bound (the gap curve), or against mlx_lm.server's gaps."
    )
    parser.add_argument("--prompt-tokens", type=int, default=2000)
    parser.add_argument("--streams", type=int, default=1, help="streams running beside it")
    parser.add_argument("--gaps", nargs="+", default=["2", "3", "5", "off"])
    parser.add_argument(
        "--server-args",
        default="",
        help="more `mlxserve serve` flags, e.g. '--prefix-cache-dir none'",
    )
    parser.add_argument(
        "--against",
        choices=("mlx_lm.server",),
        help="one row each for mlxserve and mlx_lm.server instead of the curve",
    )
    return parser.parse_args()


def gap_curve(args: argparse.Namespace, model: str) -> None:
    tokenizer = load_tokenizer(model)
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
                alone_prompt = long_prompt(tokenizer, args.prompt_tokens, unique_tag("alone"))
                alone = stream(server.url, alone_prompt, 1).ttft
                prompt = long_prompt(tokenizer, args.prompt_tokens, unique_tag("beside"))
                seen = beside(server.url, prompt, args.streams)
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


def against_mlx_lm_server(args: argparse.Namespace, model: str) -> int:
    tokenizer = load_tokenizer(model)
    rows = [("model, prompt tokens", f"{model}, {args.prompt_tokens}")]
    for name, start in (("mlxserve", start_server), ("mlx_lm.server", start_mlx_lm_server)):
        try:
            with served(partial(start, model), f"beside-{name}") as server:
                stream(server.url, "warm up", 4)
                prompt = long_prompt(tokenizer, args.prompt_tokens, unique_tag("beside"))
                seen = beside(server.url, prompt, 1, TOKENS_AFTER)
        except ROW_ERRORS as error:
            row_failed(f"beside ({name})", error)
            return 1
        ending = (
            f"; the stream ended {seen.covered:.0%} into the prompt's wait"
            if seen.covered < 1
            else f"; median gap after it {seen.median_after:.3f} s"
        )
        rows.append(
            (
                f"{name}: max gap while ~{args.prompt_tokens} tokens prefill / median gap",
                f"{seen.worst:.3f} / {seen.median:.3f} s = {seen.worst / seen.median:.1f}x"
                + ("  (target <= 3x)" if name == "mlxserve" else "")
                + ending,
            )
        )
        print(f"{name} done", file=sys.stderr)
    print_table(rows)
    return 0


def main() -> int:
    args = parse_args()
    reexec_for_cpu()  # the process settings `mlxserve serve` runs under
    model = args.model or default_model()
    if args.against:
        return against_mlx_lm_server(args, model)
    gap_curve(args, model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
