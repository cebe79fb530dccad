"""mlx-lm's text-only modules (tokenizer wrapper, detokenizers, tool parsers) in the front
process, without MLX: mlx-lm's package `__init__` imports its generation code, which loads MLX,
so the front registers the package bare (its folder, none of its `__init__`) before anything
imports it. The engine process pickles its tokenizer; the front unpickles it through these."""

from __future__ import annotations

import importlib.util
import sys
import types


def use_text_only_mlx_lm() -> None:
    """Make `import mlx_lm.<module>` load that module alone. A process that already imported
    mlx-lm (one serving in a single process) keeps it as it is."""
    if "mlx_lm" in sys.modules:
        return
    spec = importlib.util.find_spec("mlx_lm")
    if spec is None or not spec.submodule_search_locations:
        return
    package = types.ModuleType("mlx_lm")
    package.__path__ = list(spec.submodule_search_locations)
    package.__spec__ = spec
    package.__file__ = spec.origin
    sys.modules["mlx_lm"] = package
