"""Replay llama.vim's /infill requests against a running server, as the plugin sends them when a
user types `return ` inside a function of a held-out standard-library file.

Each request is llama.vim's (autoload/llama.vim, default settings): the 256 lines before the
cursor's line as `input_prefix`, the rest of that line and the 64 lines after as `input_suffix`,
the line up to the cursor as `prompt`, `n_indent` from its indentation, its ring buffer (16
chunks of 64 lines from other files, as if they were open) as `input_extra`, and its sampler
settings; first the warm-up llama.vim sends when the ring buffer changes (`input_extra` alone,
`n_predict` 0). Reports how many suggestions are non-empty, and how many of those leave the file
parseable.

--cursor-moves N: after each position, the cursor moves down N lines, one at a time, and llama.vim
asks again at each line's indentation, as it does on every cursor move in insert mode. Reports the
share of each such prompt the server's prefix cache served (`tokens_cached` against the prompt's
tokens) and its prompt time: in PSM order the prompt's start is the same as the last one's; in SPM
the suffix, which comes first, has changed.

    python scripts/replay_llama_vim.py [--url http://127.0.0.1:8080] [--positions 50] [--json F]
        [--cursor-moves 3]
"""

from __future__ import annotations

import argparse
import ast
import json
import random
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from demo_data import split_files

N_PREFIX, N_SUFFIX, N_PREDICT = 256, 64, 128
RING_CHUNKS, RING_CHUNK_LINES = 16, 64
T_MAX_PROMPT_MS, T_MAX_PREDICT_MS = 500, 1000
TYPED = "return "
RESPONSE_FIELDS = [
    "content",
    "timings/prompt_n",
    "timings/prompt_ms",
    "timings/prompt_per_token_ms",
    "timings/prompt_per_second",
    "timings/predicted_n",
    "timings/predicted_ms",
    "timings/predicted_per_token_ms",
    "timings/predicted_per_second",
    "truncated",
    "tokens_cached",
]


def fim_request(
    prefix: str,
    prompt: str,
    suffix: str,
    extra: list[dict],
    indent: int,
    n_predict: int = N_PREDICT,
    t_max_predict_ms: int = T_MAX_PREDICT_MS,
) -> dict:
    """llama.vim's FIM request (llama#fim), field for field; n_predict and t_max_predict_ms
    are its settings."""
    return {
        "input_prefix": prefix,
        "input_suffix": suffix,
        "input_extra": extra,
        "prompt": prompt,
        "n_predict": n_predict,
        "n_indent": indent,
        "top_k": 40,
        "top_p": 0.90,
        "stream": False,
        "samplers": ["top_k", "top_p", "infill"],
        "cache_prompt": True,
        "t_max_prompt_ms": T_MAX_PROMPT_MS,
        "t_max_predict_ms": t_max_predict_ms,
        "response_fields": RESPONSE_FIELDS,
    }


def warmup_request(extra: list[dict]) -> dict:
    """llama.vim's ring-buffer update: only the other files' chunks, nothing to predict."""
    return {
        "input_prefix": "",
        "input_suffix": "",
        "input_extra": extra,
        "prompt": "",
        "n_predict": 0,
        "temperature": 0.0,
        "stream": False,
        "samplers": [],
        "cache_prompt": True,
        "t_max_prompt_ms": 1,
        "t_max_predict_ms": 1,
        "response_fields": [""],
    }


def positions(files, count: int, seed: int) -> list[tuple[str, list[str], int]]:
    """(file name, its lines, line index) of `return <something>` lines in function bodies."""
    found = []
    for f in files:
        lines = f.text.split("\n")
        for index, line in enumerate(lines):
            stripped = line.strip()
            if stripped.startswith(TYPED) and len(stripped) > len(TYPED):
                found.append((f.name, lines, index))
    random.Random(seed).shuffle(found)
    return found[:count]


def ring_chunks(files, rng: random.Random) -> list[dict]:
    chunks = []
    while len(chunks) < RING_CHUNKS:
        f = files[rng.randrange(len(files))]
        lines = f.text.split("\n")
        first = rng.randrange(max(1, len(lines) - RING_CHUNK_LINES))
        text = "\n".join(lines[first : first + RING_CHUNK_LINES]) + "\n"
        chunks.append({"text": text, "filename": f.name})
    return chunks


def request(
    lines: list[str], index: int, extra: list[dict], typed: str | None = None
) -> tuple[dict, str, str]:
    """llama.vim's body with the cursor after `return ` on line `index` (the rest of the line
    not yet typed), or after `typed`, that line's start; also the text before and after the
    cursor in the whole file."""
    line = lines[index]
    if typed is None:
        typed = line[: line.index(TYPED) + len(TYPED)]
    before = lines[max(0, index - N_PREFIX) : index]
    after = lines[index + 1 : index + 1 + N_SUFFIX]
    body = fim_request(
        "\n".join(before) + "\n",
        typed,
        "\n" + "\n".join(after) + "\n",
        extra,
        indent=len(typed) - len(typed.lstrip()),
    )
    whole_before = "\n".join(lines[:index]) + "\n" + typed
    whole_after = "\n" + "\n".join(lines[index + 1 :])
    return body, whole_before, whole_after


def cursor_move(answer: dict) -> dict:
    """Of a request after a cursor move: the prompt's tokens, those the cache served, and the
    time the rest took (llama.cpp's fields: `tokens_cached`, `timings.prompt_n` is what was
    read anew)."""
    read = (
        answer["timings/prompt_n"]
        if "timings/prompt_n" in answer
        else answer["timings"]["prompt_n"]
    )
    ms = (
        answer["timings/prompt_ms"]
        if "timings/prompt_ms" in answer
        else answer["timings"]["prompt_ms"]
    )
    cached = answer.get("tokens_cached", 0)
    return {"prompt": cached + read, "cached": cached, "prompt_ms": ms}


def parses(text: str) -> bool:
    try:
        ast.parse(text)
        return True
    except (SyntaxError, ValueError):
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--positions", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--cursor-moves", type=int, default=0, help="lines moved after each")
    args = parser.parse_args()

    _, held_out = split_files()
    rng = random.Random(args.seed)
    results, moves = [], []
    started = time.monotonic()
    ring = ring_chunks(held_out, rng)
    with httpx.Client(base_url=args.url, timeout=600) as http:
        http.post("/infill", json=warmup_request(ring)).raise_for_status()
        for name, lines, index in positions(held_out, args.positions, args.seed):
            body, before, after = request(lines, index, ring)
            answer = http.post("/infill", json=body)
            answer.raise_for_status()
            content = answer.json()["content"]
            # The suggestion as llama.vim shows it: up to the end of what it generated.
            results.append(
                {
                    "file": name,
                    "line": index + 1,
                    "content": content,
                    "non_empty": bool(content.strip()),
                    "parses": bool(content.strip()) and parses(before + content + after),
                }
            )
            print(f"{len(results)}: {name}:{index + 1} {content!r}", flush=True)
            for line in range(index + 1, min(len(lines), index + 1 + args.cursor_moves)):
                indent = lines[line][: len(lines[line]) - len(lines[line].lstrip())]
                body, _, _ = request(lines, line, ring, typed=indent)
                timings = http.post("/infill", json=body).raise_for_status().json()
                moves.append(cursor_move(timings))
    non_empty = sum(r["non_empty"] for r in results)
    parsed = sum(r["parses"] for r in results)
    summary = {
        "url": args.url,
        "positions": len(results),
        "non_empty": non_empty,
        "non_empty_share": round(non_empty / len(results), 3),
        "parseable_of_non_empty": round(parsed / max(1, non_empty), 3),
        "seconds": round(time.monotonic() - started, 1),
    }
    if moves:
        summary["cursor_moves"] = len(moves)
        summary["cached_share_after_a_move"] = round(
            sum(m["cached"] for m in moves) / sum(m["prompt"] for m in moves), 3
        )
        summary["prompt_ms_after_a_move_median"] = round(
            sorted(m["prompt_ms"] for m in moves)[len(moves) // 2], 1
        )
    print(json.dumps(summary, indent=2))
    if args.json:
        args.json.write_text(json.dumps({**summary, "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
