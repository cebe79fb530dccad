"""Speculative decoding through the server: one mlxserve, each workload asked with drafts (the
default) and without (`num_draft_tokens: 0`, the same server), side by side in one run, and
mlx_lm.server beside them (the edit, and 16 streams). Drafts come from prompt lookup, or with
`--draft-layers N` from a draft model, the model cut to its first N layers
(scripts/make_draft_model.py; `--draft-fit`: with a head fitted to the model's last layer),
which mlx_lm.server gets too (`--draft-model`; it then runs one request at a time, and a prompt
it has cached comes back empty, so each of its requests is made unique; `--mlx-lm-tokens`
keeps its answers short).

Workloads, greedy, streamed through `POST /v1/chat/completions` on the model's chat template:

- `edit`: a real source file (followers.py) asked back whole with one rename (much of the answer
  repeats it);
- `fill`: the same file with a method's body cut out, asked back whole with it filled in;
- `chat`: a question whose answer has nothing to look up;
- `json`: a record asked for under a JSON schema of long required keys (`response_format`), whose
  keys and punctuation the grammar forces: drafted from the grammar even where the lookup finds
  nothing;
- `c16`: sixteen streams at once, a mixed workload (edits, chats, sampled chats), tokens/s of
  the whole batch; each side twice in a run (A B B A; `--c16-rounds N`: that N times), its
  rates' mean, after a batch not counted.

Per single stream: decode tokens/s (usage's tokens - 1 over first content chunk to last), the
ratio with drafts over without, whether the texts are identical, and how much of the output
repeats the prompt (16-token windows found in it: a 135M model copies imperfectly, and a loop
would repeat itself, not the prompt). /metrics gives drafted and accepted tokens. Each run
alternates which side goes first.

    python benchmarks/speculation.py [--model PATH | --family NAME] [--max-tokens 200] [--runs 3]
                                     [--skip-mlx-lm] [--skip-c16 | --only-c16]
                                     [--c16-rounds N]
                                     [--draft-layers N [--draft-fit]]
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from common import (
    REPO_ROOT,
    ROW_ERRORS,
    ServerFailed,
    add_family_flag,
    bench_parser,
    chosen_model,
    print_median_ratios,
    print_table,
    reexec_for_cpu,
    row_failed,
    served,
    sse_chunks,
    start_mlx_lm_server,
    start_server,
)

# A small real file SmolLM2-135M copies back mostly as it is (longer ones, it drifts into loops)
SOURCE = REPO_ROOT / "mlxserve" / "engine" / "sequences" / "followers.py"
CHAT_QUESTION = "Why is the sky blue? Answer in a few sentences."
WINDOW = 16  # an output window found verbatim in the prompt counts as repeated
C16_STREAMS = 16
MODEL_NAME = "default"  # the model's path for mlx_lm.server, which loads what `model` names


class SkippedRow(Exception):
    """--skip-mlxserve: mlxserve's rows are not run."""


def parse_args() -> argparse.Namespace:
    parser = bench_parser("Prompt-lookup speculative decoding: with drafts against without")
    add_family_flag(parser)
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--skip-mlx-lm", action="store_true")
    parser.add_argument("--skip-c16", action="store_true")
    parser.add_argument(
        "--only-c16", action="store_true", help="the batch of 16 alone (no single streams)"
    )
    parser.add_argument(
        "--c16-rounds", type=int, default=1, help="A B B A rounds of the batch of 16 a run"
    )
    parser.add_argument("--skip-mlxserve", action="store_true", help="mlx_lm.server's rows alone")
    parser.add_argument(
        "--mlx-lm-tokens", type=int, help="mlx_lm.server's answers' length (default: --max-tokens)"
    )
    parser.add_argument(
        "--draft-layers",
        type=int,
        help="draft with the model's first N layers (a draft model) in place of prompt lookup",
    )
    parser.add_argument(
        "--draft-fit", action="store_true", help="the draft model's head fitted (--fit-head)"
    )
    return parser.parse_args()


def draft_model(model: str, layers: int, fit: bool) -> str:
    """The model cut to its first `layers` layers (with a fitted head), built once into build/."""
    sys.path.insert(0, str(REPO_ROOT / "scripts"))
    from make_draft_model import truncate

    name = f"{Path(model).name}-{layers}-layers" + ("-fitted" if fit else "")
    out = REPO_ROOT / "build" / "drafts" / name
    if not (out / "model.safetensors").exists():
        truncate(Path(model), out, layers, fit)
    return str(out)


# The json workload's schema: its keys, in order, are forced token by token
RECORD_KEYS = (
    "name_of_the_programming_language",
    "year_the_language_first_appeared",
    "main_paradigm_of_the_language",
    "most_widely_used_implementation",
    "one_sentence_summary_for_beginners",
)
WORKLOAD_FIELDS = {
    "json": {
        "response_format": {
            "type": "json_schema",
            "json_schema": {
                "name": "record",
                "schema": {
                    "type": "object",
                    "properties": {key: {"type": "string"} for key in RECORD_KEYS},
                    "required": list(RECORD_KEYS),
                    "additionalProperties": False,
                },
            },
        }
    }
}


def prompts() -> dict[str, str]:
    source = SOURCE.read_text()
    body = re.search(r"(    def release\(.*?\n.*?\n)(.*?)(\n\n)", source, re.S)
    holed = source.replace(body.group(2), "        ...")
    return {
        "edit": "Rewrite this Python file with the class Follower renamed to Waiter. "
        f"Output the whole file and nothing else.\n\n```python\n{source}```",
        "fill": "This Python file has the body of `release` missing. Output the whole file "
        f"with it written, and nothing else.\n\n```python\n{holed}```",
        "chat": CHAT_QUESTION,
        "json": "Describe the Python programming language as a JSON record.",
    }


def stream_chat(
    client: httpx.Client, url: str, text: str, max_tokens: int, short_ok=False, **extra
):
    """(decode tokens/s, tokens, text) of one greedy streamed chat answer. `short_ok`: an
    answer of under two chunks has no rate (0), only its tokens (16 streams' throughput)."""
    body = {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **extra,
    }
    stamps, pieces, tokens = [], [], None
    with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        for chunk in sse_chunks(response, url):
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            for choice in chunk.get("choices", []):
                content = (choice.get("delta") or {}).get("content")
                if content:
                    stamps.append(time.perf_counter())
                    pieces.append(content)
    if tokens is not None and len(stamps) < 2 and short_ok:
        return 0.0, tokens, "".join(pieces)
    if tokens is None or len(stamps) < 2:
        raise ServerFailed(f"{url}: no usage, or under two content chunks")
    return (tokens - 1) / (stamps[-1] - stamps[0]), tokens, "".join(pieces)


def repeated_share(tokenizer, prompt: str, answer: str) -> float:
    """The share of the answer's tokens inside a WINDOW-token run found in the prompt."""
    ids = tokenizer.encode(answer)
    haystack = " ".join(map(str, tokenizer.encode(prompt)))
    covered = set()
    for start in range(0, max(0, len(ids) - WINDOW + 1)):
        if " ".join(map(str, ids[start : start + WINDOW])) in haystack:
            covered.update(range(start, start + WINDOW))
    return len(covered) / max(1, len(ids))


def drafted_counts(client: httpx.Client, url: str) -> tuple[float, float]:
    text = client.get(f"{url}/metrics").text

    def total(name: str) -> float:
        found = re.findall(rf"^mlxserve_{name}_total{{[^}}]*}} (\S+)$", text, re.M)
        return sum(map(float, found))

    return total("draft_tokens"), total("draft_tokens_accepted")


def c16_rate(
    client: httpx.Client,
    url: str,
    texts: dict[str, str],
    max_tokens: int,
    unique: bool = False,
    **extra,
):
    """Tokens/s of the whole batch: 16 streams at once (edits, chats, sampled chats).
    `unique`: each stream's prompt is made its own (mlx_lm.server with a draft model)."""
    mix = [
        (texts["edit"], {}),
        (texts["chat"], {}),
        (texts["fill"], {}),
        (texts["chat"], {"temperature": 0.8, "seed": 7}),
    ]
    jobs = [mix[i % len(mix)] for i in range(C16_STREAMS)]
    if unique:
        jobs = [(f"({i}) {text}", sampling) for i, (text, sampling) in enumerate(jobs)]

    def one(job):
        text, sampling = job
        body = {**extra, **sampling}
        return stream_chat(client, url, text, max_tokens, short_ok=True, **body)[1]

    started = time.perf_counter()
    with ThreadPoolExecutor(C16_STREAMS) as pool:
        tokens = sum(pool.map(one, jobs))
    return tokens / (time.perf_counter() - started)


def main() -> int:
    args = parse_args()
    reexec_for_cpu()
    model = chosen_model(args)
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    tokenizer = load_tokenizer(Path(model))
    texts = prompts()
    names = ("edit", "fill", "chat", "json")
    draft_flags: list[str] = []
    if args.draft_layers:
        draft_flags = ["--draft-model", draft_model(model, args.draft_layers, args.draft_fit)]
        names = ("edit", "chat", "json")
    if args.only_c16:
        names = ()
    off = {"num_draft_tokens": 0}
    ratios: dict[str, list[float]] = {}
    rows: list[tuple[str, str]] = []
    limits = httpx.Timeout(600.0)
    try:
        if args.skip_mlxserve:
            raise SkippedRow
        with (
            served(lambda port, log: start_server(model, port, log, draft_flags), "spec") as server,
            httpx.Client(timeout=limits) as client,
        ):
            url = f"http://127.0.0.1:{server.port}"
            # warm: prompts in the prefix cache, the schema compiled
            for name in names or ("edit", "fill", "chat"):
                stream_chat(client, url, texts[name], 8, **WORKLOAD_FIELDS.get(name, {}))
            if not args.skip_c16:  # and a batch of 16's shapes
                c16_rate(client, url, texts, 16, **off)
            for run in range(args.runs):
                # which side goes first: swapped each run
                ab = (("on", {}), ("off", off)) if run % 2 == 0 else (("off", off), ("on", {}))
                for name in names:
                    before = drafted_counts(client, url)
                    sides = {}
                    for side, extra in ab:
                        fields = {**WORKLOAD_FIELDS.get(name, {}), **extra}
                        sides[side] = stream_chat(
                            client, url, texts[name], args.max_tokens, **fields
                        )
                    drafted, kept = (a - b for a, b in zip(drafted_counts(client, url), before))
                    ratio = sides["on"][0] / sides["off"][0]
                    ratios.setdefault(name, []).append(ratio)
                    rows.append(
                        (
                            f"run {run + 1} {name}: tok/s with drafts, without",
                            f"{sides['on'][0]:.1f}, {sides['off'][0]:.1f} = {ratio:.2f}x; "
                            f"{sides['on'][1]} tokens; identical text: "
                            f"{sides['on'][2] == sides['off'][2]}; drafted {drafted:.0f}, kept "
                            f"{kept:.0f}; repeats prompt "
                            f"{repeated_share(tokenizer, texts[name], sides['on'][2]):.0%}"
                            + (f"; starts {sides['on'][2][:60]!r}" if run == 0 else ""),
                        )
                    )
                if not args.skip_c16:
                    # each side twice, A B B A: a batch of 16 measured first in a run was the
                    # slower one whichever side it was (a warm-up), which alternating runs
                    # only moved from one side's ratio to the other's
                    # and before them a batch not counted: the first batch of 16 after the
                    # single streams ran slower whichever side it was
                    c16_rate(client, url, texts, args.max_tokens // 2, **ab[0][1])
                    rates: dict[str, list[float]] = {"on": [], "off": []}
                    before = drafted_counts(client, url)
                    for side, extra in (*ab, *ab[::-1]) * args.c16_rounds:
                        rates[side].append(
                            c16_rate(client, url, texts, args.max_tokens // 2, **extra)
                        )
                    drafted, kept = (a - b for a, b in zip(drafted_counts(client, url), before))
                    sides = {side: sum(each) / len(each) for side, each in rates.items()}
                    ratio = sides["on"] / sides["off"]
                    ratios.setdefault("c16", []).append(ratio)
                    each = {side: " / ".join(f"{r:.1f}" for r in rates[side]) for side in rates}
                    rows.append(
                        (
                            f"run {run + 1} c16: tok/s with drafts, without",
                            f"{sides['on']:.1f}, {sides['off']:.1f} = {ratio:.2f}x (with: "
                            f"{each['on']}; without: {each['off']}; drafted {drafted:.0f}, "
                            f"kept {kept:.0f})",
                        )
                    )
                print_table(rows[-len(names) - 1 :])
                sys.stdout.flush()
    except SkippedRow:
        pass
    except ROW_ERRORS as error:
        row_failed("mlxserve", error)
        return 1
    if not args.skip_mlx_lm:
        try:
            with (
                served(
                    lambda port, log: start_mlx_lm_server(model, port, log, draft_flags), "mlx_lm"
                ) as ref,
                httpx.Client(timeout=limits) as client,
            ):
                url = f"http://127.0.0.1:{ref.port}"
                global MODEL_NAME
                MODEL_NAME = model
                tokens = args.mlx_lm_tokens or args.max_tokens
                if draft_flags:
                    # mlx_lm.server 0.32 with a draft model answers a prompt it has cached with
                    # an empty text (one token, "stop"): each request's prompt is its own
                    edits = [f"({i}) {texts['edit']}" for i in range(2)]
                else:
                    stream_chat(client, url, texts["edit"], 8)
                    edits = [texts["edit"]] * 2
                rates = [stream_chat(client, url, edit, tokens)[0] for edit in edits]
                label = "mlx_lm.server" + (" --draft-model" if draft_flags else "")
                rows.append((f"{label} edit tok/s (2 runs)", ", ".join(f"{r:.1f}" for r in rates)))
                if not args.skip_c16:
                    rate = c16_rate(client, url, texts, tokens, unique=bool(draft_flags))
                    rows.append((f"{label} c16 tok/s, {tokens} tokens a stream", f"{rate:.1f}"))
        except ROW_ERRORS as error:
            row_failed("mlx_lm.server", error)
    print()
    print_table(rows)
    print_median_ratios(ratios)
    return 0


if __name__ == "__main__":
    sys.exit(main())
