"""Build the tiny random-weight test model (deterministic for a given seed and Python version)."""

import argparse
import time
from pathlib import Path

from mlxserve.tiny_model import build_tiny_model, default_tiny_model_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, help="output folder (default: the user cache)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true", help="rebuild even if already built")
    args = parser.parse_args()
    out = args.out or default_tiny_model_dir(args.seed)
    start = time.perf_counter()
    build_tiny_model(out, seed=args.seed, force=args.force)
    print(f"tiny model in {out} ({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
