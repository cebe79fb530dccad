"""KV memory: quantized KV (`--kv-bits` 8 and 4) against the platform's float KV: bytes per
token, quality, and the long sequences admitted at once within one KV budget.

- KV bytes per token, float / 8-bit / 4-bit, measured on the loaded model as the server measures
  it (what admission and `--kv-budget-mb` count);
- quality: `--prompts` fixed prompts, each continued greedily with float KV for `--tokens`
  tokens; the whole text then scored in one forward pass with each KV (teacher-forced): the
  share of positions whose top token is the float run's, and the mean absolute difference of
  that token's logprob;
- the most `--sequence-tokens` sequences admitted at once within one `--kv-budget-mb`: a server
  per setting, `--requests` distinct streamed requests (`--sequence-tokens` prompt tokens, 1 to
  generate) sent together and held open until all are answered, counted by their answer (200
  admitted, 503 busy).

The float KV is in the dtype of the model's activations: float32 under the CPU policy, 16-bit
for a bfloat16 model under MLXSERVE_PORTABLE=1 (as a Mac runs it). This script only prints; it
asserts nothing.

    python benchmarks/memory.py [--model PATH] [--prompts 8] [--tokens 64]
                                [--kv-budget-mb 1024] [--sequence-tokens 4096] [--requests 48]
"""

from __future__ import annotations

import argparse
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import httpx
from common import (
    ROW_ERRORS,
    bench_parser,
    default_model,
    print_table,
    reexec_for_cpu,
    row_failed,
    served,
    start_server,
)

SETTINGS = ((None, "float"), (8, "8-bit"), (4, "4-bit"))
GROUP_SIZE = 64
PROMPTS = [
    "The history of the printing press begins",
    "def merge_sort(items):\n",
    "Once upon a time, in a village by the sea,",
    "The three laws of thermodynamics state that",
    "Dear Sir or Madam, I am writing to complain about",
    "SELECT name, COUNT(*) FROM orders",
    "Photosynthesis is the process by which",
    "In 1969, the first humans to walk on the Moon",
    "The recipe calls for two cups of flour,",
    "A binary search tree is a data structure",
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = bench_parser(
        "KV memory: quantized KV (--kv-bits 8, 4) against the platform's float KV: bytes per "
        "token, top-token agreement, long sequences admitted within one KV budget."
    )
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64, help="continued per prompt")
    parser.add_argument("--kv-budget-mb", type=int, default=1024)
    parser.add_argument("--sequence-tokens", type=int, default=4096)
    parser.add_argument("--requests", type=int, default=48)
    return parser.parse_args(argv)


def loaded(path: str, bits: int | None):
    """The model as the server runs it (the platform's weights), its caches packed to `bits`."""
    import mlx_lm

    from mlxserve.engine.mlx_lm_compat.quantized_kv import install
    from mlxserve.platform import current_policy

    model, tokenizer = mlx_lm.load(path)
    current_policy().prepare_model(model)
    if bits is not None:
        install(model, bits, GROUP_SIZE)
    return model, tokenizer


def quality_rows(path: str, prompts: int, tokens: int) -> list[tuple[str, str]]:
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from mlxserve.engine.models.host import kv_bytes_per_token

    def scored(model, ids: list[int]) -> mx.array:
        """Each position's logprobs, the whole text in one pass."""
        logits = model(mx.array([ids]), cache=make_prompt_cache(model))[0]
        return logits - mx.logsumexp(logits, axis=-1, keepdims=True)

    rows, texts, reference = [], [], []
    for bits, name in SETTINGS:
        model, tokenizer = loaded(path, bits)
        if bits is None:  # the float run's continuations: the texts all settings score
            import mlx_lm
            from mlx_lm.sample_utils import make_sampler

            for prompt in PROMPTS[:prompts]:
                ids = tokenizer.encode(prompt)
                steps = mlx_lm.stream_generate(
                    model, tokenizer, mx.array(ids), max_tokens=tokens, sampler=make_sampler(0.0)
                )
                texts.append((len(ids), ids + [step.token for step in steps]))
        per_token = kv_bytes_per_token(model)
        rows.append((f"KV bytes per token, {name}", f"{per_token:,}"))
        if bits is None:
            full_bytes = per_token
            for start, ids in texts:
                reference.append(scored(model, ids)[start - 1 : -1])
            continue
        rows[-1] = (rows[-1][0], f"{per_token:,} ({full_bytes / per_token:.2f}x fewer)")
        agree = total = 0
        differences = []
        for (start, ids), ref in zip(texts, reference):
            mine = scored(model, ids)[start - 1 : -1]
            picked = mx.array(ids[start:])[:, None]
            agree += (mine.argmax(-1) == ref.argmax(-1)).sum().item()
            total += ref.shape[0]
            mine, ref = (mx.take_along_axis(lp, picked, axis=-1) for lp in (mine, ref))
            differences.append(mx.abs(mine - ref).mean().item())
        rows.append(
            (
                f"{name} vs float: top token agreement; mean |logprob difference|",
                f"{agree / total:.1%} of {total}; {sum(differences) / len(differences):.4f}",
            )
        )
        print(f"{name} done", file=sys.stderr)
    return rows


def admitted(url: str, requests: int, sequence_tokens: int) -> int:
    """Distinct long requests sent at once: how many the server takes (200) before it is busy."""

    answered = threading.Barrier(requests, timeout=300)

    def one(i: int) -> int:
        ids = [100 + (j * 31 + i * 977) % 20000 for j in range(sequence_tokens)]
        body = {"prompt": ids, "max_tokens": 1, "stream": True}
        with httpx.Client(timeout=300) as client:
            with client.stream("POST", f"{url}/v1/completions", json=body) as response:
                answered.wait()  # held until every request is answered: all in flight at once
                return response.status_code  # then closed: the server cancels it

    with ThreadPoolExecutor(requests) as pool:
        codes = list(pool.map(one, range(requests)))
    unexpected = [c for c in codes if c not in (200, 503)]
    if unexpected:
        raise RuntimeError(f"answers other than 200 and 503: {unexpected}")
    return codes.count(200)


def admission_rows(path: str, args: argparse.Namespace) -> list[tuple[str, str]]:
    rows, counts = [], {}
    for bits, name in SETTINGS:
        extra = ["--kv-budget-mb", str(args.kv_budget_mb), "--prefix-cache-dir", "none"]
        if bits is not None:
            extra += ["--kv-bits", str(bits), "--kv-group-size", str(GROUP_SIZE)]
        try:
            with served(partial(start_server, path, extra=extra), f"kv-{name}") as server:
                counts[name] = admitted(server.url, args.requests, args.sequence_tokens)
        except ROW_ERRORS as error:
            row_failed(f"admission, {name}", error)
            continue
        ratio = f" ({counts[name] / counts['float']:.1f}x)" if "float" in counts else ""
        rows.append(
            (
                f"{args.sequence_tokens}-token sequences admitted at once in "
                f"{args.kv_budget_mb} MiB, {name}",
                f"{counts[name]} of {args.requests}{ratio}",
            )
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    reexec_for_cpu()
    from mlxserve.platform import current_policy

    path = args.model or default_model()
    rows = [("model, platform", f"{path}, {current_policy().description}")]
    rows += quality_rows(path, args.prompts, args.tokens)
    rows += admission_rows(path, args)
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
