"""Pack what a fine-tuning run of the demo model needs on a lent NVIDIA machine into `.whl/send*`.

scripts/cuda/prepare.py packs MLX's CUDA build; this adds the model training starts from (--start:
the shipped demo model, so a run continues from it; or --base, the shared SmolLM2, to start
over), this interpreter's standard library (the training data, so a machine with another Python
trains on the same files) and demo_corpus.py's packages, xz-packed; the machine tokenizes them.
The lent machine takes 64 MiB a call, the working tree included, and the model alone is larger,
so everything goes into one tar split into `.whl/send1`, `.whl/send2`, ...: one folder per call,
each carried once (scripts/cuda/train.sh keeps what each call brought and reassembles the tar
when all have arrived). The shipped model's own weights are in the working tree: move them out
of it for every call (they would not fit), and back after.

A base's quantization scales and biases are stored as float16 for the trip: the GGUF they came
from holds them in float16, so the conversion is exact (checked here, tensor by tensor).

    python scripts/demo_corpus.py && python scripts/cuda/prepare.py
    python scripts/cuda/prepare_training.py [--base ../shared/models/smollm2-135m-instruct-4bit]
"""

from __future__ import annotations

import argparse
import io
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
from demo_data import corpus_root, stdlib_files, stdlib_root  # noqa: E402

SHIPPED = ROOT / "mlxserve" / "models" / "mlxserve-demo-coder"
CALL_LIMIT = 64 * 2**20  # the device tool's working tree per call
MARGIN = 2**20
ORDER = ("wheels", "mlx_cuda_13.tar.xz", "stdlib.tar.xz", "corpus.tar.xz", "start.tar.xz")


def tracked_bytes() -> int:
    """What travels with every call: tracked files and untracked ones git does not ignore."""
    names = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    return sum(
        (ROOT / n.decode()).stat().st_size for n in names if n and (ROOT / n.decode()).is_file()
    )


def base_with_float16_scales(base: Path, out: Path) -> None:
    import mlx.core as mx

    out.mkdir(parents=True)
    for path in base.iterdir():
        if path.suffix != ".safetensors" and path.is_file():
            shutil.copyfile(path, out / path.name)
    packed = {}
    for name, array in mx.load(str(base / "model.safetensors")).items():
        if name.endswith((".scales", ".biases")) and array.dtype == mx.float32:
            narrow = array.astype(mx.float16)
            if not mx.array_equal(narrow.astype(mx.float32), array).item():
                raise SystemExit(f"{name}: float16 would change it; carry {base} as it is")
            array = narrow
        packed[name] = array
    mx.save_safetensors(str(out / "model.safetensors"), packed)


def packed(folder: Path, out: Path) -> None:
    """A folder as one xz tar (4-bit weights shrink by a few percent: the parts' sizes count)."""
    with tarfile.open(out, "w:xz", preset=6) as tar:
        tar.add(folder, arcname=".")


def stdlib_tar(out: Path) -> None:
    """The files demo_data reads from this interpreter's standard library, and no others."""
    root = stdlib_root()
    with tarfile.open(out, "w:xz", preset=6) as tar:
        for source in stdlib_files():
            tar.add(root / source.name, arcname=source.name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    start = parser.add_mutually_exclusive_group()
    start.add_argument("--start", type=Path, default=SHIPPED, help="a model with the FIM tokens")
    start.add_argument("--base", type=Path, help="a quantized model without them (SmolLM2)")
    parser.add_argument("--start-weights", type=Path, help="--start's model.safetensors, moved")
    args = parser.parse_args()
    whl = ROOT / ".whl"
    wheels = [*whl.glob("deps/mlx-*.whl"), *whl.glob("deps/mlx_lm-*.whl")]
    if not (whl / "mlx_cuda_13.tar.xz").exists() or len(wheels) != 2:
        raise SystemExit("run scripts/cuda/prepare.py first")
    if not (corpus_root() / "manifest.json").exists():
        raise SystemExit(f"{corpus_root()}: run scripts/demo_corpus.py first")
    for old in whl.glob("send*"):
        shutil.rmtree(old)
    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp) / "train"
        staged.mkdir()
        model = staged / "start"
        if args.base:
            base_with_float16_scales(args.base, model)
        else:  # its other files travel in the tree: train.sh puts them beside the weights
            model.mkdir()
            weights = args.start_weights or args.start / "model.safetensors"
            shutil.copyfile(weights, model / "model.safetensors")
        packed(model, staged / "start.tar.xz")
        packed(corpus_root(), staged / "corpus.tar.xz")
        stdlib_tar(staged / "stdlib.tar.xz")
        (staged / "wheels").mkdir()
        for wheel in wheels:
            shutil.copyfile(wheel, staged / "wheels" / wheel.name)
        shutil.copyfile(whl / "mlx_cuda_13.tar.xz", staged / "mlx_cuda_13.tar.xz")
        bundle = io.BytesIO()
        with tarfile.open(fileobj=bundle, mode="w") as tar:
            # MLX and the data first: the first call can install and try them while the base
            # model's bytes are still on their way
            for name in ORDER:
                tar.add(staged / name, arcname=f"train/{name}")
    data = bundle.getvalue()
    room = CALL_LIMIT - tracked_bytes() - MARGIN
    parts = [data[i : i + room] for i in range(0, len(data), room)]
    for index, part in enumerate(parts, 1):
        (whl / f"send{index}").mkdir()
        (whl / f"send{index}" / f"train.tar.{index:02d}").write_bytes(part)
    print(f"{len(data) / 2**20:.1f} MiB in {len(parts)} calls of at most {room / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
