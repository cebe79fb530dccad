"""Pack what a lent NVIDIA machine needs to run mlxserve on MLX's CUDA backend into `.whl/`.

That machine reaches no package index and takes 64 MiB of files in all, and mlx-cuda-13's wheel is
86 MiB: its libmlx.so carries kernels for seven GPU generations. This keeps the one the lent
card runs (sm_90: H100, H200), zeroes the others' bytes in place (the library's layout is
untouched, so the loader sees the same file) and xz-packs it. The other wheels are the
dependencies the machine's image lacks. The shared SmolLM2's config and tokenizer go along so
`scripts/make_stand_in_model.py` can build a same-shape stand-in there, with the real model's
greedy answers to speculation's workloads (`benchmarks/speculation_replay.py --save-answers`),
which run.sh replays at the card's own step times: the real weights do not fit.

    python scripts/cuda/prepare.py          # then: scripts/cuda/run.sh on the lent machine
"""

from __future__ import annotations

import argparse
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHARED_SMOLLM2 = ROOT.parent / "shared" / "models" / "smollm2-135m-instruct-4bit"
MLX_VERSION = "0.32.4"
# The lent machine's image already has numpy, transformers, tokenizers, jinja2, pytest, xdist,
# hypothesis, prometheus-client and the NVIDIA libraries (see /work/.library/device/KINDS.md).
WHEELS = [
    f"mlx=={MLX_VERSION}",
    "mlx-lm==0.32.2",
    "quart==0.22.0",
    "hypercorn==0.18.0",
    "quart-schema==0.25.0",
    "quart-cors==0.8.0",
    "swagger-ui-py",
    "pydantic==2.14.4",
    "llguidance==1.9.1",
    "openai==3.57.0",
    "anthropic==2.14.0",
    "ollama==0.6.3",
    "platformdirs",
    "jsonschema==4.26.0",
    "schemathesis==4.32.5",
]
IN_IMAGE = {
    "annotated_doc",
    "anyio",
    "attrs",
    "certifi",
    "charset_normalizer",
    "click",
    "filelock",
    "fsspec",
    "h11",
    "hf_xet",
    "huggingface_hub",
    "hypothesis",
    "idna",
    "iniconfig",
    "jinja2",
    "markdown_it_py",
    "markupsafe",
    "mdurl",
    "numpy",
    "packaging",
    "pluggy",
    "prometheus_client",
    "protobuf",
    "pygments",
    "pytest",
    "pyyaml",
    "regex",
    "requests",
    "rich",
    "safetensors",
    "sentencepiece",
    "shellingham",
    "sortedcontainers",
    "tokenizers",
    "tqdm",
    "transformers",
    "typer",
    "typing_extensions",
    "urllib3",
    "werkzeug",
    "aiofiles",
}
PLATFORMS = [
    "manylinux_2_35_x86_64",
    "manylinux_2_34_x86_64",
    "manylinux_2_31_x86_64",
    "manylinux_2_28_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
]
FATBIN_MAGIC, CUBIN = 0xBA55ED50, 2


def download(specs: list[str], dest: Path, deps: bool) -> None:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "-q",
        "--only-binary=:all:",
        "--python-version",
        "3.12",
        "--implementation",
        "cp",
        "-d",
        str(dest),
    ]
    cmd += [f"--platform={p}" for p in PLATFORMS] + ([] if deps else ["--no-deps"]) + specs
    subprocess.run(cmd, check=True)


def keep_one_arch(library: Path, arch: int) -> int:
    """Zero every fatbin entry of `library` but the `arch` cubin; return the bytes zeroed."""
    data = bytearray(library.read_bytes())
    sections = subprocess.run(
        ["readelf", "-SW", str(library)], capture_output=True, text=True, check=True
    ).stdout
    line = next(row for row in sections.splitlines() if " .nv_fatbin " in row)
    _, _, _, offset, size = line.split("]")[1].split()[:5]
    start, end = int(offset, 16), int(offset, 16) + int(size, 16)
    zeroed, pos = 0, start
    while pos < end:
        magic, _, header_size, body_size = struct.unpack_from("<IHHQ", data, pos)
        if magic != FATBIN_MAGIC:
            pos += 8
            continue
        entry, body_end = pos + header_size, pos + header_size + body_size
        while entry < body_end:
            kind, _, entry_header, entry_size = struct.unpack_from("<HHIQ", data, entry)
            entry_arch = struct.unpack_from("<I", data, entry + 28)[0]
            if (kind, entry_arch) != (CUBIN, arch):
                payload = slice(entry + entry_header, entry + entry_header + entry_size)
                data[payload] = bytes(entry_size)
                zeroed += entry_size
            entry += entry_header + entry_size
        pos = body_end
    library.write_bytes(data)
    return zeroed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90, help="the lent card's SM version")
    parser.add_argument(
        "--no-answers",
        dest="answers",
        action="store_false",
        help="skip recording SmolLM2's greedy answers (a minute of this CPU), which run.sh "
        "replays at the card's step times (issue 60)",
    )
    args = parser.parse_args()
    out = ROOT / ".whl"
    shutil.rmtree(out, ignore_errors=True)
    (out / "deps").mkdir(parents=True)
    download(WHEELS, out / "deps", deps=True)
    for wheel in (out / "deps").glob("*.whl"):
        if wheel.name.split("-")[0].lower() in IN_IMAGE:
            wheel.unlink()
    with tempfile.TemporaryDirectory() as tmp:
        download([f"mlx-cuda-13=={MLX_VERSION}"], Path(tmp), deps=False)
        unpacked = Path(tmp) / "unpacked"
        with zipfile.ZipFile(next(Path(tmp).glob("mlx_cuda_13-*.whl"))) as wheel:
            wheel.extractall(unpacked)
        zeroed = keep_one_arch(unpacked / "mlx" / "lib" / "libmlx.so", args.arch)
        with tarfile.open(out / "mlx_cuda_13.tar.xz", "w:xz", preset=6) as tar:
            for item in sorted(unpacked.iterdir()):
                tar.add(item, arcname=item.name)
    if SHARED_SMOLLM2.is_dir():
        (out / "smollm2").mkdir()
        for name in (
            "config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "special_tokens_map.json",
            "generation_config.json",
        ):
            shutil.copyfile(SHARED_SMOLLM2 / name, out / "smollm2" / name)
        if args.answers:  # the real model's answers, for speculation_replay.py there
            replay = ROOT / "benchmarks" / "speculation_replay.py"
            subprocess.run(
                [sys.executable, str(replay), "--model", str(SHARED_SMOLLM2), "--runs", "1"]
                + ["--save-answers", str(out / "speculation_answers.json")],
                check=True,
                stdout=subprocess.DEVNULL,
            )
    total = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f".whl: {total / 2**20:.1f} MiB ({zeroed / 2**20:.0f} MiB of other GPUs' kernels zeroed)")


if __name__ == "__main__":
    main()
