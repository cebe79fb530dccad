"""What a decode pass costs when it carries a prompt chunk of k tokens (mixed batches), against
the bare decode pass and against the same chunk in a pass of its own: the shape the pacer's
spread chunks follow (engine/scheduling/pacing.py, SPREAD_CHUNK).

The model as the server prepares it (the platform's weights and attention); one decode row at
depth `--decode-depth`, the prompt at depth `--prompt-depth`; each time the median of `--repeats`
passes, all in this process. This script only prints; it asserts nothing.

`--layers N`: the chunk goes through its first N layers only, as a spread chunk's pass does
(the per-token figure is then per token's worth, N / all layers of a token). `--spread`: also
how far the slowest of the same decode passes strays from their median on this machine.

    python scripts/bench_carried_chunk.py [--model PATH] [--decode-depth 300]
                                          [--prompt-depth 1000] [--repeats 15]
                                          [--chunks 1 4 8 ...] [--layers N] [--spread]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable

from bench_common import (
    bench_parser,
    call_times_ms,
    mixed_batch_model,
    print_table,
    reexec_for_cpu,
    rewind,
)

CHUNKS = (1, 4, 8, 16, 24, 32, 64)
FILL_PASS = 64  # tokens a pass while the caches are filled


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = bench_parser("A decode pass's cost by the prompt tokens it carries.")
    parser.add_argument("--decode-depth", type=int, default=300)
    parser.add_argument("--prompt-depth", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--chunks", type=int, nargs="+", default=list(CHUNKS))
    parser.add_argument("--layers", type=int, default=None, help="layers the chunk goes through")
    parser.add_argument(
        "--spread", action="store_true", help="also the decode passes' slowest against median"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    reexec_for_cpu()
    import mlx.core as mx
    from mlx_lm.models.cache import BatchKVCache

    from mlxserve.engine.mlx_lm_compat.mixed_batch import PromptPart, mixed_forward

    prepared = mixed_batch_model(args.model)
    if prepared is None:
        return 1
    model_path, model, policy = prepared
    attention = policy.attention()

    def filled(depth: int) -> list:
        caches = [BatchKVCache(left_padding=[0]) for _ in model.model.layers]
        tokens = mx.array([[100 + i % 1000 for i in range(depth)]])
        for start in range(0, depth, FILL_PASS):
            model(tokens[:, start : start + FILL_PASS], cache=caches)
            mx.eval([c.state for c in caches])
        return caches

    decode, prompt = filled(args.decode_depth), filled(args.prompt_depth)

    spreads = []  # (what, the passes' times in ms, sorted)

    def timed(run: Callable[[], None], what: str = "") -> float:
        times = call_times_ms(run, args.repeats)
        if what:
            spreads.append((what, times))
        return statistics.median(times)

    def decode_pass(k: int = 0) -> Callable[[], None]:
        def run() -> None:
            rewind(decode, args.decode_depth)
            rewind(prompt, args.prompt_depth)
            part = PromptPart(mx.array([[7 + i for i in range(k)]]), [k], prompt) if k else None
            logits = mixed_forward(model, [(mx.array([[5]]), decode)], part, args.layers, attention)
            mx.eval(logits, [c.state for c in prompt])

        return run

    def prompt_pass(k: int) -> Callable[[], None]:
        def run() -> None:
            rewind(prompt, args.prompt_depth)
            mx.eval(model(mx.array([[7 + i for i in range(k)]]), cache=prompt))

        return run

    layers = len(model.model.layers)
    bare = timed(decode_pass(), "the decode pass")
    rows = [
        ("model", f"{model_path} ({policy.description})"),
        ("decode pass, one row at depth", f"{args.decode_depth}: {bare:.1f} ms"),
    ]
    share = (args.layers or layers) / layers
    for k in args.chunks:
        carried = timed(decode_pass(k), f"the decode pass carrying {k}")
        alone = timed(prompt_pass(k))
        rows.append(
            (
                f"carrying {k} prompt tokens at depth {args.prompt_depth}"
                + (f" through {args.layers} layers" if args.layers else ""),
                f"{carried:.1f} ms (+{carried - bare:.1f}, {(carried - bare) / k / share:.2f} ms a "
                f"token's worth); in a pass of its own {alone:.1f} ms ({alone / k:.2f} a token)",
            )
        )
    if args.spread:
        for what, times in spreads:
            q99 = times[min(len(times) - 1, int(0.99 * len(times)))]
            median = statistics.median(times)
            rows.append(
                (
                    f"{what}: median, 99th percentile, slowest of {len(times)}",
                    f"{median:.1f}, {q99:.1f}, {times[-1]:.1f} ms ({times[-1] / median:.2f}x)",
                )
            )
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
