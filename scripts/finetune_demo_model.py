"""Fine-tune SmolLM2-135M-Instruct into mlxserve's demo model: Python fill-in-the-middle that
still chats.

Deterministic (batch k is drawn from an RNG seeded by (seed, k)), resumable (checkpoints in
--out/checkpoint; rerunning continues from the last one, wall time counted across runs), with a
progress bar and a JSONL loss log.

1. The base model (--base: an mlx-lm folder, 4-bit weights widened to float32 for training) gets
   StarCoder's FIM tokens (<fim_prefix>, <fim_suffix>, <fim_middle>, <fim_pad>); <repo_name> and
   <file_sep> are in its vocabulary already. Their embedding rows start at the vocabulary's mean.
   --base may also be a model already fine-tuned here (the shipped one): training continues
   from its weights, which have the tokens.
2. Full fine-tuning with AdamW on the training split of the interpreter's standard library
   and of demo_corpus.py's packages where that folder exists (--stdlib-share of the samples from
   the library; held-out files chosen by a hash of their path, as eval_demo_model.py reads them):
   - FIM samples, in PSM order (prefix, suffix, middle) up to --spm-from-step and in SPM order
     (suffix, prefix, middle: llama.cpp's --spm-infill layout) after it, except --psm-share of
     them, which stay PSM. In SPM the middle continues the prefix directly, so the base model's
     left-to-right skill applies from the first step; in PSM the prompt's start stays the same
     as the cursor moves down a file, so the server's prefix cache serves it. The export
     declares the order most samples ended in, and /infill renders its prompts that way. The
     middle is mostly one to three whole lines; some samples start with other files' chunks in
     the repo-level format llama.vim's ring buffer produces (<repo_name>, <file_sep>name). The
     middle and its <|endoftext|> weigh --middle-weight against 1 for the context tokens.
   - Left-to-right windows of the same files.
   - Chat turns in the model's own ChatML template, built from the library itself (a function
     shown, its docstring's first paragraph as the answer), with the loss on the answer only: the
     model keeps answering /v1/chat/completions.
3. Exported to --out/model in mlx-lm's layout (float16 weights; package_demo_model.py quantizes).

On Linux, MLX's CPU wheel links a reference BLAS; this script re-executes itself with Debian's
OpenBLAS preloaded when it is installed (apt-get install libopenblas0-pthread).

    python scripts/finetune_demo_model.py --out build/demo-ft [--steps 280] [--seed 0]
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import platform
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np

from mlxserve.fim import CONFIG_KEY, detect_fim, fim_prompt
from mlxserve.platform import flush_denormals, reexec_for_cpu

sys.path.insert(0, str(Path(__file__).resolve().parent))
from demo_data import (
    EOS,
    FILE_SEP,
    FIM_MIDDLE,
    FIM_PREFIX,
    FIM_SUFFIX,
    corpus_files,
    corpus_root,
    functions,
    split,
    split_files,
    stdlib_root,
    token_stream,
)

REPO = Path(__file__).resolve().parent.parent
DEFAULT_BASE = REPO.parent / "shared" / "models" / "smollm2-135m-instruct-4bit"
FIM_PAD = "<fim_pad>"
NEW_TOKENS = [FIM_PREFIX, FIM_MIDDLE, FIM_SUFFIX, FIM_PAD]
REPO_NAME = "<repo_name>"
ORDERS = {False: "starcoder", True: "starcoder-spm"}  # /infill's templates: PSM, SPM
CHARS_PER_TOKEN = 3.3  # SmolLM2's tokenizer on the standard library
LINE_SPAN_RATE = 0.85  # of FIM samples: the middle is whole lines (an editor's infill)
LINE_COUNTS, LINE_COUNT_P = [1, 2, 3], [0.75, 0.17, 0.08]
NEWLINE_IN_SUFFIX_RATE = 0.8  # the cursor's emptied line keeps its newline in the suffix
EXTRA_FILES = (1, 3)  # other files' chunks before a repo-level sample
CHUNK_LINES = 32  # llama.vim's ring-buffer chunk size (g:llama_config.ring_chunk_size)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, default=DEFAULT_BASE)
    parser.add_argument("--out", type=Path, default=REPO / "build" / "demo-ft")
    parser.add_argument("--seed", type=int, default=0)
    # ~24 s a step here (4 x 512 tokens, float32, OpenBLAS): 280 steps and the evaluations take
    # under two hours on 2 cores.
    parser.add_argument("--steps", type=int, default=280, help="the schedule's length")
    parser.add_argument(
        "--stop-after",
        type=int,
        default=190,
        help="end training here, the schedule unfinished: the shipped run's 120-minute budget",
    )
    parser.add_argument(
        "--stop-after-minutes",
        type=float,
        default=None,
        help="also end training once this much wall time has passed (a lent machine's limit)",
    )
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--fim-rate", type=float, default=0.75)
    parser.add_argument("--chat-rate", type=float, default=0.1)
    parser.add_argument("--repo-rate", type=float, default=0.3, help="of FIM samples")
    parser.add_argument("--middle-weight", type=float, default=4.0)
    parser.add_argument(
        "--spm-from-step",
        type=int,
        default=150,
        help="FIM samples from this step on are in SPM order (suffix first, the middle right "
        "after the prefix), as /infill renders them for the shipped model; PSM before it",
    )
    parser.add_argument(
        "--psm-share",
        type=float,
        default=0.0,
        help="of FIM samples from --spm-from-step on: this share stays in PSM order",
    )
    parser.add_argument(
        "--stdlib-share",
        type=float,
        default=None,
        help="of samples: from the standard library, the rest from demo_corpus.py's packages "
        "(default: in proportion to their sizes)",
    )
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument(
        "--export-only",
        action="store_true",
        help="export the last checkpoint to --out/model as it is, without training further",
    )
    return parser.parse_args()


# ---- model and tokenizer -------------------------------------------------------------------------


def base_model(base: Path, tok_dir: Path):
    """(model in float32 with the FIM tokens' rows, tokenizer with the tokens, config)."""
    import mlx.core as mx
    import mlx.nn as nn
    import mlx_lm
    from mlx_lm.utils import dequantize_model
    from tokenizers import AddedToken

    model, wrapper, config = mlx_lm.load(str(base), return_config=True)
    model = dequantize_model(model)
    model.set_dtype(mx.float32)
    tokenizer = wrapper._tokenizer
    missing = [t for t in NEW_TOKENS if t not in tokenizer.get_vocab()]
    tokenizer.add_tokens([AddedToken(t, special=True, normalized=False) for t in missing])
    tok_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(tok_dir))
    old = model.model.embed_tokens.weight
    rows = len(tokenizer) - old.shape[0]
    if rows > 0:
        embedding = nn.Embedding(len(tokenizer), old.shape[1])
        start = mx.broadcast_to(old.mean(axis=0), (rows, old.shape[1]))
        embedding.weight = mx.concatenate([old, start]).astype(mx.float32)
        model.model.embed_tokens = embedding
    config = {k: v for k, v in config.items() if k != "quantization"}
    config.pop("quantization_config", None)
    config["vocab_size"] = len(tokenizer)
    model.args.vocab_size = len(tokenizer)
    return model, tokenizer, config


# ---- samples -------------------------------------------------------------------------------------


def chat_examples(files) -> list[tuple[str, str]]:
    """(question, answer): each documented function of the files shown without its docstring,
    and the docstring's first paragraph."""
    examples = []
    for _, lines, node in functions(files):
        doc = ast.get_docstring(node)
        if not doc or node.end_lineno - node.lineno > 40:
            continue
        answer = " ".join(doc.split("\n\n")[0].split())
        if len(answer) < 40 or answer.startswith((">>>", ":")):
            continue
        first = node.body[0]
        code = "\n".join(
            lines[node.lineno - 1 : first.lineno - 1] + lines[first.end_lineno : node.end_lineno]
        )
        examples.append((f"What does this Python function do?\n\n```python\n{code}\n```", answer))
    return examples


class Sampler:
    """Training sequences of context + 1 tokens, each with a loss weight per token."""

    def __init__(
        self,
        tokenizer,
        files,
        stream: np.ndarray,
        args: argparse.Namespace,
        corpus: tuple[list, np.ndarray] | None = None,
    ):
        """`files` and `stream`: the standard library's; `corpus`: the packages' (files, stream),
        drawn from for 1 - --stdlib-share of the samples."""
        self.args, self.context = args, args.context
        self.tokenizer = tokenizer
        self.encode = partial(tokenizer.encode, add_special_tokens=False)
        sources = [(files, stream), *([corpus] if corpus and corpus[0] else [])]
        self.files = [f for group, _ in sources for f in group]
        sizes = [float(sum(len(f.text) for f in group)) for group, _ in sources]
        share = getattr(args, "stdlib_share", None)
        if len(sources) == 1 or share is None:
            shares = [size / sum(sizes) for size in sizes]
        else:
            shares = [share, 1 - share]
        self.weights = np.concatenate(
            [
                np.array([len(f.text) for f in group], dtype=np.float64) * s / size
                for (group, _), s, size in zip(sources, shares, sizes)
            ]
        )
        self.weights /= self.weights.sum()
        self.streams = [s for _, s in sources]
        self.stream_shares = np.array(shares) / sum(shares)
        self.stream = stream
        ids = tokenizer.convert_tokens_to_ids
        vocab = tokenizer.get_vocab()
        self.orders = {spm: detect_fim(vocab, name) for spm, name in ORDERS.items()}
        self.repo_name, self.file_sep, self.eos = ids(REPO_NAME), ids(FILE_SEP), ids(EOS)
        # the packages' docstrings too, from a hash-chosen share of their files (parsing all of
        # them would hold up the start of training)
        chat_sources = files + [f for f in (corpus[0] if corpus else []) if f.chat_source]
        self.chats = chat_examples(chat_sources)

    def batch(
        self, rng: np.random.Generator, size: int, spm: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        tokens, weights = zip(*(self.sample(rng, spm) for _ in range(size)))
        return np.stack(tokens), np.stack(weights)

    def sample(self, rng: np.random.Generator, spm: bool) -> tuple[np.ndarray, np.ndarray]:
        draw = rng.random()
        if draw < self.args.fim_rate:
            psm_share = getattr(self.args, "psm_share", 0.0)
            if spm and psm_share > 0 and rng.random() < psm_share:
                spm = False
            return self.fim(rng, spm)
        if draw < self.args.fim_rate + self.args.chat_rate:
            return self.chat(rng)
        return self.left_to_right(rng), np.ones(self.context + 1, dtype=np.float32)

    def left_to_right(self, rng: np.random.Generator) -> np.ndarray:
        stream = self.stream
        if len(self.streams) > 1:
            stream = self.streams[rng.choice(len(self.streams), p=self.stream_shares)]
        start = rng.integers(0, len(stream) - self.context - 1)
        return stream[start : start + self.context + 1]

    def packed(self, rng, tokens: list[int], weights: list[float]):
        """`tokens` filled up to context + 1 with left-to-right text (weight 1)."""
        room = self.context + 1 - len(tokens)
        if room > 0:
            tokens = tokens + list(self.left_to_right(rng)[:room])
            weights = weights + [1.0] * room
        n = self.context + 1
        return np.array(tokens[:n], dtype=np.int32), np.array(weights[:n], dtype=np.float32)

    def random_file(self, rng):
        return self.files[rng.choice(len(self.files), p=self.weights)]

    def fim(self, rng: np.random.Generator, spm: bool):
        extra: list[int] = []
        if rng.random() < self.args.repo_rate:
            extra = self.repo_context(rng)
        text = self.random_file(rng).text
        chars = int((self.context - len(extra)) * CHARS_PER_TOKEN)
        start = rng.integers(0, max(1, len(text) - chars))
        window = text[start : start + chars]
        lo, hi = middle_span(rng, window)
        pre, mid, suf = (
            self.encode(window[:lo]),
            self.encode(window[lo:hi]),
            self.encode(window[hi:]),
        )
        budget = self.context + 1 - len(extra) - 4 - len(mid)
        if budget < 0:
            mid, budget = mid[: max(1, self.context // 4)], 0
        keep_suffix = (
            min(len(suf), budget // 4) if len(pre) > 3 * budget // 4 else budget - len(pre)
        )
        keep_suffix = min(len(suf), max(keep_suffix, 0))
        keep_prefix = min(len(pre), max(0, budget - keep_suffix))
        kept = pre[len(pre) - keep_prefix :], suf[:keep_suffix]
        tokens = [*extra, *fim_prompt(self.orders[spm], *kept)]
        weights = [1.0] * len(tokens) + [self.args.middle_weight] * (len(mid) + 1)
        return self.packed(rng, tokens + mid + [self.eos], weights)

    def repo_context(self, rng: np.random.Generator) -> list[int]:
        """Other files' chunks as /infill renders llama.vim's ring buffer for a repo-level model."""
        ids = [self.repo_name, *self.encode("project\n")]
        for _ in range(rng.integers(EXTRA_FILES[0], EXTRA_FILES[1] + 1)):
            f = self.random_file(rng)
            lines = f.text.split("\n")
            first = rng.integers(0, max(1, len(lines) - CHUNK_LINES))
            chunk = "\n".join(lines[first : first + CHUNK_LINES]) + "\n"
            ids += [self.file_sep, *self.encode(f.name + "\n"), *self.encode(chunk)]
        ids = ids[: self.context // 2]
        return ids + [self.file_sep, *self.encode("filename\n")]

    def chat(self, rng: np.random.Generator):
        question, answer = self.chats[rng.integers(0, len(self.chats))]
        messages = [{"role": "user", "content": question}]
        text = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False
        )
        prompt = self.encode(text)
        reply = self.encode(answer + "<|im_end|>\n")
        prompt = prompt[-(self.context // 2) :]
        return self.packed(rng, prompt + reply, [0.0] * len(prompt) + [1.0] * len(reply))


def middle_span(rng: np.random.Generator, window: str) -> tuple[int, int]:
    """A middle that is never empty: line spans start on a whole, non-blank line."""
    starts = [i + 1 for i, c in enumerate(window) if c == "\n"]
    nonblank = [i for i, lo in enumerate(starts) if window[lo:].split("\n", 1)[0].strip()]
    if nonblank and rng.random() < LINE_SPAN_RATE:
        first = nonblank[rng.integers(0, len(nonblank))]
        last = min(len(starts), first + rng.choice(LINE_COUNTS, p=LINE_COUNT_P))
        lo = starts[first]
        hi = starts[last] if last < len(starts) else len(window)
        if window[hi - 1] == "\n" and rng.random() < NEWLINE_IN_SUFFIX_RATE:
            hi -= 1
        return lo, hi
    lo, hi = sorted(rng.integers(0, len(window), size=2))
    return int(lo), int(hi) + 1


# ---- training ------------------------------------------------------------------------------------


def evaluate(model, stream: np.ndarray, context: int, windows: int = 32) -> float:
    """Mean next-token loss (nats/token) over fixed held-out windows."""
    import mlx.core as mx
    import mlx.nn as nn

    starts = np.linspace(0, len(stream) - context - 2, windows).astype(int)
    total = 0.0
    for chunk in np.array_split(starts, max(1, windows // 4)):
        batch = mx.array(np.stack([stream[s : s + context + 1] for s in chunk]))
        loss = nn.losses.cross_entropy(model(batch[:, :-1]), batch[:, 1:], reduction="mean")
        total += loss.item() * len(chunk)
    return total / windows


def train(args: argparse.Namespace) -> None:
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim
    from mlx.utils import tree_flatten, tree_unflatten
    from tqdm import tqdm

    out: Path = args.out
    tok_dir, ckpt = out / "tokenizer", out / "checkpoint"
    started = time.monotonic()
    train_files, held_out = split_files()
    corpus_train, _ = split(corpus_files())
    print(
        f"{len(train_files)} training files, {len(held_out)} held out; "
        f"{len(corpus_train)} packages' files",
        flush=True,
    )
    mx.random.seed(args.seed)
    model, tokenizer, config = base_model(args.base, tok_dir)
    tokenizer.model_max_length = 10**9  # whole files are encoded here
    encode = partial(tokenizer.encode, add_special_tokens=False)
    file_sep = tokenizer.convert_tokens_to_ids(FILE_SEP)
    cache = out / "streams.npz"
    saved = np.load(cache) if cache.exists() else {}
    if "train" in saved and ("corpus" in saved or not corpus_train):
        # int32 as written here; a copy carried to another machine may be packed as uint16
        train_stream, held_stream = (saved[k].astype(np.int32) for k in ("train", "held"))
        corpus_stream = saved["corpus"].astype(np.int32) if corpus_train else None
    else:

        def encode_many(texts: list[str]) -> list[list[int]]:
            return tokenizer(texts, add_special_tokens=False)["input_ids"]

        train_stream = token_stream(train_files, encode, file_sep, encode_many)
        held_stream = token_stream(held_out, encode, file_sep, encode_many)
        corpus_stream = (
            token_stream(corpus_train, encode, file_sep, encode_many) if corpus_train else None
        )
        extra = {"corpus": corpus_stream} if corpus_train else {}
        np.savez(cache, train=train_stream, held=held_stream, **extra)
    corpus_tokens = 0 if corpus_stream is None else len(corpus_stream)
    print(
        f"{len(train_stream):,} training tokens, {len(held_stream):,} held out; "
        f"{corpus_tokens:,} from packages",
        flush=True,
    )
    corpus = (corpus_train, corpus_stream) if corpus_train else None
    sampler = Sampler(tokenizer, train_files, train_stream, args, corpus)
    print(f"{len(sampler.chats):,} chat examples", flush=True)

    schedule = optim.join_schedules(
        [
            optim.linear_schedule(1e-7, args.lr, args.warmup),
            optim.cosine_decay(args.lr, args.steps - args.warmup, args.lr * 0.1),
        ],
        [args.warmup],
    )
    optimizer = optim.AdamW(learning_rate=schedule, weight_decay=0.0)
    step = 0
    log_path = out / "loss_log.jsonl"
    base_val = None
    if (ckpt / "state.json").exists():
        saved_state = json.loads((ckpt / "state.json").read_text())
        step, base_val = saved_state["step"], saved_state.get("base_val_loss")
        started -= saved_state.get("elapsed_s", 0.0)
        model.load_weights(str(ckpt / "weights.safetensors"))
        optimizer.init(model.trainable_parameters())
        optimizer.state = tree_unflatten(list(mx.load(str(ckpt / "optimizer.safetensors")).items()))
        if log_path.exists():  # steps after the checkpoint run again: log them once
            kept = [
                ln for ln in log_path.read_text().splitlines() if json.loads(ln)["step"] <= step
            ]
            log_path.write_text("".join(line + "\n" for line in kept))
        print(f"resuming at step {step}", flush=True)
    else:
        if log_path.exists():
            log_path.unlink()
        base_val = round(evaluate(model, held_stream, args.context), 4)
        print(f"held-out loss before fine-tuning: {base_val}", flush=True)

    if mx.default_device() == mx.cpu:  # MLX's CPU exp is a scalar loop: a third of a step
        from cpu_training_ops import token_losses, use_in_llama

        use_in_llama()
    else:
        token_losses = partial(nn.losses.cross_entropy, reduction="none")

    def loss_fn(model, x, y, weights):
        return (token_losses(model(x), y) * weights).sum() / weights.sum()

    value_and_grad = nn.value_and_grad(model, loss_fn)
    state = [model.state, optimizer.state]

    @partial(mx.compile, inputs=state, outputs=state)
    def train_step(x, y, weights):
        loss, grads = value_and_grad(model, x, y, weights)
        grads, _ = optim.clip_grad_norm(grads, 1.0)
        optimizer.update(model, grads)
        return loss

    def save_checkpoint() -> None:
        ckpt.mkdir(parents=True, exist_ok=True)
        mx.save_safetensors(
            str(ckpt / "weights.tmp.safetensors"), dict(tree_flatten(model.parameters()))
        )
        mx.save_safetensors(
            str(ckpt / "optimizer.tmp.safetensors"), dict(tree_flatten(optimizer.state))
        )
        for name in ("weights", "optimizer"):  # a run killed mid-write keeps the last whole pair
            os.replace(ckpt / f"{name}.tmp.safetensors", ckpt / f"{name}.safetensors")
        state_json = {
            "step": step,
            "elapsed_s": time.monotonic() - started,
            "base_val_loss": base_val,
        }
        (ckpt / "state.json").write_text(json.dumps(state_json))

    tokens_per_step = args.batch * args.context
    last_step = step if args.export_only else min(args.steps, args.stop_after)
    progress = tqdm(total=last_step, initial=step, unit="step", dynamic_ncols=True)
    tic, running = time.monotonic(), None
    with log_path.open("a") as log:

        def draw(step: int):
            rng = np.random.default_rng([args.seed, step])
            return sampler.batch(rng, args.batch, spm=step >= args.spm_from_step)

        upcoming = draw(step)
        while step < last_step:
            batch, weights = (mx.array(a) for a in upcoming)
            loss = train_step(batch[:, :-1], batch[:, 1:], weights[:, 1:])
            mx.async_eval(state, loss)
            if step + 1 < last_step:  # build the next batch while this step computes
                upcoming = draw(step + 1)
            step += 1
            loss_value = loss.item()
            out_of_time = args.stop_after_minutes is not None and (
                time.monotonic() - started > 60 * args.stop_after_minutes
            )
            if out_of_time and step < last_step:
                print(f"\nstopped at step {step}: --stop-after-minutes", flush=True)
                last_step = step
            running = loss_value if running is None else 0.95 * running + 0.05 * loss_value
            record = {
                "step": step,
                "loss": round(loss_value, 4),
                "lr": float(schedule(step)),
                "elapsed_s": round(time.monotonic() - started, 1),
            }
            if step % args.eval_every == 0 or step == last_step:
                record["val_loss"] = round(evaluate(model, held_stream, args.context), 4)
            log.write(json.dumps(record) + "\n")
            log.flush()
            rate = tokens_per_step / (time.monotonic() - tic)
            tic = time.monotonic()
            progress.set_postfix(
                loss=f"{running:.3f}",
                tok_s=f"{rate:.0f}",
                **({"val": record["val_loss"]} if "val_loss" in record else {}),
            )
            progress.update(1)
            if step % args.checkpoint_every == 0:
                save_checkpoint()

    progress.close()
    save_checkpoint()
    summary = {
        "base": str(args.base),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "device": f"{mx.default_device()}: {mx.device_info().get('device_name', '?')}",
        "mlx": mx.__version__,
        "stdlib": str(stdlib_root()),
        "seed": args.seed,
        "steps": step,
        "planned_steps": args.steps,
        "batch": args.batch,
        "context": args.context,
        "tokens_seen": step * tokens_per_step,
        "learning_rate": args.lr,
        "warmup_steps": args.warmup,
        "schedule": "linear warm-up, then cosine decay to 10%; clip 1.0",
        "optimizer": "AdamW, no weight decay, full fine-tuning in float32",
        "fim_rate": args.fim_rate,
        "chat_rate": args.chat_rate,
        "repo_rate": args.repo_rate,
        "middle_loss_weight": args.middle_weight,
        "fim_order": fim_order(args, step),
        "psm_share": args.psm_share,
        "stdlib_share": round(float(sampler.stream_shares[0]), 3),
        "line_span_rate": LINE_SPAN_RATE,
        "train_files": len(train_files),
        "held_out_files": len(held_out),
        "train_tokens": int(len(train_stream)),
        "corpus": str(corpus_root()) if corpus_train else None,
        "corpus_files": len(corpus_train),
        "corpus_tokens": corpus_tokens,
        "held_out_tokens": int(len(held_stream)),
        "base_val_loss": base_val,
        "final_val_loss": json.loads(log_path.read_text().splitlines()[-1]).get("val_loss"),
        "minutes": round((time.monotonic() - started) / 60, 1),
    }
    if (args.base / "training.json").exists():  # a run continued from an earlier one
        summary["continued_from"] = json.loads((args.base / "training.json").read_text())
    # /infill renders prompts in the order most of the model's last samples were in
    config = {**config, CONFIG_KEY: ORDERS[args.spm_from_step < step and args.psm_share < 0.5]}
    export(out / "model", model, config, args.base, tok_dir, log_path, summary)


def fim_order(args: argparse.Namespace, step: int) -> str:
    if args.spm_from_step >= step:
        return "PSM"
    share = args.psm_share
    spm = "SPM" if share == 0 else f"{share:.0%} PSM, {1 - share:.0%} SPM"
    return spm if args.spm_from_step == 0 else f"PSM for steps 1-{args.spm_from_step}, {spm} after"


def export(target: Path, model, config: dict, base: Path, tok_dir: Path, log_path, summary) -> None:
    """float16 weights + config + tokenizer (with the FIM tokens) in mlx-lm's layout."""
    import shutil

    import mlx.core as mx
    from mlx.utils import tree_flatten

    target.mkdir(parents=True, exist_ok=True)
    weights = {k: v.astype(mx.float16) for k, v in tree_flatten(model.parameters())}
    mx.save_safetensors(str(target / "model.safetensors"), weights)
    (target / "config.json").write_text(json.dumps({**config, "torch_dtype": "float16"}, indent=2))
    for path in tok_dir.iterdir():
        shutil.copy(path, target / path.name)
    if (base / "generation_config.json").exists():
        shutil.copy(base / "generation_config.json", target / "generation_config.json")
    shutil.copy(log_path, target / "loss_log.jsonl")
    (target / "training.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"exported to {target} after {summary['minutes']} min", flush=True)


def main() -> None:
    reexec_for_cpu()  # MLX's CPU wheel on OpenBLAS, huge pages
    flush_denormals()
    train(parse_args())


if __name__ == "__main__":
    main()
