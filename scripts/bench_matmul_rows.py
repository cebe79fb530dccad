"""A decode pass by its row count on this machine, with its matmuls on the rows as they are and
padded as the CPU policy pads them (`mlxserve/platform/matmul_rows.py`): the model as the server
prepares it, through mixed batches' forward pass (`mixed_forward`), each row at KV depth
`--depth`; the median of `--repeats` passes for each count, the two interleaved. `--whole-blocks`:
padded to a whole block whatever spills over one (why a few rows past one are left as they
are). This script only prints; it asserts nothing.

    python scripts/bench_matmul_rows.py [--model PATH] [--rows 1 2 ... 32] [--depth 64]
                                        [--repeats 15] [--whole-blocks]
"""

from __future__ import annotations

import argparse
import statistics

from bench_common import (
    bench_parser,
    call_times_ms,
    mixed_batch_model,
    print_table,
    reexec_for_cpu,
    rewind,
)

ROWS = (1, 2, 4, 6, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 20, 24, 28, 32)
ROUNDS = 3  # each side's repeats, in this many alternating rounds


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = bench_parser("A decode pass by its row count, its matmul rows as they are and padded.")
    parser.add_argument("--rows", type=int, nargs="+", default=list(ROWS))
    parser.add_argument("--depth", type=int, default=64, help="each row's KV depth")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument(
        "--whole-blocks", action="store_true", help="pad every count to a whole block"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    reexec_for_cpu()
    import mlx.core as mx
    from mlx_lm.models.cache import BatchKVCache

    from mlxserve.engine.mlx_lm_compat.mixed_batch import mixed_forward
    from mlxserve.platform.matmul_rows import ROW_BLOCK, padded_rows

    def whole_blocks(rows: int) -> int:
        return -(-rows // ROW_BLOCK) * ROW_BLOCK

    pad = whole_blocks if args.whole_blocks else padded_rows
    prepared = mixed_batch_model(args.model)
    if prepared is None:
        return 1
    model_path, model, policy = prepared
    attention = policy.attention()

    def passes(rows: int) -> tuple[list[float], list[float]]:
        """Each round's passes as they are, then padded (none where `pad` adds no rows)."""
        caches = [BatchKVCache(left_padding=[0] * rows) for _ in model.model.layers]
        mx.eval(model(mx.array([[5] * args.depth] * rows), cache=caches))
        inputs = mx.array([[7]] * rows)

        def decode(matmul_rows):
            def run() -> None:
                rewind(caches, args.depth)
                parts = [(inputs, caches)]
                mx.eval(mixed_forward(model, parts, attention=attention, matmul_rows=matmul_rows))

            return run

        plain, padded = [], []
        for _ in range(ROUNDS):
            plain += call_times_ms(decode(None), args.repeats // ROUNDS + 1)
            if pad(rows) != rows:
                padded += call_times_ms(decode(pad), args.repeats // ROUNDS + 1)
        return plain, padded

    table = [("model", f"{model_path} ({policy.description})"), ("KV depth", str(args.depth))]
    for rows in args.rows:
        plain_times, padded_times = passes(rows)
        plain = statistics.median(plain_times)
        cell = f"{plain:.1f} ms"
        if padded_times:
            padded = statistics.median(padded_times)
            cell += f"; on {pad(rows)} rows: {padded:.1f} ms ({plain / padded:.2f}x)"
        table.append((f"{rows} rows", cell))
    print_table(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
