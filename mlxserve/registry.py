"""The models this machine has: the Hugging Face cache, LM Studio's folder, `--models-dir` folders.

Only folders mlx-lm can load are listed (a config.json naming an architecture mlx-lm has, and
safetensors weights). Everything is read from the files on disk, nothing is loaded: name, path,
size, quantization, context length, fill-in-the-middle template. Clients pick models by name from
this list only; a path or repo id from a request is never loaded (allow-list).
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .fim import FimError, model_fim
from .vision.folder import has_vision_part, vision_installed

# Config keys architectures use for their context window, most specific first.
CONTEXT_KEYS = (
    "max_position_embeddings",
    "max_sequence_length",
    "seq_length",
    "n_positions",
    "n_ctx",
)


@dataclass(frozen=True)
class ModelEntry:
    name: str  # what clients send as `model`
    path: Path
    source: str  # "default", "command line", "huggingface", "lmstudio", "models-dir"
    size_bytes: int
    quantization: str | None  # "4-bit", "float16", ...
    context_length: int | None
    fim: str | None  # the FIM template's name, None without FIM tokens
    kind: str = "generate"  # or "embed", "rerank" (mlxserve/embedding/kinds.py)
    vision: bool = False  # a vision-language model whose images this install can read

    def card(self) -> dict[str, Any]:
        return {
            "id": self.name,
            "path": str(self.path),
            "source": self.source,
            "size_bytes": self.size_bytes,
            "quantization": self.quantization,
            "context_length": self.context_length,
            "fim": self.fim,
            "kind": self.kind,
            "vision": self.vision,
        }


def context_length_of(config: Mapping[str, Any], folder: Path | None = None) -> int | None:
    """The context window a model folder declares (config.json, else tokenizer_config.json)."""
    for source in (config, config.get("text_config") or {}):
        for key in CONTEXT_KEYS:
            value = source.get(key)
            if isinstance(value, int) and value > 0:
                return value
    if folder is not None:
        tokenizer_config = read_json(folder / "tokenizer_config.json")
        value = tokenizer_config.get("model_max_length")
        if isinstance(value, int) and 0 < value < 10**7:
            return value
    return None


def describe(folder: Path, name: str, source: str) -> ModelEntry | None:
    """A loadable model folder's entry, or None when mlx-lm could not load it."""
    from .embedding.kinds import model_kind  # it reads folders with read_json, below

    config = read_json(folder / "config.json")
    model_type = config.get("model_type")
    kind = model_kind(folder)
    if not isinstance(model_type, str) or (kind == "generate" and not _supported(model_type)):
        return None
    weights = list(folder.glob("*.safetensors"))
    if not weights:
        return None
    return ModelEntry(
        name=name,
        path=folder,
        source=source,
        size_bytes=sum(f.stat().st_size for f in folder.iterdir() if f.is_file()),
        quantization=_quantization(config),
        context_length=context_length_of(config, folder),
        fim=_fim_of(folder, config) if kind == "generate" else None,
        kind=kind,
        vision=kind == "generate" and has_vision_part(config) and vision_installed(),
    )


def huggingface_cache() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
    return home / "hub"


def lmstudio_folders() -> list[Path]:
    """LM Studio's models folder: ~/.lmstudio/models now, ~/.cache/lm-studio/models before."""
    return [Path.home() / ".lmstudio" / "models", Path.home() / ".cache" / "lm-studio" / "models"]


Describe = Callable[[Path, str, str], "ModelEntry | None"]


def scan_huggingface(cache: Path, describe: Describe = describe) -> Iterable[ModelEntry]:
    """Repos in the hub cache (models--org--name), at the snapshot refs/main names."""
    if not cache.is_dir():
        return
    for repo in sorted(cache.glob("models--*")):
        repo_id = repo.name.removeprefix("models--").replace("--", "/")
        snapshot = _snapshot(repo)
        if snapshot is not None:
            entry = describe(snapshot, repo_id, "huggingface")
            if entry is not None:
                yield entry


def scan_folder(root: Path, source: str, describe: Describe = describe) -> Iterable[ModelEntry]:
    """Model folders directly in `root` (named by folder) or one level down (publisher/model)."""
    if not root.is_dir():
        return
    for child in sorted(p for p in root.iterdir() if p.is_dir()):
        if (child / "config.json").exists():
            entry = describe(child, child.name, source)
            if entry is not None:
                yield entry
            continue
        for grandchild in sorted(p for p in child.iterdir() if p.is_dir()):
            entry = describe(grandchild, f"{child.name}/{grandchild.name}", source)
            if entry is not None:
                yield entry


class Registry:
    """The known models, rescanned on demand; names are unique (the first source wins)."""

    def __init__(
        self,
        pinned: Iterable[tuple[Path, str, str]] = (),
        models_dirs: Iterable[Path] = (),
        hf_cache: Path | None = None,
        lmstudio: Iterable[Path] | None = None,
    ):
        """`pinned`: (folder, name, source) always listed first (the default model, --model)."""
        self.pinned = list(pinned)
        self.models_dirs = [Path(d).expanduser().resolve() for d in models_dirs]
        self.hf_cache = hf_cache if hf_cache is not None else huggingface_cache()
        self.lmstudio = list(lmstudio) if lmstudio is not None else lmstudio_folders()
        # Folder -> (what its files looked like, entry): a model's tokenizer.json can be 10 MB,
        # and the menubar app lists models every second.
        self._seen: dict[tuple[Path, str, str], tuple[tuple, ModelEntry | None]] = {}

    def _describe(self, folder: Path, name: str, source: str) -> ModelEntry | None:
        stamp = (
            tuple(
                (f.name, f.stat().st_mtime_ns, f.stat().st_size)
                for f in sorted(folder.iterdir())
                if f.is_file()
            )
            if folder.is_dir()
            else ()
        )
        key = (folder, name, source)
        cached = self._seen.get(key)
        if cached is None or cached[0] != stamp:
            cached = self._seen[key] = (stamp, describe(folder, name, source))
        return cached[1]

    def scan(self) -> list[ModelEntry]:
        found: dict[str, ModelEntry] = {}

        def add(entries: Iterable[ModelEntry | None]) -> None:
            for entry in entries:
                if entry is not None and entry.name not in found:
                    found[entry.name] = entry

        add(self._describe(folder, name, source) for folder, name, source in self.pinned)
        for root in self.models_dirs:
            add(scan_folder(root, "models-dir", self._describe))
        add(scan_huggingface(self.hf_cache, self._describe))
        for root in self.lmstudio:
            add(scan_folder(root, "lmstudio", self._describe))
        return list(found.values())

    def find(self, name: str) -> ModelEntry | None:
        return next((e for e in self.scan() if e.name == name), None)


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from a model folder's file; {} when missing, unreadable or not an object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _supported(model_type: str) -> bool:
    """mlx-lm has a module for the architecture (what mlx_lm.load would import)."""
    name = model_type.replace("-", "_")
    try:
        return importlib.util.find_spec(f"mlx_lm.models.{name}") is not None
    except (ImportError, ValueError):
        return False


def _quantization(config: Mapping[str, Any]) -> str | None:
    quantization = config.get("quantization") or config.get("quantization_config") or {}
    if isinstance(quantization, dict) and quantization.get("bits"):
        return f"{quantization['bits']}-bit"
    dtype = config.get("torch_dtype") or config.get("dtype")
    return dtype if isinstance(dtype, str) else None


def _fim_of(folder: Path, config: Mapping[str, Any]) -> str | None:
    """The FIM template config.json names, else the one the tokenizer's added tokens (special
    tokens live there) match; as loading the model would resolve it."""
    tokenizer = read_json(folder / "tokenizer.json")
    vocab = {t["content"]: t["id"] for t in tokenizer.get("added_tokens", []) if "content" in t}
    try:
        fim = model_fim(vocab, config) if vocab else None
    except FimError:  # loading it will say why
        return None
    return fim.name if fim is not None else None


def _snapshot(repo: Path) -> Path | None:
    ref = repo / "refs" / "main"
    if ref.is_file():
        snapshot = repo / "snapshots" / ref.read_text().strip()
        if snapshot.is_dir():
            return snapshot
    snapshots = sorted((repo / "snapshots").glob("*"), key=lambda p: p.stat().st_mtime)
    return snapshots[-1] if snapshots else None
