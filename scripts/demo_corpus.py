"""Python beyond the standard library for the demo model: permissively licensed packages from PyPI.

Each package below is fetched as its pure-Python wheel at a pinned version (`pip download`, no
dependencies), kept only where its metadata declares a permissive licence (MIT, BSD, Apache, ISC,
PSF; anything naming the GPL is dropped), and its `.py` files written to `build/demo-corpus/`:

- deduplicated by content (vendored copies of one module across packages are kept once);
- decontaminated: a file that repeats the standard library's held-out files (a backport, a
  vendored module) is dropped, so the card's held-out infills stay unseen;
- each package capped in bytes (files chosen by a hash of their path), so a few large packages do
  not drown the rest.

demo_data.corpus_files() reads the folder back; `manifest.json` records each package's version,
licence and what was kept.

    python scripts/demo_corpus.py [--out build/demo-corpus]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import tempfile
import zipfile
from email.parser import Parser
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from demo_data import MAX_FILE_BYTES, split_files  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "build" / "demo-corpus"
# Pure-Python wheels of widely used, permissively licensed projects: web, CLI, parsing, tooling,
# data and ML code, so the model reads Python written the ways editors meet it.
PACKAGES = {
    "alembic": "1.20.1",
    "anyio": "4.16.0",
    "arrow": "1.4.0",
    "attrs": "26.1.0",
    "autopep8": "2.3.2",
    "beautifulsoup4": "4.15.0",
    "black": "26.10.1",
    "bleach": "6.4.0",
    "boltons": "26.2.0",
    "boto3": "1.44.8",
    "bottle": "0.13.4",
    "cachetools": "8.0.2",
    "cattrs": "26.2.1",
    "celery": "5.7.0",
    "click": "8.5.1",
    "datasets": "5.2.0",
    "diskcache": "5.6.3",
    "django": "6.1.3",
    "fabric": "3.2.3",
    "factory-boy": "3.3.3",
    "falcon": "4.4.0",
    "fastapi": "0.165.0",
    "flake8": "7.5.0",
    "flask": "3.1.3",
    "gunicorn": "27.0.1",
    "h11": "0.16.0",
    "hatchling": "1.33.0",
    "httpx": "0.28.1",
    "idna": "3.20",
    "invoke": "3.0.3",
    "ipython": "9.18.1",
    "isort": "9.0.2",
    "jedi": "0.20.1",
    "jinja2": "3.1.6",
    "jsonschema": "4.26.0",
    "kombu": "5.7.0",
    "loguru": "0.7.3",
    "mako": "1.4.3",
    "markdown": "3.11.3",
    "marshmallow": "4.4.0",
    "mistune": "3.4.0",
    "mlx-lm": "0.32.2",
    "more-itertools": "11.2.1",
    "mypy": "2.4.1",
    "networkx": "3.7",
    "packaging": "26.4",
    "parso": "0.8.7",
    "pexpect": "4.9.0",
    "pip": "26.3",
    "platformdirs": "4.14.8",
    "pluggy": "1.7.0",
    "poetry-core": "2.5.0",
    "prompt-toolkit": "3.0.53",
    "pycodestyle": "2.15.0",
    "pydantic": "2.14.4",
    "pyflakes": "4.1.0",
    "pygments": "2.21.0",
    "pyparsing": "3.3.3",
    "pytest": "9.2.0",
    "redis": "8.1.0",
    "requests": "2.34.2",
    "rich": "15.0.0",
    "scrapy": "2.19.0",
    "sphinx": "9.1.1",
    "sqlparse": "0.6.1",
    "starlette": "1.10.0",
    "structlog": "26.1.0",
    "sympy": "1.14.0",
    "tenacity": "9.2.1",
    "toolz": "1.2.0",
    "transformers": "5.24.0",
    "trio": "0.35.0",
    "twisted": "26.10.0",
    "typer": "0.29.2",
    "urllib3": "2.8.0",
    "uvicorn": "0.54.0",
    "virtualenv": "21.15.11",
    "websockets": "17.4",
    "werkzeug": "3.1.9",
}
PERMISSIVE = re.compile(r"\b(MIT|BSD|Apache|ISC|PSF|Python Software Foundation)\b", re.I)
COPYLEFT = re.compile(r"GPL|Mozilla|MPL", re.I)
MAX_PACKAGE_BYTES = 2_200_000  # a package's share: the largest would otherwise be a third
MAX_MEAN_LINE = 100  # characters: longer on average is data (tables, minified), not code
DISTINCT_LINE = 25  # characters, stripped: a line this long is the file's own, not boilerplate
CONTAMINATED_SHARE = 0.2  # of a file's distinct lines found in the held-out stdlib: dropped


def licence(metadata: str) -> str | None:
    """The permissive licence a wheel's METADATA declares, or None (none declared, or copyleft)."""
    fields = Parser().parsestr(metadata)
    declared = [
        *(fields.get_all("License-Expression") or []),
        *(fields.get_all("License") or []),
        *(c for c in fields.get_all("Classifier") or [] if c.startswith("License ::")),
    ]
    declared = [d.strip() for d in declared if d and d.strip()]
    if not declared or any(COPYLEFT.search(d) for d in declared):
        return None
    found = next((PERMISSIVE.search(d) for d in declared if PERMISSIVE.search(d)), None)
    return found.group(1) if found else None


def distinct_lines(text: str) -> set[str]:
    return {s for line in text.split("\n") if len(s := line.strip()) >= DISTINCT_LINE}


def looks_like_code(text: str) -> bool:
    lines = text.split("\n")
    return bool(text.strip()) and len(text) / max(1, len(lines)) <= MAX_MEAN_LINE


def wheel_sources(wheel: Path) -> tuple[str | None, list[tuple[str, str]]]:
    """(licence, [(path in the wheel, text)]) of a wheel's Python files."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
        found = licence(archive.read(meta).decode("utf-8", errors="replace"))
        files = []
        for name in sorted(names):
            info = archive.getinfo(name)
            if name.endswith(".py") and 0 < info.file_size <= MAX_FILE_BYTES:
                files.append((name, archive.read(name).decode("utf-8", errors="replace")))
    return found, files


def select(
    packages: dict[str, tuple[str | None, list[tuple[str, str]]]],
    stdlib_texts: list[str],
    held_out_texts: list[str],
    cap: int = MAX_PACKAGE_BYTES,
) -> tuple[dict[str, list[tuple[str, str]]], dict[str, dict]]:
    """The files kept per package, and a report per package (see the module's docstring)."""
    seen = {hashlib.sha1(t.encode()).digest() for t in stdlib_texts}
    held_lines = set().union(*map(distinct_lines, held_out_texts)) if held_out_texts else set()
    kept: dict[str, list[tuple[str, str]]] = {}
    report: dict[str, dict] = {}
    for package, (found, files) in sorted(packages.items()):
        counts = {"licence": found, "files": len(files), "duplicates": 0, "contaminated": 0}
        counts.update(not_code=0, over_cap=0, kept=0, bytes=0)
        report[package] = counts
        if found is None:
            continue
        chosen = []
        for name, text in sorted(files, key=lambda f: hashlib.sha1(f[0].encode()).digest()):
            digest = hashlib.sha1(text.encode()).digest()
            lines = distinct_lines(text)
            if digest in seen:
                counts["duplicates"] += 1
            elif not looks_like_code(text):
                counts["not_code"] += 1
            elif lines and len(lines & held_lines) >= CONTAMINATED_SHARE * len(lines):
                counts["contaminated"] += 1
            elif counts["bytes"] + len(text) > cap:
                counts["over_cap"] += 1
            else:
                seen.add(digest)
                chosen.append((name, text))
                counts["kept"] += 1
                counts["bytes"] += len(text)
        kept[package] = sorted(chosen)
    return kept, report


def download(dest: Path) -> list[Path]:
    specs = [f"{name}=={version}" for name, version in PACKAGES.items()]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
        + ["--python-version", "3.12", "--implementation", "py", "--abi", "none"]
        + ["--platform", "any", "-d", str(dest), *specs],
        check=True,
    )
    return sorted(dest.glob("*.whl"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--wheels", type=Path, help="wheels already downloaded (else pip's)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        wheels = sorted(args.wheels.glob("*.whl")) if args.wheels else download(Path(tmp))
        wanted = {n.replace("-", "_").lower(): n for n in PACKAGES}
        packages = {}
        for wheel in wheels:
            name = wanted.get(wheel.name.split("-")[0].lower())
            if name:
                packages[name] = wheel_sources(wheel)
    missing = set(PACKAGES) - set(packages)
    if missing:
        raise SystemExit(f"wheels missing: {sorted(missing)}")
    train, held = split_files()
    kept, report = select(packages, [f.text for f in train + held], [f.text for f in held])
    if args.out.exists():
        for old in sorted(args.out.rglob("*"), reverse=True):
            old.unlink() if old.is_file() else old.rmdir()
    for package, files in kept.items():
        for name, text in files:
            path = args.out / package / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    manifest = {p: {"version": PACKAGES[p], **r} for p, r in report.items()}
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    total = sum(r["bytes"] for r in report.values())
    dropped = [p for p, r in report.items() if r["licence"] is None]
    print(
        f"{sum(r['kept'] for r in report.values()):,} files, {total / 1e6:.1f} MB from "
        f"{len(kept)} packages into {args.out}; no permissive licence declared: {dropped}"
    )


if __name__ == "__main__":
    main()
