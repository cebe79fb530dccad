"""Where a decode pass's time goes on this machine: the pass as the server runs it (mixed
batches' forward pass, the CPU policy's model, attention and matmul rows) against the same pass
with one part taken out: attention with its KV write, RoPE, or the RMS norms; then all three,
which leaves the matmuls, the MLP's activation and the residual adds. A part's cost is what
taking it out saves. The variants alternate over `--rounds`; the medians of every round's passes
are compared. This script only prints; it asserts nothing.

    python scripts/bench_step_parts.py [--model PATH] [--rows 1 16] [--depth 64] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
from contextlib import ExitStack, contextmanager
from functools import partial
from types import SimpleNamespace

from bench_common import (
    bench_parser,
    call_times_ms,
    mixed_batch_model,
    print_table,
    reexec_for_cpu,
    rewind,
)

PARTS = ("attention and its KV write", "RoPE", "RMS norms")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = bench_parser("A decode pass, and the same pass without each of its parts.")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--depth", type=int, default=64, help="each row's KV depth")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5, help="timed passes a round")
    return parser.parse_args(argv)


def identity(x, *args, **kwargs):
    """A part taken out: its first input as its output (attention: the queries)."""
    return x


@contextmanager
def swapped(pairs):
    """Each (object, attribute) set to `identity` inside, restored after."""
    saved = [(obj, name, getattr(obj, name)) for obj, name in pairs]
    for obj, name, _ in saved:
        setattr(obj, name, identity)
    try:
        yield
    finally:
        for obj, name, value in saved:
            setattr(obj, name, value)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    reexec_for_cpu()
    import mlx.core as mx
    from mlx_lm.models.cache import BatchKVCache

    from mlxserve.engine.mlx_lm_compat.mixed_batch import mixed_forward

    prepared = mixed_batch_model(args.model)
    if prepared is None:
        return 1
    model_path, model, policy = prepared
    layers = model.model.layers
    attention, matmul_rows = policy.attention(), policy.matmul_rows()
    state = SimpleNamespace(attention=attention)  # the pass's, swapped like the modules
    taken_out = {
        "attention and its KV write": [(state, "attention")],
        "RoPE": [(layer.self_attn, "rope") for layer in layers],
        "RMS norms": [
            (layer, name)
            for layer in layers
            for name in ("input_layernorm", "post_attention_layernorm")
        ]
        + [(model.model, "norm")],
    }

    def variant(parts: tuple[str, ...]):
        @contextmanager
        def context():
            with ExitStack() as stack:
                for part in parts:
                    stack.enter_context(swapped(taken_out[part]))
                yield

        return context

    def decode_pass(inputs, caches) -> None:
        rewind(caches, args.depth)
        parts = [(inputs, caches)]
        mx.eval(mixed_forward(model, parts, attention=state.attention, matmul_rows=matmul_rows))

    variants = {"the pass": variant(())}
    variants |= {f"without {part}": variant((part,)) for part in PARTS}
    variants["without all three"] = variant(PARTS)

    table = [("model", f"{model_path} ({policy.description})"), ("KV depth", str(args.depth))]
    for rows in args.rows:
        caches = [BatchKVCache(left_padding=[0] * rows) for _ in layers]
        mx.eval(model(mx.array([[5 + i] * args.depth for i in range(rows)]), cache=caches))
        inputs = mx.array([[7 + i] for i in range(rows)])

        decode = partial(decode_pass, inputs, caches)

        times = {label: [] for label in variants}
        for _ in range(args.rounds):
            for label, context in variants.items():
                with context():
                    times[label] += call_times_ms(decode, args.repeats)
        full = statistics.median(times["the pass"])
        table.append((f"{rows} rows: the pass", f"{full:.1f} ms"))
        for label in list(variants)[1:]:
            rest = statistics.median(times[label])
            table.append((f"{rows} rows: {label}", f"{rest:.1f} ms (saves {full - rest:.1f} ms)"))
    print_table(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
