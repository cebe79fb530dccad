"""Make a draft model for `--draft-model` from a model by keeping its first N layers.

A layer-truncated copy shares its model's tokenizer and embedding; it needs no download (the
shared SmolLM2 gives a 135M pair here). Quantized models stay quantized. Its Nth layer's output
read through the model's own final norm and head is seldom the model's next token, so
`--fit-head` fits a head of its own (a tuned lens): the linear map from the Nth layer's
normalised output to the model's last normalised output, least squares over the model's hidden
states on this repository's text, folded into an untied head. That is a minute of a CPU, not a
training run.

    python scripts/make_draft_model.py ../shared/models/smollm2-135m-instruct-4bit \\
        --layers 8 --out build/smollm2-draft-8 [--fit-head] [--agreement]

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


def truncate(source: Path, out: Path, layers: int, fit_head: bool = False) -> Path:
    """`source`'s first `layers` layers, its embedding, norm and head, into `out`; with
    `fit_head`, a head fitted to the model's last layer (fitted_head) in place of its own."""
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
    config["num_hidden_layers"] = layers
    if fit_head:
        weights.update(fitted_head(source, layers))
        weights["model.norm.weight"] = mx.ones_like(weights["model.norm.weight"])
        config["tie_word_embeddings"] = False
    mx.save_safetensors(str(out / "model.safetensors"), weights)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


# Not the text speculation.py's workloads ask about (followers.py), nor agreement's questions
FIT_TEXTS = ("mlxserve/**/*.py", "docs/*.md", "README.md")
FIT_EXCLUDED = ("followers.py",)
FIT_TOKENS = 16384
FIT_CHUNK = 512
RIDGE = 1e-3  # against x^T x's mean diagonal: keeps the solve well-posed


def fitted_head(source: Path, layers: int) -> dict:
    """An untied head for `source` cut to `layers` layers: W minimising |W x - y|^2 over
    positions of this repository's text, x the `layers`th layer's output RMS-normalised (the
    draft's norm, its weight set to ones) and y the model's own final norm's output; the head is
    the model's embedding times W, quantized as the embedding is. Greedy drafts read its argmax,
    which this fits."""
    import mlx.core as mx
    import mlx.nn as nn
    import mlx_lm
    from mlx_lm.utils import dequantize_model

    model, tokenizer = mlx_lm.load(str(source))
    embedding = model.model.embed_tokens
    quantized = None
    if isinstance(embedding, nn.QuantizedEmbedding):
        quantized = {"group_size": embedding.group_size, "bits": embedding.bits}
    dequantize_model(model)  # MLX's CPU kernels for quantized weights are slow over prompts
    repo = Path(__file__).resolve().parent.parent
    paths = sorted({p for pattern in FIT_TEXTS for p in repo.glob(pattern)})
    tokens: list[int] = []
    for path in paths:
        if path.name not in FIT_EXCLUDED and len(tokens) < FIT_TOKENS:
            tokens += tokenizer.encode(path.read_text())
    tokens = tokens[:FIT_TOKENS]
    body, inner = model.model, model.model.layers[layers - 1]
    table = body.embed_tokens.weight.astype(mx.float32)
    seen: list = []
    body.layers[layers - 1] = _Recorder(inner, seen)
    xtx = mx.zeros((table.shape[1],) * 2)
    xty = mx.zeros_like(xtx)
    for start in range(0, len(tokens) - 1, FIT_CHUNK):
        seen.clear()
        y = body(mx.array(tokens[start : start + FIT_CHUNK])[None])[0].astype(mx.float32)
        x = mx.fast.rms_norm(seen[0][0].astype(mx.float32), None, body.norm.eps)  # the draft's
        xtx, xty = xtx + x.T @ x, xty + x.T @ y
        mx.eval(xtx, xty)
    body.layers[layers - 1] = inner
    ridge = RIDGE * mx.mean(mx.diag(xtx))
    w = mx.linalg.solve(xtx + ridge * mx.eye(xtx.shape[0]), xty, stream=mx.cpu)  # x W = y
    head = table @ w.T  # a position's logits: (x W) table^T = x head^T
    if quantized is None:
        return {"lm_head.weight": head.astype(body.embed_tokens.weight.dtype)}
    weight, scales, biases = mx.quantize(head, **quantized)
    return {"lm_head.weight": weight, "lm_head.scales": scales, "lm_head.biases": biases}


class _Recorder:
    """A layer that also appends its output to `outputs` (fitted_head's hook)."""

    def __init__(self, layer, outputs: list):
        self.layer, self.outputs = layer, outputs

    def __call__(self, *args, **kwargs):
        out = self.layer(*args, **kwargs)
        self.outputs.append(out)
        return out

    def __getattr__(self, name):
        return getattr(self.layer, name)


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
    parser.add_argument("--fit-head", action="store_true", help="a head of its own (above)")
    parser.add_argument("--agreement", action="store_true", help="measure it (above)")
    args = parser.parse_args()
    if args.agreement or args.fit_head:
        from mlxserve.platform import reexec_for_cpu

        reexec_for_cpu()  # MLX's CPU backend on the BLAS mlxserve uses (no-op elsewhere)
    print(truncate(args.source, args.out, args.layers, args.fit_head))
    if args.agreement:
        shares = agreement(args.source, args.out)
        print("agreement with the model's greedy answers:", ", ".join(f"{s:.0%}" for s in shares))


if __name__ == "__main__":
    main()
