"""Make a draft model for `--draft-model` from a model by keeping its first N layers.

A layer-truncated copy shares its model's tokenizer, embedding and head, so its drafts agree
with the model where the first layers already decide the next token; it needs no training and
no download (the shared SmolLM2 gives a 135M pair here). Quantized models stay quantized.

    python scripts/make_draft_model.py ../shared/models/smollm2-135m-instruct-4bit \\
        --layers 8 --out build/smollm2-draft-8
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path, help="a model folder in mlx-lm's layout")
    parser.add_argument("--layers", type=int, required=True, help="layers the draft keeps")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    print(truncate(args.source, args.out, args.layers))


if __name__ == "__main__":
    main()
