"""MLX's own attention kernel against the CPU policy's vectorised one (platform/attention.py),
by shape: where the policy switches from one to the other (`MIN_SCORES`).

Random float32 queries, keys and values in SmolLM2's head layout (9 query heads over 3 key/value
heads, 64 wide); each time the median of `--repeats` calls, both kernels timed side by side in
this process. This script only prints; it asserts nothing.

    python scripts/bench_attention.py [--repeats 200]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable

from bench_common import bench_parser, call_times_ms, print_table, reexec_for_cpu

HEADS, KV_HEADS, DIM = 9, 3, 64
# (rows, queries a row, keys): decode batches at growing depths, and prompt chunks
SHAPES = [
    (1, 1, 64),
    (1, 1, 255),
    (1, 1, 1024),
    (4, 1, 64),
    (4, 1, 128),
    (16, 1, 16),
    (16, 1, 64),
    (16, 1, 150),
    (16, 1, 600),
    (1, 16, 64),
    (1, 16, 255),
    (1, 64, 255),
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = bench_parser("MLX's attention kernel against the vectorised one, by shape.")
    parser.add_argument("--repeats", type=int, default=200)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    reexec_for_cpu()
    import mlx.core as mx

    from mlxserve.platform import attention as cpu_attention

    def timed(run: Callable[[], None]) -> float:
        return statistics.median(call_times_ms(run, args.repeats))

    rows = [("switch to the vectorised kernel from", f"{cpu_attention.MIN_SCORES} scores")]
    for batch, length, keys in SHAPES:
        q = mx.random.normal((batch, HEADS, length, DIM))
        k = mx.random.normal((batch, KV_HEADS, keys, DIM))
        v = mx.random.normal((batch, KV_HEADS, keys, DIM))
        mask = "causal" if length > 1 else None
        mx.eval(q, k, v)

        def mlx_kernel(q=q, k=k, v=v, mask=mask) -> None:
            mx.eval(mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask=mask))

        def vectorised(q=q, k=k, v=v, mask=mask) -> None:
            mx.eval(cpu_attention.attention(q, k, v, 0.125, mask))

        theirs, ours = timed(mlx_kernel), timed(vectorised)
        scores = batch * HEADS * length * keys
        rows.append(
            (
                f"{batch} rows x {length} queries x {keys} keys ({scores} scores)",
                f"MLX {theirs:.3f} ms, vectorised {ours:.3f} ms ({theirs / ours:.2f}x)",
            )
        )
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
