"""Choose the demo model's WiSE-FT blend on held-out package files, never on the card's tasks.

Each alpha's blend of the fine-tuned weights with the model the run started from (or the base) is
quantized as it ships and scored on single-line infills from demo_corpus.py's held-out files, as
eval_demo_model.py scores them, and on its chat probes. The chosen blend has the most exact
matches (then parses, then the larger alpha) among those that answer at least as many chat
probes as the anchor does; `choice.json` records every candidate, and the chosen folder is
copied to --out/chosen.

    python scripts/choose_demo_blend.py build/demo-ft/model \
        --anchor mlxserve/models/mlxserve-demo-coder \
        --alphas 1.0 0.8 0.6 --out build/demo-ft/blends
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from demo_data import corpus_files, split  # noqa: E402
from eval_demo_model import PROMPT_TOKENS, ModelInfiller, infill_tasks, score  # noqa: E402
from merge_demo_model import write_blend  # noqa: E402
from package_demo_model import quantize  # noqa: E402


def candidate(infiller: ModelInfiller, tasks, alpha: float | None) -> dict:
    started = time.monotonic()
    result = {"alpha": alpha, **score("model", infiller, tasks), "chat": infiller.chat()}
    result["seconds"] = round(time.monotonic() - started, 1)
    return result


def best(candidates: list[dict], anchor_chat: int) -> dict:
    """The most exact matches, then parses, then the larger alpha, among blends that keep the
    anchor's chat answers (all of them when none does)."""
    keeping = [c for c in candidates if c["chat"]["right"] >= anchor_chat] or candidates
    return max(keeping, key=lambda c: (c["exact_match"], c["parse_rate"], c["alpha"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tuned", type=Path, help="the fine-tuned model (finetune's export)")
    parser.add_argument("--anchor", type=Path, required=True, help="what the run started from")
    parser.add_argument("--alphas", type=float, nargs="+", default=[1.0, 0.8, 0.6])
    parser.add_argument("--tasks", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--prompt-tokens", type=int, default=PROMPT_TOKENS)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--score-anchor", action="store_true", help="score its infills too")
    parser.add_argument(
        "--deadline",
        type=float,
        help="seconds: start no further blend after this (a lent machine's limit); one always runs",
    )
    args = parser.parse_args()
    started = time.monotonic()

    _, held_out = split(corpus_files())
    if not held_out:
        raise SystemExit("no held-out package files: run scripts/demo_corpus.py first")
    tasks = infill_tasks(held_out, args.tasks, args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    anchor_model = ModelInfiller(args.anchor, args.prompt_tokens)
    # its chat answers are the bar; its infills only where asked (a lent machine's time)
    anchor = candidate(anchor_model, tasks, None) if args.score_anchor else {}
    anchor["chat"] = anchor_model.chat()
    print(json.dumps({"anchor": anchor}), flush=True)
    candidates = []
    for alpha in args.alphas:
        if candidates and args.deadline and time.monotonic() - started > args.deadline:
            print(f"alpha {alpha:g} skipped: past --deadline", flush=True)
            continue
        folder = args.out / f"alpha-{alpha:g}"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        with tempfile.TemporaryDirectory() as scratch:
            write_blend(args.tuned, args.anchor, alpha, Path(scratch))
            quantize(Path(scratch), folder)
            for name in ("training.json", "loss_log.jsonl"):
                shutil.copy(Path(scratch) / name, folder / name)
        candidates.append(candidate(ModelInfiller(folder, args.prompt_tokens), tasks, alpha))
        print(json.dumps(candidates[-1]), flush=True)
    chosen = best(candidates, anchor["chat"]["right"])
    shutil.rmtree(args.out / "chosen", ignore_errors=True)
    shutil.copytree(args.out / f"alpha-{chosen['alpha']:g}", args.out / "chosen")
    report = {
        "held_out": "packages",
        "tasks": len(tasks),
        "seed": args.seed,
        "prompt_tokens": args.prompt_tokens,
        "anchor": {"model": str(args.anchor), **anchor},
        "candidates": candidates,
        "skipped_alphas": [a for a in args.alphas if a not in [c["alpha"] for c in candidates]],
        "chosen_alpha": chosen["alpha"],
    }
    (args.out / "choice.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"chosen: alpha {chosen['alpha']:g}", flush=True)


if __name__ == "__main__":
    main()
