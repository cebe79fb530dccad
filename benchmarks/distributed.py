"""Decode tokens/s of one model over 1, 2 and 3 local ranks (mlx.distributed's ring backend on
127.0.0.1), at concurrency 1 and 16, side by side in each run: each ratio is against the one
process of the same run (issue 62).

The ranks share this machine's cores, so the figure is what splitting costs a step (the
activations' hand-over, the collectives, ranks waiting on each other), not a speed-up. Rows:
1 rank; 2 ranks (SmolLM2's 9 heads do not split over 2: a pipeline of its layers); 3 ranks as
`--parallel auto` chooses (its heads split over 3; the log says which it chose and why); 3
ranks split by tensors (`--parallel tensor`). The configurations run one after another (they
cannot share 2 cores), each ratio against the one process's run of the same number. Drafting
is off everywhere (the ranks do not draft).

    python benchmarks/distributed.py [--runs 3] [--tokens 48] [--model PATH]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from common import (
    ROW_ERRORS,
    bench_parser,
    decode_rate,
    default_model,
    how_split,
    print_median_ratios,
    print_table,
    reexec_for_cpu,
    row_failed,
    served_ranks,
)

CONCURRENT = 16
OFF = ["--num-draft-tokens", "0"]


def parse_args():
    parser = bench_parser("A model over 1, 2 and 3 local ranks: decode tokens/s")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=48)
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    reexec_for_cpu()
    model = args.model or default_model()
    configs = [
        ("1 rank", 1, []),
        ("2 ranks", 2, []),
        ("3 ranks", 3, []),
        ("3 ranks, tensor", 3, ["--parallel", "tensor"]),
    ]
    rates: dict[str, list[tuple[float, float]]] = {}
    for name, count, extra in configs:
        try:
            with served_ranks(model, count, OFF + extra) as (url, log):
                decode_rate(url, 8, 1)  # warm: shapes, the tokenizer
                print(f"{name}: {how_split(log)}")
                rates[name] = []
                for run in range(args.runs):
                    one = decode_rate(url, args.tokens, 1)
                    many = decode_rate(url, args.tokens, CONCURRENT)
                    rates[name].append((one, many))
                    print(f"{name}, run {run + 1}: c1 {one:.1f} tok/s, c16 {many:.1f} tok/s")
                    sys.stdout.flush()
        except ROW_ERRORS as error:
            row_failed(name, error)
    base = rates.get("1 rank")
    rows, ratios = [], {}
    for name, runs in rates.items():
        cells = []
        for run, (one, many) in enumerate(runs):
            cell = f"{one:.1f} / {many:.1f}"
            if base and name != "1 rank" and run < len(base):
                r1, r16 = one / base[run][0], many / base[run][1]
                ratios.setdefault(f"{name} c1", []).append(r1)
                ratios.setdefault(f"{name} c16", []).append(r16)
                cell += f" ({r1:.2f}x / {r16:.2f}x)"
            cells.append(cell)
        rows.append((f"{name}: c1 / c{CONCURRENT} tok/s by run", "; ".join(cells)))
    print()
    print(f"{Path(model).name}, {args.tokens} tokens a stream, {time.strftime('%Y-%m-%d')}")
    print_table(rows)
    if ratios:
        print_median_ratios(ratios)
    return 0 if len(rates) == len(configs) else 1


if __name__ == "__main__":
    sys.exit(main())
