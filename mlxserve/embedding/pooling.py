"""How a model's last hidden states become one vector an input: as its sentence-transformers
files say (`modules.json`, then its Pooling module's `config.json` and a Normalize module),
else the usual choice for its kind (mean over an encoder's tokens, a decoder's last token)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx

MODES = ("cls", "mean", "max", "mean_sqrt_len", "last")
_CONFIG_KEYS = {  # sentence-transformers' Pooling config -> mode
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
    "pooling_mode_lasttoken": "last",
}


class PoolingError(ValueError):
    """A sentence-transformers pipeline this server cannot run (the message says which part)."""


@dataclass(frozen=True)
class Pooling:
    mode: str = "mean"
    normalize: bool = False

    @classmethod
    def of_folder(cls, folder: Path, default_mode: str) -> Pooling:
        """The folder's own pooling, or `default_mode` without normalisation where it has no
        sentence-transformers files."""
        modules_file = folder / "modules.json"
        if not modules_file.is_file():
            return cls(default_mode, False)
        modules = json.loads(modules_file.read_text())
        mode, normalize = default_mode, False
        for module in modules:
            kind = str(module.get("type", "")).rsplit(".", 1)[-1]
            if kind == "Pooling":
                mode = _mode_of(folder / module.get("path", ""), default_mode)
            elif kind == "Normalize":
                normalize = True
            elif kind not in ("Transformer", "Pooling"):
                raise PoolingError(
                    f"its sentence-transformers pipeline has a {kind} module, which this server "
                    "does not run (it runs Transformer, Pooling and Normalize)"
                )
        return cls(mode, normalize)

    def __call__(self, hidden: mx.array, lengths: mx.array) -> mx.array:
        """(B, L, D) hidden states of right-padded rows of `lengths` tokens -> (B, D)."""
        positions = mx.arange(hidden.shape[1])[None, :]
        mask = (positions < lengths[:, None]).astype(hidden.dtype)[..., None]
        if self.mode == "cls":
            pooled = hidden[:, 0]
        elif self.mode == "last":
            pooled = hidden[mx.arange(hidden.shape[0]), lengths - 1]
        elif self.mode == "max":
            pooled = mx.where(mask > 0, hidden, mx.finfo(hidden.dtype).min).max(axis=1)
        else:
            total = (hidden * mask).sum(axis=1)
            count = lengths.astype(hidden.dtype)[:, None]
            pooled = total / (mx.sqrt(count) if self.mode == "mean_sqrt_len" else count)
        if self.normalize:
            pooled = normalized(pooled)
        return pooled


def normalized(vectors: mx.array) -> mx.array:
    """Each row scaled to length 1 (a zero row stays zero)."""
    norms = mx.linalg.norm(vectors.astype(mx.float32), axis=-1, keepdims=True)
    return (vectors / mx.maximum(norms, 1e-12)).astype(vectors.dtype)


def _mode_of(folder: Path, default_mode: str) -> str:
    config_file = folder / "config.json"
    if not config_file.is_file():
        return default_mode
    config = json.loads(config_file.read_text())
    chosen = [mode for key, mode in _CONFIG_KEYS.items() if config.get(key)]
    if len(chosen) > 1:
        raise PoolingError(
            f"its Pooling module joins {' and '.join(chosen)} pooling; this server pools one way"
        )
    return chosen[0] if chosen else default_mode
