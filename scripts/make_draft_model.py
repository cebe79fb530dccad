"""Make a draft model for `--draft-model` from a model by keeping its first N layers.

A layer-truncated copy shares its model's tokenizer, embedding and head, so its drafts agree
with the model where the first layers already decide the next token; it needs no training and
no download (the shared SmolLM2 gives a 135M pair here). Quantized models stay quantized.

    python scripts/make_draft_model.py ../shared/models/smollm2-135m-instruct-4bit \\
        --layers 8 --out build/smollm2-draft-8 [--agreement]

`--agreement`: how often the draft's next token is the model's, along the model's own greedy
answers to a few chat questions (teacher-forced: what a draft of one token would have kept).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def truncate(source: Path, out: Path, layers: int) -> Path:
    """`source`'s first `layers` layers, its embedding, norm and head, into `out`."""
    import mlx.core as mx

    config = json.loads((source / "config.json").read_text())
    if not 0 < layers < config["num_hidden_layers"]:
        raise SystemExit(f"--layers: 1 to {config['num_hidden_layers'] - 1} for {source}")
    out.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        if path.is_file() and not path.name.endswith((".safetensors", ".safetensors.index.json")):
            shutil.copyfile(path, out / path.name)
    weights = {}
    for path in sorted(source.glob("model*.safetensors")):
        for name, array in mx.load(str(path)).items():
            layer = LAYER.search(name)
            if layer is None or int(layer.group(1)) < layers:
                weights[name] = array
    mx.save_safetensors(str(out / "model.safetensors"), weights)
    config["num_hidden_layers"] = layers
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


QUESTIONS = (
    "Why is the sky blue?",
    "Write a Python function that reverses a list.",
    "Explain how a hash table works.",
)


def agreement(model_dir: Path, draft_dir: Path, tokens: int = 64) -> list[float]:
    """Per question: the share of the model's greedy answer's tokens that the draft, fed the
    same tokens before each, predicts as its own greedy next token."""
    import mlx.core as mx
    import mlx_lm
    from mlx_lm.models.cache import make_prompt_cache

    model, tokenizer = mlx_lm.load(str(model_dir))
    draft, _ = mlx_lm.load(str(draft_dir))
    shares = []
    for question in QUESTIONS:
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True
        )
        cache = make_prompt_cache(model)
        logits = model(mx.array(prompt)[None], cache=cache)[0, -1]
        answer = []
        for _ in range(tokens):
            answer.append(mx.argmax(logits).item())
            logits = model(mx.array([answer[-1:]]), cache=cache)[0, -1]
        guesses = draft(mx.array(list(prompt) + answer)[None])[0, len(prompt) - 1 : -1]
        agreed = (mx.argmax(guesses, axis=-1) == mx.array(answer)).sum().item()
        shares.append(agreed / tokens)
    return shares


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path, help="a model folder in mlx-lm's layout")
    parser.add_argument("--layers", type=int, required=True, help="layers the draft keeps")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--agreement", action="store_true", help="measure it (above)")
    args = parser.parse_args()
    if args.agreement:
        from mlxserve.platform import reexec_for_cpu

        reexec_for_cpu()  # MLX's CPU backend on the BLAS mlxserve uses (no-op elsewhere)
    print(truncate(args.source, args.out, args.layers))
    if args.agreement:
        shares = agreement(args.source, args.out)
        print("agreement with the model's greedy answers:", ", ".join(f"{s:.0%}" for s in shares))


if __name__ == "__main__":
    main()
