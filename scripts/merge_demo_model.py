"""Blend the fine-tuned demo model's weights with its base model's (WiSE-FT: a weighted average of
the two), to win back the chat skill that fine-tuning on code wore away. The base may be the model
a run continued from (the shipped one), whose vocabulary already has the FIM tokens.

Every tensor becomes alpha x fine-tuned + (1 - alpha) x base, both widened to float32; the rows of
the tokens the base lacks (the FIM tokens) stay the fine-tuned ones. The result is written in
float16 in mlx-lm's layout, with the fine-tuned model's tokenizer and records (training.json
gains a `merge` entry); package_demo_model.py then quantizes it as it ships.

    python scripts/merge_demo_model.py FINE_TUNED --alpha 0.6 --out build/demo-ft/merged \
        [--base ../shared/models/smollm2-135m-instruct-4bit]
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_BASE = REPO.parent / "shared" / "models" / "smollm2-135m-instruct-4bit"
RECORDS = ("training.json", "loss_log.jsonl")


def float_weights(path: Path) -> dict:
    import mlx.core as mx
    import mlx_lm
    from mlx.utils import tree_flatten
    from mlx_lm.utils import dequantize_model

    model, _ = mlx_lm.load(str(path))
    model = dequantize_model(model)
    return {k: v.astype(mx.float32) for k, v in tree_flatten(model.parameters())}


def blend(tuned: dict, base: dict, alpha: float) -> dict:
    import mlx.core as mx

    out = {}
    for name, weight in tuned.items():
        old = base[name]
        if weight.shape == old.shape:
            out[name] = alpha * weight + (1 - alpha) * old
        else:  # the embedding: rows the base lacks are kept as fine-tuned
            rows = old.shape[0]
            mixed = alpha * weight[:rows] + (1 - alpha) * old
            out[name] = mx.concatenate([mixed, weight[rows:]])
    return out


def write_blend(tuned_dir: Path, base_dir: Path, alpha: float, out: Path) -> None:
    """alpha x tuned_dir's weights + (1 - alpha) x base_dir's, in float16, into `out` with the
    tuned model's tokenizer and records."""
    import mlx.core as mx

    tuned, base = float_weights(tuned_dir), float_weights(base_dir)
    if set(tuned) != set(base):
        raise SystemExit("the two models' tensors differ by name")
    merged = {k: v.astype(mx.float16) for k, v in blend(tuned, base, alpha).items()}
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "model.safetensors"), merged)
    config = json.loads((tuned_dir / "config.json").read_text())
    for key in ("quantization", "quantization_config"):
        config.pop(key, None)
    (out / "config.json").write_text(json.dumps({**config, "torch_dtype": "float16"}, indent=2))
    for path in tuned_dir.iterdir():
        if path.name.startswith("tokenizer") or path.name in (
            "chat_template.jinja",
            "generation_config.json",
            "special_tokens_map.json",
            "loss_log.jsonl",
        ):
            shutil.copy(path, out / path.name)
    training = json.loads((tuned_dir / "training.json").read_text())
    training["merge"] = {"method": "WiSE-FT", "alpha": alpha, "base": str(base_dir)}
    (out / "training.json").write_text(json.dumps(training, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tuned", type=Path, help="the fine-tuned model folder (any mlx-lm dtype)")
    parser.add_argument("--base", type=Path, default=DEFAULT_BASE)
    parser.add_argument("--alpha", type=float, required=True, help="the fine-tuned weights' share")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    write_blend(args.tuned, args.base, args.alpha, args.out)
    print(f"{args.out}: {args.alpha} x {args.tuned} + {1 - args.alpha:g} x {args.base}")


if __name__ == "__main__":
    main()
