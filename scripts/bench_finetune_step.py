"""Time one training step of a model three ways, to choose how to fine-tune the demo model:
full fine-tuning, LoRA on every layer, or only the top layers trainable.

    python scripts/bench_finetune_step.py full|lora|top6 [--batch 8] [--tokens 256]
        [--model ../shared/models/smollm2-135m-instruct-4bit]

The 4-bit weights are widened to float32 (what the fine-tuning script trains); the step is
compiled as there; the first step includes compilation, the next two are the figure.
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial
from pathlib import Path

from mlxserve.platform import flush_denormals, reexec_for_cpu

sys.path.insert(0, str(Path(__file__).resolve().parent))
DEFAULT_MODEL = (
    Path(__file__).resolve().parents[2] / "shared" / "models" / "smollm2-135m-instruct-4bit"
)


def main() -> None:
    reexec_for_cpu()
    flush_denormals()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", help="full, lora, or topN (the last N layers trainable)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    args = parser.parse_args()

    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim
    from cpu_training_ops import token_losses, use_in_llama
    from mlx.utils import tree_flatten
    from mlx_lm import load
    from mlx_lm.tuner.utils import linear_to_lora_layers
    from mlx_lm.utils import dequantize_model

    use_in_llama()
    model, _ = load(str(args.model))
    model = dequantize_model(model)
    model.set_dtype(mx.float32)
    if args.mode == "lora":
        model.freeze()
        layers = len(model.model.layers)
        linear_to_lora_layers(model, layers, {"rank": 16, "scale": 20.0, "dropout": 0.0})
    elif args.mode.startswith("top"):
        model.freeze()
        for layer in model.model.layers[-int(args.mode[3:]) :]:
            layer.unfreeze()
    trainable = sum(v.size for _, v in tree_flatten(model.trainable_parameters()))
    print(f"{args.mode}: {trainable:,} trainable parameters", flush=True)

    def loss_fn(model, x, y):
        return token_losses(model(x), y).mean()

    value_and_grad = nn.value_and_grad(model, loss_fn)
    optimizer = optim.AdamW(1e-4)
    state = [model.state, optimizer.state]

    @partial(mx.compile, inputs=state, outputs=state)
    def step(x, y):
        loss, grads = value_and_grad(model, x, y)
        optimizer.update(model, grads)
        return loss

    x = mx.random.randint(0, 49000, (args.batch, args.tokens + 1))
    for _ in range(3):
        start = time.perf_counter()
        mx.eval(state, step(x[:, :-1], x[:, 1:]))
        print(f"step: {time.perf_counter() - start:.1f} s", flush=True)


if __name__ == "__main__":
    main()
