"""What prompt-lookup speculation can give one greedy stream on this machine, before the engine
does it: mlx-lm's model and KV cache driven directly, one sequence, side by side with the plain
greedy loop on the same prompt.

- plain: one forward pass a token (mlx-lm's loop, without its pipelining: both sides sync per
  pass, so the ratio is the passes' costs);
- lookup: each pass feeds the last token and up to `--draft` tokens drafted by
  `mlxserve.speculation.ngram` from the sequence's own prompt and output; the drafts the model's
  argmax agrees with are kept, the KV cache is trimmed past them, and the model's own next
  token follows. The output must equal plain's, token for token.

Workloads, each on the instruct model's chat template: `edit` (a real source file, asked back
with one rename: most of the answer repeats the prompt) and `chat` (a question whose answer has
nothing to look up). Printed: tokens/s of each, the ratio, the drafts' acceptance, the share of
the output that repeats the prompt (16-token windows found in it), and whether the texts match.

It also prints how far a position's logits move when the model sees it among k + 1 tokens of a
verify pass rather than alone (`--logits-check`): the largest difference, and the argmax flips,
over the verified positions of the `edit` run.

`--pass-costs`: what a verify pass costs in the batch, the figure a draft length per batch size
is chosen from: the time of one forward pass over B rows of 1 + k tokens each (a 512-token
context each, B in 1, 4, 16; k in 0, 2, 4, 8), over the same pass with k = 0. A pass that costs
(1 + k) times more gains nothing even when every draft is kept.

    python benchmarks/speculation_ceiling.py [--model PATH] [--max-tokens 256] [--draft 8]
                                             [--repeats 3] [--pass-costs]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from common import REPO_ROOT, bench_parser, default_model, print_table, reexec_for_cpu

sys.path.insert(0, str(REPO_ROOT))

EDIT_SOURCE = REPO_ROOT / "mlxserve" / "speculation" / "ngram.py"
CHAT_QUESTION = "Why is the sky blue? Answer in a few sentences."
WINDOW = 16  # an output window found verbatim in the prompt counts as repeated


def parse_args() -> argparse.Namespace:
    parser = bench_parser("One greedy stream with prompt-lookup drafts against without")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--draft", type=int, default=8, help="most tokens drafted a pass")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--logits-check", action="store_true")
    parser.add_argument("--pass-costs", action="store_true", help="only the verify passes' costs")
    return parser.parse_args()


PASS_BATCHES = (1, 4, 16)
PASS_DRAFTS = (0, 2, 4, 8)
PASS_CONTEXT = 512


def pass_costs(model, repeats: int) -> list[tuple[str, str]]:
    """Per batch size: each draft length's forward pass over the k = 0 pass (median of
    `repeats` x 5 passes, each from the same cache state)."""
    import mlx.core as mx
    from mlx_lm.models.cache import BatchKVCache, trim_prompt_cache

    rows = []
    for batch in PASS_BATCHES:
        caches = [BatchKVCache([0] * batch) for _ in model.layers]
        context = mx.random.randint(3, 1000, (batch, PASS_CONTEXT))
        mx.eval(model(context, cache=caches)[:, -1])
        seconds = {}
        for k in PASS_DRAFTS:
            times = []
            for _ in range(repeats * 5):
                inputs = mx.random.randint(3, 1000, (batch, 1 + k))
                mx.eval(inputs)
                started = time.perf_counter()
                mx.eval(model(inputs, cache=caches))
                times.append(time.perf_counter() - started)
                trim_prompt_cache(caches, 1 + k)
            seconds[k] = statistics.median(times)
        ratios = ", ".join(f"k={k} {seconds[k] / seconds[0]:.2f}x" for k in PASS_DRAFTS[1:])
        rows.append(
            (f"{batch} rows: a pass of 1 + k tokens / of 1 ({seconds[0] * 1e3:.1f} ms)", ratios)
        )
    return rows


def workloads(tokenizer) -> dict[str, list[int]]:
    source = EDIT_SOURCE.read_text()
    edit = (
        "Rewrite this Python file with the class NgramDrafter renamed to LookupDrafter. "
        f"Output the whole file and nothing else.\n\n```python\n{source}```"
    )
    prompts = {"edit": edit, "chat": CHAT_QUESTION}
    return {
        name: tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True
        )
        for name, text in prompts.items()
    }


def plain(model, prompt: list[int], max_tokens: int) -> tuple[list[int], float]:
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    logits = model(mx.array(prompt)[None], cache=cache)[:, -1]
    token = int(mx.argmax(logits, axis=-1).item())
    out, started = [token], time.perf_counter()
    while len(out) < max_tokens:
        logits = model(mx.array([[token]]), cache=cache)[:, -1]
        token = int(mx.argmax(logits, axis=-1).item())
        out.append(token)
    return out, time.perf_counter() - started


def lookup(model, prompt: list[int], max_tokens: int, draft: int, check: list | None = None):
    """Greedy with prompt-lookup drafts: (tokens, seconds, drafted, accepted)."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

    from mlxserve.speculation.ngram import NgramDrafter

    cache = make_prompt_cache(model)
    logits = model(mx.array(prompt)[None], cache=cache)[:, -1]
    token = int(mx.argmax(logits, axis=-1).item())
    drafter = NgramDrafter(prompt)
    drafter.append(token)
    out, started, drafted, accepted = [token], time.perf_counter(), 0, 0
    while len(out) < max_tokens:
        guess = drafter.draft(min(draft, max_tokens - len(out) - 1))
        logits = model(mx.array([[token, *guess]]), cache=cache)[0]
        chosen = mx.argmax(logits, axis=-1).tolist()
        kept = 0
        while kept < len(guess) and guess[kept] == chosen[kept]:
            kept += 1
        if check is not None and guess:
            check.append((list(out), guess[:kept], logits[: kept + 1]))
        trim_prompt_cache(cache, len(guess) - kept)
        new = [*guess[:kept], chosen[kept]]
        drafted, accepted = drafted + len(guess), accepted + kept
        out.extend(new)
        drafter.extend(new)
        token = new[-1]
    return out[:max_tokens], time.perf_counter() - started, drafted, accepted


def repeated_share(prompt: list[int], output: list[int]) -> float:
    windows = {tuple(prompt[i : i + WINDOW]) for i in range(len(prompt) - WINDOW + 1)}
    starts = range(len(output) - WINDOW + 1)
    covered = set()
    for i in starts:
        if tuple(output[i : i + WINDOW]) in windows:
            covered.update(range(i, i + WINDOW))
    return len(covered) / max(1, len(output))


def logits_drift(model, prompt: list[int], checks: list) -> tuple[float, int, int]:
    """Each verified position's logits computed alone (one token a pass, from the same
    prefix) against within its verify pass: largest |difference|, argmax flips, positions."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    worst, flips, positions = 0.0, 0, 0
    for before, kept, verify_logits in checks[:20]:
        cache = make_prompt_cache(model)
        model(mx.array(prompt + before[:-1])[None], cache=cache)
        for i, token in enumerate([before[-1], *kept]):
            alone = model(mx.array([[token]]), cache=cache)[0, -1]
            difference = mx.abs(alone - verify_logits[i]).max().item()
            worst = max(worst, difference)
            flips += int(mx.argmax(alone).item() != mx.argmax(verify_logits[i]).item())
            positions += 1
    return worst, flips, positions


def main() -> None:
    args = parse_args()
    reexec_for_cpu()  # the process settings `mlxserve serve` runs under
    from mlx_lm import load

    from mlxserve.platform import current_policy

    path = args.model or default_model()
    model, tokenizer = load(path)
    current_policy().prepare_model(model)
    if args.pass_costs:
        print_table([("model", Path(path).name), *pass_costs(model, args.repeats)])
        return
    rows = [
        ("model", Path(path).name),
        ("max tokens; most drafted a pass", f"{args.max_tokens}; {args.draft}"),
    ]
    for name, prompt in workloads(tokenizer).items():
        plain_rates, lookup_rates, same, checks = [], [], True, []
        for repeat in range(args.repeats):
            base, base_s = plain(model, prompt, args.max_tokens)
            check = checks if args.logits_check and name == "edit" and repeat == 0 else None
            fast, fast_s, drafted, accepted = lookup(
                model, prompt, args.max_tokens, args.draft, check
            )
            same = same and fast == base
            plain_rates.append((len(base) - 1) / base_s)
            lookup_rates.append((len(fast) - 1) / fast_s)
        ratios = [f / p for f, p in zip(lookup_rates, plain_rates)]
        rows += [
            (f"{name}: plain tok/s", " / ".join(f"{r:.1f}" for r in plain_rates)),
            (f"{name}: lookup tok/s", " / ".join(f"{r:.1f}" for r in lookup_rates)),
            (f"{name}: lookup / plain", " / ".join(f"{r:.2f}x" for r in ratios)),
            (f"{name}: median ratio", f"{statistics.median(ratios):.2f}x"),
            (
                f"{name}: drafted, accepted (last run)",
                f"{drafted}, {accepted} ({accepted / max(1, drafted):.0%})",
            ),
            (f"{name}: output repeating the prompt", f"{repeated_share(prompt, base):.0%}"),
            (f"{name}: same tokens as plain", "yes" if same else "NO"),
        ]
        if checks:
            worst, flips, positions = logits_drift(model, prompt, checks)
            rows.append(
                (
                    f"{name}: verify-pass logits vs alone",
                    f"max |diff| {worst:.2e}, argmax flips {flips} of {positions}",
                )
            )
        if name == "edit":
            rows.append(("edit: answer starts", repr(tokenizer.decode(base[:24]))))
    print_table(rows)


if __name__ == "__main__":
    main()
