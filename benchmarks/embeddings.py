"""Embeddings through the server against the same model in-process, side by side in each run;
then a chat stream's gaps while embedding requests run beside it (issue 61).

- `in-process`: mlxserve's embedding model (mlxserve/embedding/) called directly, inputs sorted
  by length in batches of 32 (sentence-transformers' `encode`), embeddings/s;
- `server`: one POST /v1/embeddings with every input (float), and 8 concurrent requests of 32;
- `beside a stream`: a greedy stream on the server's generation model (SmolLM2 by default);
  after GAP_TOKENS_BEFORE tokens, requests of 256 inputs one after the other until it ends.
  Its median gap before them, its worst and 99th-percentile gap while they ran, against the
  bound `--max-stream-gap` (3 times the usual gap). The stream does not draft
  (`num_draft_tokens: 0`): its prompt repeats itself, so prompt lookup would turn its later steps
  into verify passes of several tokens and twice the time, and the gaps after would be measured
  against the plain steps before.

Inputs: 256 pieces of this repository's Python source, ~100 tokens each (the model's own
tokenizer). The model: all-MiniLM-L6-v2 (scripts/fetch_embedding_model.py) unless `--model`.

    python benchmarks/embeddings.py [--runs 3] [--inputs 256] [--tokens 100]
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from common import (
    GAP_TOKENS_BEFORE,
    REPO_ROOT,
    ROW_ERRORS,
    bench_parser,
    default_model,
    print_median_ratios,
    print_table,
    reexec_for_cpu,
    row_failed,
    served,
    start_server,
    stream,
)

BATCH = 32  # sentence-transformers' encode batch
CONCURRENT = 8
STREAM_TOKENS = 400
GAP_BOUND = 3.0  # --max-stream-gap's default
PROMPT = "Count slowly: one, two, three,"


def parse_args():
    parser = bench_parser(
        "Embeddings: the server against the model in-process, and beside a stream"
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--inputs", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=100)
    parser.add_argument("--embedding-model", help="default: build/models/all-MiniLM-L6-v2")
    return parser.parse_args()


def pieces(tokenizer, count: int, tokens: int) -> list[str]:
    """`count` texts of about `tokens` tokens, cut from the repository's own sources."""
    ids = []
    for path in sorted((REPO_ROOT / "mlxserve").rglob("*.py")):
        ids += tokenizer.encode(path.read_text(), add_special_tokens=False)
        if len(ids) >= count * tokens:
            break
    return [tokenizer.decode(ids[i * tokens : (i + 1) * tokens]) for i in range(count)]


def in_process_rate(model, rows: list[list[int]]) -> float:
    import mlx.core as mx

    order = sorted(rows, key=len)
    started = time.perf_counter()
    for start in range(0, len(order), BATCH):
        mx.eval(model.embed(order[start : start + BATCH]))
    return len(rows) / (time.perf_counter() - started)


def server_rate(client: httpx.Client, url: str, texts: list[str], name: str, parts: int) -> float:
    """Embeddings/s of `texts` sent as `parts` concurrent requests."""
    size = -(-len(texts) // parts)
    chunks = [texts[i : i + size] for i in range(0, len(texts), size)]

    def one(chunk: list[str]) -> int:
        body = {"model": name, "input": chunk, "encoding_format": "float"}
        answer = client.post(f"{url}/v1/embeddings", json=body)
        answer.raise_for_status()
        return len(answer.json()["data"])

    started = time.perf_counter()
    with ThreadPoolExecutor(parts) as pool:
        done = sum(pool.map(one, chunks))
    return done / (time.perf_counter() - started)


def gaps_beside(url: str, texts: list[str], name: str) -> tuple[float, float, float, int]:
    """(median gap before, worst and 99th-percentile gap while embeddings ran, requests)."""
    started, ended = threading.Event(), threading.Event()
    window: list[float] = []
    sent = [0]

    def on_token(n: int) -> bool:
        if n == GAP_TOKENS_BEFORE:
            started.set()
        return False

    def embedding_load() -> None:
        started.wait()
        window.append(time.perf_counter())
        with httpx.Client(timeout=600) as client:
            while not ended.is_set():
                body = {"model": name, "input": texts, "encoding_format": "float"}
                client.post(f"{url}/v1/embeddings", json=body).raise_for_status()
                sent[0] += 1
        window.append(time.perf_counter())

    helper = threading.Thread(target=embedding_load)
    helper.start()
    try:
        result = stream(url, PROMPT, STREAM_TOKENS, on_token, {"num_draft_tokens": 0})
    finally:
        ended.set()
        started.set()
        helper.join()
    pairs = list(zip(result.stamps, result.stamps[1:]))
    before = [b - a for a, b in pairs if b < window[0]]
    during = sorted(b - a for a, b in pairs if a >= window[0])
    p99 = during[min(len(during) - 1, int(0.99 * len(during)))]
    return statistics.median(before), during[-1], p99, sent[0]


def main() -> int:
    args = parse_args()
    reexec_for_cpu()
    sys.path.insert(0, str(REPO_ROOT / "scripts"))
    from fetch_embedding_model import fetch

    folder = Path(args.embedding_model) if args.embedding_model else fetch()
    name = folder.name
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    from mlxserve.embedding.model import embedding_architecture, embedding_model, load_network
    from mlxserve.platform import current_policy

    tokenizer = load_tokenizer(folder)._tokenizer
    texts = pieces(tokenizer, args.inputs, args.tokens)
    rows = [tokenizer.encode(t, truncation=True, max_length=256) for t in texts]
    network, config = load_network(folder, embedding_architecture(folder))
    current_policy().prepare_model(network)
    model = embedding_model(folder, network, config)
    rows_table: list[tuple[str, str]] = []
    ratios: dict[str, list[float]] = {}
    flags = ["--embedding-model", str(folder)]
    try:
        with (
            served(lambda port, log: start_server(default_model(), port, log, flags), "embed") as s,
            httpx.Client(timeout=600) as client,
        ):
            server_rate(client, s.url, texts[:BATCH], name, 1)  # warm: shapes, the tokenizer
            in_process_rate(model, rows[:BATCH])
            for run in range(args.runs):
                sides = {}
                order = ["in-process", "server", "server x8"]
                for side in order if run % 2 == 0 else order[::-1]:
                    if side == "in-process":
                        sides[side] = in_process_rate(model, rows)
                    else:
                        parts = CONCURRENT if side == "server x8" else 1
                        sides[side] = server_rate(client, s.url, texts, name, parts)
                for side in ("server", "server x8"):
                    ratios.setdefault(side, []).append(sides[side] / sides["in-process"])
                rows_table.append(
                    (
                        f"run {run + 1}: embeddings/s in-process, server, server x{CONCURRENT}",
                        f"{sides['in-process']:.0f}, {sides['server']:.0f} "
                        f"({ratios['server'][-1]:.2f}x), {sides['server x8']:.0f} "
                        f"({ratios['server x8'][-1]:.2f}x)",
                    )
                )
                median, worst, p99, sent = gaps_beside(s.url, texts, name)
                rows_table.append(
                    (
                        f"run {run + 1}: stream gap before, worst / p99 beside ({sent} requests)",
                        f"{median * 1000:.0f} ms; {worst * 1000:.0f} / {p99 * 1000:.0f} ms = "
                        f"{worst / median:.2f}x / {p99 / median:.2f}x (bound {GAP_BOUND:g}x)",
                    )
                )
                print_table(rows_table[-2:])
                sys.stdout.flush()
    except ROW_ERRORS as error:
        row_failed("mlxserve", error)
        return 1
    print()
    print_table(rows_table)
    print_median_ratios(ratios)
    return 0


if __name__ == "__main__":
    sys.exit(main())
