"""Issue 60's single streams, replayed: how far the planner's widths are from what the same drafts
could give, at the step times the engine measured.

1. The engine in this process (`--model`), each workload of `speculation.py` (the edit, the
   fill, the chat) asked greedy with drafts and without, `--runs` times, the side that goes first
   swapped each run: the measured ratio of decode rates, and the engine's own step times by
   width (its `PassCosts`, start to start, the times the planner chooses by).
2. The answer's tokens (identical either way, checked) replayed through the planner, a batch of
   one, each step costed at the measured time of its width over a plain step's:
   - `planner`: `DraftPlanner` as the engine runs it (its ratio checks the replay against the
     measured one);
   - `fixed w`: every lookup drafted up to w tokens (`--spec-fixed-width`);
   - `oracle`: each step knows how many of the lookup's drafts the model keeps and drafts the
     count, of those, that emits the most tokens per unit of step time: the best any choice of
     widths could do with these drafts.

`--save-answers FILE` keeps the answers' tokens; `--answers FILE` replays those in place of the
model's own, at this machine's step times: a real model's answers recorded here, replayed where
only a random-weight stand-in of the same shape can run (`scripts/cuda/run.sh`), say what the
same drafts would give at a GPU's step times.

This script only prints; it asserts nothing.

    python benchmarks/speculation_replay.py [--model PATH] [--max-tokens 160] [--runs 3]
                                            [--workloads edit fill chat]
                                            [--save-answers FILE] [--answers FILE]
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from pathlib import Path

from common import bench_parser, default_model, print_table, reexec_for_cpu
from speculation import prompts

FIXED_WIDTHS = (2, 4, 8, 16)


def parse_args():
    parser = bench_parser(
        "Speculation's single streams replayed through the draft planner, fixed widths and an "
        "oracle, at the engine's measured step times; against the measured ratio."
    )
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workloads", nargs="+", default=["edit", "fill", "chat"])
    parser.add_argument(
        "--save-answers", metavar="FILE", help="write the answers' tokens to FILE (JSON)"
    )
    parser.add_argument(
        "--answers",
        metavar="FILE",
        help="replay FILE's answers (--save-answers's, from a real model on another machine) "
        "at this machine's step times, in place of this model's own",
    )
    return parser.parse_args()


async def answer(engine, prompt: list[int], max_tokens: int, drafts: bool):
    """(tokens, decode tokens/s from the first token's event to the last) of a greedy answer."""
    from mlxserve.engine import GenerationRequest, StopSpec
    from mlxserve.sampling.params import SamplingParams

    request = GenerationRequest(
        prompt_ids=tuple(prompt),
        max_tokens=max_tokens,
        sampling=SamplingParams(temperature=0.0),
        seed=0,
        stop=StopSpec(),
        num_draft_tokens=None if drafts else 0,
    )
    tokens, stamps = [], []
    async for event in engine.submit([request]):
        if event.token_ids:
            stamps.append(time.perf_counter())
            tokens += event.token_ids
    return tokens, (len(tokens) - 1) / (stamps[-1] - stamps[0])


def kept_count(drafts: list[int], truth: list[int]) -> int:
    count = 0
    while count < len(drafts) and count < len(truth) and drafts[count] == truth[count]:
        count += 1
    return count


def replay(prompt: list[int], output: list[int], planner, cost) -> tuple[float, int, int]:
    """(tokens per plain step's time, drafted, kept) of `planner` choosing each step of the
    answer `output` to `prompt`, as the engine's batch of one asks it."""
    planner.admit(0)
    emitted, spent, drafted, kept = [output[0]], 0.0, 0, 0
    while len(emitted) < len(output):
        in_kv, current, left = prompt + emitted[:-1], emitted[-1], len(output) - len(emitted)
        width = planner.width([0], [in_kv], [left])
        drafts = planner.drafts([0], [in_kv], [current], width, [left])[0] if width else []
        if not drafts:
            emitted.append(output[len(emitted)])
            spent += 1.0
            continue
        count = kept_count(drafts, output[len(emitted) :])
        planner.record([0], [drafts], [count])
        emitted += output[len(emitted) : len(emitted) + count + 1]
        spent += cost(1, len(drafts))
        drafted, kept = drafted + len(drafts), kept + count
    return (len(output) - 1) / spent, drafted, kept


def oracle(prompt: list[int], output: list[int], limit: int, cost) -> tuple[float, int, int]:
    """`replay`'s figures for steps that each draft the best count of the drafts kept."""
    from mlxserve.speculation.ngram import NgramDrafter

    emitted, spent, drafted = [output[0]], 0.0, 0
    while len(emitted) < len(output):
        left = len(output) - len(emitted)
        drafts = NgramDrafter(prompt + emitted).draft(min(limit, left))
        count = kept_count(drafts, output[len(emitted) :])
        width = max(range(count + 1), key=lambda w: (w + 1) / cost(1, w))
        emitted += output[len(emitted) : len(emitted) + width + 1]
        spent += cost(1, width)
        drafted += width
    return (len(output) - 1) / spent, drafted, drafted


def measure(model: str, asked: dict[str, list[int]], max_tokens: int, runs: int):
    """Each workload's greedy answer, its ratios with drafts over without, and the engine's
    step times by width at one row ({width: seconds})."""
    from mlxserve.engine import Engine

    engine = Engine(model).start()
    if not engine.wait_ready(600):
        raise SystemExit(f"the engine did not load: {engine.error}")
    answers, ratios = {}, {}
    try:
        for name, prompt in asked.items():
            asyncio.run(answer(engine, prompt, 8, True))  # its prompt into the prefix cache
            for run in range(runs):
                sides = {}
                for drafts in (True, False) if run % 2 == 0 else (False, True):
                    sides[drafts] = asyncio.run(answer(engine, prompt, max_tokens, drafts))
                if sides[True][0] != sides[False][0]:
                    raise SystemExit(f"{name}: the answers with and without drafts differ")
                answers[name] = sides[False][0]
                ratios.setdefault(name, []).append(sides[True][1] / sides[False][1])
        measured = engine.pass_costs.measured()
    finally:
        engine.stop()
    return answers, ratios, {width: s for (size, width), s in measured.items() if size == 1}


def replayed(prompt: list[int], output: list[int], cost) -> dict[str, tuple[float, int, int]]:
    """`replay`'s figures for the planner, each fixed width and the oracle."""
    from mlxserve.speculation.pass_costs import FlatPassCosts, PassCosts
    from mlxserve.speculation.planner import DEFAULT_DRAFT_TOKENS, DraftPlanner

    class Measured(PassCosts):
        def relative_cost(self, rows: int, width: int) -> float:
            return cost(rows, width)

    figures = {"planner": replay(prompt, output, DraftPlanner(costs=Measured()), cost)}
    for width in FIXED_WIDTHS:
        planner = DraftPlanner(draft_tokens=width, costs=FlatPassCosts())
        figures[f"fixed {width}"] = replay(prompt, output, planner, cost)
    figures["oracle"] = oracle(prompt, output, DEFAULT_DRAFT_TOKENS, cost)
    return figures


def main() -> int:
    args = parse_args()
    reexec_for_cpu()
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    from mlxserve.speculation.draft_length import measured_costs

    model = args.model or default_model()
    tokenizer = load_tokenizer(Path(model))
    texts = prompts()
    asked = {
        name: tokenizer.apply_chat_template(
            [{"role": "user", "content": texts[name]}], add_generation_prompt=True
        )
        for name in args.workloads
    }
    answers, ratios, steps = measure(model, asked, args.max_tokens, args.runs)
    rows: list[tuple[str, str]] = []
    for name, output in answers.items():
        rows.append(
            (
                f"{name}: measured ratio, {len(output)} tokens",
                " / ".join(f"{r:.2f}x" for r in ratios[name])
                + f" (median {statistics.median(ratios[name]):.2f}x)",
            )
        )
    if args.save_answers:
        recorded = {name: {"prompt": asked[name], "output": answers[name]} for name in answers}
        Path(args.save_answers).write_text(json.dumps({"model": model, "answers": recorded}))
    if args.answers:  # another machine's (a real model's) answers, at this machine's step times
        loaded = json.loads(Path(args.answers).read_text())
        rows.append(("answers replayed", f"{args.answers} ({loaded['model']})"))
        asked = {name: a["prompt"] for name, a in loaded["answers"].items()}
        answers = {name: a["output"] for name, a in loaded["answers"].items()}
    if 0 not in steps or len(steps) < 2:
        raise SystemExit(f"too few step widths were timed: {sorted(steps)}")
    relative = {width: s / steps[0] for width, s in sorted(steps.items()) if width}
    cost = measured_costs({1: relative})
    rows.append(
        (
            "step time by width, over a plain step's",
            f"plain {steps[0] * 1000:.1f} ms; "
            + ", ".join(f"{w}: {r:.2f}x" for w, r in relative.items()),
        )
    )
    for name, output in answers.items():
        for label, (ratio, drafted, kept) in replayed(asked[name], output, cost).items():
            rows.append(
                (f"{name}: replayed, {label}", f"{ratio:.2f}x; drafted {drafted}, kept {kept}")
            )
    print_table(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
