"""Which models a server's settings serve, under which names: plain data (no MLX), read alike by
the engine process's pool and by the front process's stand-in for it."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from ...registry import read_json
from ...settings import Settings

log = logging.getLogger("mlxserve.engine")


def model_id_for(path_or_repo: str) -> str:
    """The name clients use: a local folder's name, or the repo id as given."""
    path = Path(path_or_repo).expanduser()
    return path.name if path.exists() else path_or_repo


@dataclass(frozen=True)
class Adapter:
    path: str  # mlx-lm's adapter folder
    base: str  # the name of the model whose weights it shares


@dataclass
class ServedNames:
    """The default model's name; name -> source of the models named at start; the adapters;
    the pinned names; alias -> target."""

    default_name: str
    configured: dict[str, str] = field(default_factory=dict)
    adapters: dict[str, Adapter] = field(default_factory=dict)
    pinned: tuple[str, ...] = ()
    aliases: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, settings: Settings, default_name: str | None = None) -> ServedNames:
        default_name = default_name or model_id_for(settings.model)
        configured = {model_id_for(source): source for source in settings.models}
        served = {default_name: settings.model, **configured}
        by_source = {source: name for name, source in served.items()}
        adapters = {}
        for name, path in settings.adapters:
            named = read_json(Path(path).expanduser() / "adapter_config.json").get("model")
            base = by_source.get(named, named if named in served else default_name)
            adapters[name] = Adapter(path, base)
        pins = tuple(by_source.get(pin, model_id_for(pin)) for pin in settings.pins)
        names = {*served, *adapters}
        for pin in pins:
            if pin not in names:
                log.warning("--pin %s: no such model is served (--model or --adapter)", pin)
        for alias, target in settings.aliases:
            if target not in names and target not in by_source:
                log.warning(
                    "--alias %s=%s: %s is not served here (--model or --adapter): requests "
                    "for %s load it only with --allow-switch, else the default model answers "
                    "them",
                    alias,
                    target,
                    target,
                    alias,
                )
        return cls(default_name, configured, adapters, pins, dict(settings.aliases))

    def resolve(
        self, name: str | None, residents: dict[str, str], by_source: bool = True
    ) -> str | None:
        """The name of the model a request's `name` routes to: the default for none, an alias's
        target, a model by its name or (`by_source`) its source; None for a model not known.
        `residents`: name -> source of the models with an engine."""
        if not name:
            return self.default_name
        name = self.aliases.get(name, name)
        if name in residents or name in self.adapters or name in self.configured:
            return name
        if not by_source:
            return None
        for resident_name, source in residents.items():
            if name == source:
                return resident_name
        return None


def size_text(count: int) -> str:
    return f"{count / 1e9:.2f} GB" if count >= 1e9 else f"{count / 1e6:.1f} MB"
