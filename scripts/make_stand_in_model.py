"""Build a random-weight stand-in of a model: same architecture, quantization and tokenizer.

Decode and prefill speed depend on the shapes and the quantization, not on the weight values, so a
stand-in benchmarks like the real model where its weights cannot go (a lent GPU machine takes a
few tens of MiB, not a model). Its text is noise: use it for speed, never for quality.

    python scripts/make_stand_in_model.py --like ../shared/models/smollm2-135m-instruct-4bit \
        --out /tmp/smollm2-stand-in
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.utils import _get_classes

CARRIED = (
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "chat_template.jinja",
    "tokenizer.model",
)


def copy_description(like: Path, out: Path) -> dict:
    """Copy the config and tokenizer files (everything but the weights); return the config."""
    out.mkdir(parents=True, exist_ok=True)
    for name in CARRIED:
        if (like / name).is_file():
            shutil.copyfile(like / name, out / name)
    return json.loads((out / "config.json").read_text())


def quantize_like(model: nn.Module, quantization: dict) -> None:
    """Quantize as the original was, per-layer overrides (e.g. an 8-bit embedding) included."""

    def predicate(path: str, module: nn.Module):
        if not hasattr(module, "to_quantized"):
            return False
        override = quantization.get(path)
        if isinstance(override, dict):
            return {k: override[k] for k in ("group_size", "bits", "mode") if k in override}
        return override is not False

    nn.quantize(
        model,
        group_size=quantization["group_size"],
        bits=quantization["bits"],
        mode=quantization.get("mode", "affine"),
        class_predicate=predicate,
    )


def build_stand_in(like: Path, out: Path, seed: int) -> int:
    """Write the stand-in to `out`; return its weight file's size in bytes."""
    config = copy_description(like, out)
    mx.random.seed(seed)
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    model.set_dtype(getattr(mx, config.get("torch_dtype") or "bfloat16"))
    if "quantization" in config:
        quantize_like(model, config["quantization"])
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    return (out / "model.safetensors").stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--like", type=Path, required=True, help="the real model's folder")
    parser.add_argument("--out", type=Path, required=True, help="the stand-in's folder")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    start = time.perf_counter()
    size = build_stand_in(args.like, args.out, args.seed)
    print(
        f"stand-in of {args.like.name} in {args.out}: {size / 2**20:.1f} MiB of random weights "
        f"({time.perf_counter() - start:.1f} s)"
    )


if __name__ == "__main__":
    main()
