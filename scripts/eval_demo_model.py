"""Evaluate the demo code model on held-out standard-library files (never seen in training).

Reports:
- validation loss, nats/token, over fixed 512-token windows of the held-out files;
- single-line infill: 200 tasks, each a line removed from inside a held-out function, the model
  given prefix and suffix with StarCoder's FIM tokens, in the order /infill uses for it (SPM
  where its config.json names "starcoder-spm"; --fim-template names another) and cut as /infill
  cuts them (--prompt-tokens: llama.cpp's batch of 2,048, the prefix's last 3/4 of it, the
  suffix's first 1/4 less two) and asked for the middle (greedy, up to the first newline). Exact
  match (trailing spaces ignored) and parse rate (the file with the completion in place still
  passes `ast.parse`; an empty completion never counts);
- how many completions were empty, and how many non-empty ones sat at the removed line's depth;
- the same for a bigram baseline (most likely next token given the previous one,
  counted on the training split), which sees only the prefix;
- with --reference, the same for any mlx-lm model without FIM tokens (a pretrained one, to see
  where the bars sit), which also sees only the prefix;
- with --chat, how many of a few plain questions the model still answers in its chat template
  (the base's skill that fine-tuning on code wears away).

--held-out packages draws the tasks and the loss from demo_corpus.py's held-out files instead: the
set a blend or a run is chosen on, so the card's standard-library tasks stay a test.

    python scripts/eval_demo_model.py [--model mlxserve/models/mlxserve-demo-coder] [--tasks 200]
        [--reference ../shared/models/smollm2-135m-instruct-4bit] [--prompt-tokens 1024]
"""

from __future__ import annotations

import argparse
import ast
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mlxserve.fim import INFILL_BATCH_TOKENS, detect_fim, fim_prompt, model_fim
from mlxserve.platform import reexec_for_cpu

sys.path.insert(0, str(Path(__file__).resolve().parent))
from demo_data import (
    FILE_SEP,
    corpus_files,
    functions,
    split,
    split_files,
    token_stream,
)

REPO = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = REPO / "mlxserve" / "models" / "mlxserve-demo-coder"
MAX_NEW_TOKENS = 48
PROMPT_TOKENS = INFILL_BATCH_TOKENS  # an infill prompt's budget: prefix and suffix
LOSS_WINDOW = 512  # tokens per held-out window of the validation loss
# Plain questions SmolLM2-135M-Instruct answers in its chat template, and a word each right
# answer holds (any one of them, case ignored).
CHAT_PROBES = (
    ("What is the capital of France?", ("paris",)),
    ("What is the largest planet in our solar system?", ("jupiter",)),
    ("Who wrote Romeo and Juliet?", ("shakespeare",)),
    ("What color is the sky on a clear day?", ("blue",)),
    ("How many days are there in a week?", ("seven", "7")),
    ("What is the boiling point of water in degrees Celsius?", ("100",)),
    ("What gas do plants absorb from the air?", ("carbon dioxide", "co2")),
    ("What is the opposite of hot?", ("cold",)),
)


@dataclass(frozen=True)
class InfillTask:
    file: str
    before: str  # the file up to the removed line
    line: str  # the removed line, without its newline
    after: str  # the file from the line after


def infill_tasks(files, count: int, seed: int) -> list[InfillTask]:
    """Lines strictly inside held-out function bodies, chosen at random (seeded)."""
    candidates = []
    for f, lines, node in functions(files):
        for lineno in range(node.body[0].lineno, node.end_lineno + 1):
            text = lines[lineno - 1]
            if text.strip() and not text.strip().startswith("#"):
                candidates.append((f, lineno))
    rng = random.Random(seed)
    rng.shuffle(candidates)
    tasks, seen = [], set()
    for f, lineno in candidates:
        if (f.name, lineno) in seen:
            continue
        seen.add((f.name, lineno))
        lines = f.text.split("\n")
        tasks.append(
            InfillTask(
                f.name,
                "\n".join(lines[: lineno - 1]) + "\n",
                lines[lineno - 1],
                "\n" + "\n".join(lines[lineno:]),
            )
        )
        if len(tasks) == count:
            break
    return tasks


def parses(task: InfillTask, line: str) -> bool:
    try:
        ast.parse(task.before + line + task.after)
        return True
    except (SyntaxError, ValueError):
        return False


def first_line(text: str) -> str:
    return text.split("\n", 1)[0]


def load_for_eval(path: Path):
    """(model, tokenizer) as the server runs them (the platform policy's `prepare_model`)."""
    import mlx_lm

    from mlxserve.platform import current_policy

    model, tokenizer = mlx_lm.load(str(path))
    current_policy().prepare_model(model)
    return model, tokenizer


def greedy_text(model, tokenizer, ids: list[int], newlines: int) -> str:
    """Greedy text from `ids` until it holds `newlines` newlines, ends, or reaches
    MAX_NEW_TOKENS."""
    from mlx_lm.generate import stream_generate

    from mlxserve.text import IncrementalDetokenizer

    # Decoded in the prompt's context as the server does: mlx-lm's streaming detokenizer drops
    # a leading space from the first token, which would take one from every indentation.
    detokenizer = IncrementalDetokenizer(tokenizer, ids)
    text = ""
    for response in stream_generate(model, tokenizer, ids, max_tokens=MAX_NEW_TOKENS):
        text += detokenizer.add(response.token)
        if text.count("\n") >= newlines or response.finish_reason:
            break
    return text + detokenizer.flush()


def infill_budget(prompt_tokens: int) -> tuple[int, int]:
    """(prefix, suffix) tokens /infill keeps of a batch (mlxserve.fim.build_infill): the
    prefix's last 3/4, the suffix's first 1/4 less two."""
    return 3 * (prompt_tokens // 4), prompt_tokens // 4 - 2


class ModelInfiller:
    def __init__(self, path: Path, prompt_tokens: int = PROMPT_TOKENS, template: str | None = None):
        import mlx.core as mx

        self.mx = mx
        self.model, self.tokenizer = load_for_eval(path)
        self.tokenizer._tokenizer.model_max_length = 10**9  # whole files are encoded here
        self.config = json.loads((path / "config.json").read_text())
        # the order /infill uses for this model: PSM, or SPM where its config.json says so
        vocab = self.tokenizer.get_vocab()
        self.fim = detect_fim(vocab, template) if template else model_fim(vocab, self.config)
        self.budget = infill_budget(prompt_tokens)
        self.newline = set(self.tokenizer.encode("\n", add_special_tokens=False))

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def encode_many(self, texts: list[str]) -> list[list[int]]:
        """Many texts at once: the fast tokenizer spreads them over the cores."""
        return self.tokenizer._tokenizer(texts, add_special_tokens=False)["input_ids"]

    def prompt(self, task: InfillTask) -> list[int]:
        before, after = self.encode(task.before), self.encode(task.after)
        keep_before, keep_after = self.budget
        return fim_prompt(self.fim, before[max(0, len(before) - keep_before) :], after[:keep_after])

    def chat(self) -> dict:
        """How many CHAT_PROBES the model answers right (greedy, 48 tokens at most)."""
        answers, right = [], 0
        for question, words in CHAT_PROBES:
            ids = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": question}], add_generation_prompt=True
            )
            answer = greedy_text(self.model, self.tokenizer, list(ids), newlines=3).strip()
            right += any(w in answer.lower() for w in words)
            answers.append(answer)
        return {"asked": len(CHAT_PROBES), "right": right, "answers": answers}

    def complete(self, task: InfillTask) -> str:
        return first_line(greedy_text(self.model, self.tokenizer, self.prompt(task), newlines=1))

    def validation_loss(self, stream: np.ndarray, windows: int) -> float:
        import mlx.nn as nn

        context = min(self.config["max_position_embeddings"], LOSS_WINDOW)
        mx = self.mx
        starts = np.linspace(0, len(stream) - context - 2, windows).astype(int)
        total = 0.0
        for chunk in np.array_split(starts, max(1, windows // 8)):
            batch = mx.array(np.stack([stream[s : s + context + 1] for s in chunk]))
            loss = nn.losses.cross_entropy(self.model(batch[:, :-1]), batch[:, 1:], reduction="sum")
            total += loss.item()
        return total / (windows * context)


def bigram_successors(stream: np.ndarray) -> dict[int, int]:
    """Each token's most frequent next token in `stream` (sparse: a vocabulary of 49k squared
    does not fit in memory)."""
    pairs = stream[:-1].astype(np.int64) << 32 | stream[1:].astype(np.int64)
    codes, counts = np.unique(pairs, return_counts=True)
    order = np.lexsort((-counts, codes >> 32))  # by first token, most frequent pair first
    firsts = codes[order] >> 32
    keep = np.ones(len(order), dtype=bool)
    keep[1:] = firsts[1:] != firsts[:-1]
    best = codes[order][keep]
    return dict(zip((best >> 32).tolist(), (best & 0xFFFFFFFF).tolist()))


class BigramInfiller:
    """The baseline: greedy next token from bigram counts of the training split; prefix only."""

    def __init__(self, stream: np.ndarray, infiller: ModelInfiller):
        self.next_token = bigram_successors(stream)
        self.infiller = infiller

    def complete(self, task: InfillTask) -> str:
        tokenizer = self.infiller.tokenizer
        context = self.infiller.encode(task.before)
        generated: list[int] = []
        token = context[-1]
        for _ in range(MAX_NEW_TOKENS):
            token = self.next_token.get(token, token)
            generated.append(token)
            if token in self.infiller.newline:
                break
        return first_line(tokenizer.decode(generated, skip_special_tokens=True))


class PrefixInfiller:
    """A model with no FIM tokens, given the prefix only, without its last newline: the model
    writes that newline and the next line's indentation itself. Byte-level BPE tokenizers merge a
    newline with the indentation after it, so a prompt ending in a bare newline is one such a
    model rarely saw (SmolLM2-135M then wrote 110 empty lines of 200 and no exact match)."""

    def __init__(self, path: Path, prompt_tokens: int = PROMPT_TOKENS):
        self.model, self.tokenizer = load_for_eval(path)
        self.context = infill_budget(prompt_tokens)[0]  # as many prefix tokens as a FIM prompt

    def complete(self, task: InfillTask) -> str:
        ids = self.tokenizer.encode(task.before[:-1], add_special_tokens=False)
        text = greedy_text(self.model, self.tokenizer, ids[-self.context :], newlines=2)
        # the line after the prefix's last one (none if the model never ended that one)
        return text.split("\n")[1] if "\n" in text else ""


def indentation(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def score(name: str, infiller, tasks: list[InfillTask]) -> dict:
    exact = parsed = empty = indented = 0
    start = time.monotonic()
    for n, task in enumerate(tasks, 1):
        line = infiller.complete(task)
        if n % 50 == 0:
            print(f"{name}: {n}/{len(tasks)} tasks", file=sys.stderr, flush=True)
        exact += line.rstrip() == task.line.rstrip()
        # An empty answer leaves a parseable file more often than not: a failure all the same
        # (the removed lines are never blank).
        parsed += bool(line.strip()) and parses(task, line)
        empty += not line.strip()
        indented += bool(line.strip()) and indentation(line) == indentation(task.line)
    return {
        "name": name,
        "exact_match": exact / len(tasks),
        "parse_rate": parsed / len(tasks),
        "empty_lines": empty,  # of the tasks: nothing written
        "right_indentation": indented,  # of the tasks: a line at the removed line's depth
        "seconds": round(time.monotonic() - start, 1),
    }


def main() -> None:
    reexec_for_cpu()  # MLX's CPU wheel on OpenBLAS (10-25x faster here), huge pages
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--windows", type=int, default=400, help="held-out windows for the loss")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--prompt-tokens",
        type=int,
        default=PROMPT_TOKENS,
        help="the infill prompt's batch, cut as /infill cuts it (default: /infill's own)",
    )
    parser.add_argument("--fim-template", help="this order instead of the one the model names")
    parser.add_argument(
        "--held-out",
        choices=("stdlib", "packages"),
        default="stdlib",
        help="whose held-out files give the tasks and the loss (packages: demo_corpus.py's)",
    )
    parser.add_argument("--no-bigram", action="store_true", help="skip the bigram baseline")
    parser.add_argument("--chat", action="store_true", help="also ask CHAT_PROBES")
    parser.add_argument(
        "--reference", type=Path, help="also score this mlx-lm model, prefix only (no FIM)"
    )
    args = parser.parse_args()

    train_files, held_out = split_files() if args.held_out == "stdlib" else split(corpus_files())
    if not held_out:
        raise SystemExit("no held-out files: run scripts/demo_corpus.py first")
    infiller = ModelInfiller(args.model, args.prompt_tokens, args.fim_template)
    file_sep = infiller.tokenizer.convert_tokens_to_ids(FILE_SEP)
    held_stream = token_stream(held_out, infiller.encode, file_sep, infiller.encode_many)
    tasks = infill_tasks(held_out, args.tasks, args.seed)
    results = {
        "model": str(args.model),
        "held_out": args.held_out,
        "held_out_files": len(held_out),
        "held_out_tokens": int(len(held_stream)),
        "prompt_tokens": args.prompt_tokens,
        "fim_template": infiller.fim.name,
    }
    if args.windows:
        loss = infiller.validation_loss(held_stream, args.windows)
        results["validation_loss_nats_per_token"] = round(loss, 4)
    results["tasks"] = len(tasks)
    results["model_infill"] = score("model", infiller, tasks)
    if args.chat:
        results["chat"] = infiller.chat()
    if not args.no_bigram:
        train_stream = token_stream(train_files, infiller.encode, file_sep, infiller.encode_many)
        results["bigram_infill"] = score("bigram", BigramInfiller(train_stream, infiller), tasks)
    if args.reference:
        reference = score("reference", PrefixInfiller(args.reference, args.prompt_tokens), tasks)
        results["reference_infill"] = {"model": str(args.reference), **reference}
    print(json.dumps(results, indent=2), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
