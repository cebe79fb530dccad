"""The menu as data: what each UI (rumps, Tk) renders from a controller snapshot, and the
actions its items trigger. Keeping it here keeps the two UIs identical and testable."""

from __future__ import annotations

from dataclasses import dataclass, field

from .controller import ModelChoice, Snapshot

SYMBOLS = {"stopped": "○", "starting": "◌", "loading": "◌", "ready": "●", "error": "⚠"}
# A served model's mark before its name; a model not in memory has none.
MODEL_SYMBOLS = {"ready": "●", "starting": "◌", "loading": "◌", "error": "⚠"}


@dataclass(frozen=True)
class Item:
    title: str
    # "start", "stop", "load:NAME", "unload:NAME", "pin:NAME", "unpin:NAME", "copy_url", ...
    # (see actions)
    action: str | None = None
    enabled: bool = True
    checked: bool = False
    checkable: bool = False  # a toggle: rendered with room for a check mark even when unchecked
    children: tuple[Item, ...] = field(default_factory=tuple)


SEPARATOR = Item("-")


def title(snapshot: Snapshot) -> str:
    """The menu bar's text: a state symbol and, while running, the default model."""
    symbol = SYMBOLS[snapshot.state]
    if snapshot.state in ("ready", "loading") and snapshot.model:
        return f"{symbol} {snapshot.model}"
    return f"{symbol} mlxserve"


def build(snapshot: Snapshot, launch_at_login: bool) -> list[Item]:
    running = snapshot.state in ("starting", "loading", "ready")
    items = [Item(_status_line(snapshot), enabled=False)]
    if snapshot.error:
        items.append(Item(f"Error: {snapshot.error}", enabled=False))
    items += [
        Item("Start server", "start", enabled=not running),
        Item("Stop server", "stop", enabled=running and not snapshot.attached),
        SEPARATOR,
        Item(
            "Models",
            children=tuple(model_menu(m, snapshot) for m in snapshot.models)
            or (Item("(start the server to list models)", enabled=False),),
        ),
    ]
    if snapshot.memory_budget_bytes and snapshot.state != "stopped":
        used, budget = snapshot.models_memory_bytes, snapshot.memory_budget_bytes
        items.append(Item(f"Models: {size_text(used)} of {size_text(budget)}", enabled=False))
    items += [
        SEPARATOR,
        Item(snapshot.url, enabled=False),
        Item("Copy endpoint URL", "copy_url"),
        Item(
            f"{snapshot.tokens_per_second:.1f} tokens/s, {snapshot.queue} in queue",
            enabled=False,
        ),
        Item("Open logs", "open_logs"),
        Item("Launch at login", "toggle_login", checked=launch_at_login, checkable=True),
        SEPARATOR,
        Item("Quit", "quit"),
    ]
    return items


KIND_ROLES = {"embed": "embeddings", "rerank": "reranker"}  # what a model is, where not chat


def model_title(model: ModelChoice) -> str:
    """Its state's mark (none when not in memory), its name, its roles: "● name (default)",
    "name (embeddings, pinned)", "● name (images, default)"."""
    mark = MODEL_SYMBOLS.get(model.state or "")
    roles = [KIND_ROLES[model.kind]] if model.kind in KIND_ROLES else []
    roles += ["images"] if model.vision else []
    roles += [role for role, on in (("default", model.default), ("pinned", model.pinned)) if on]
    text = f"{mark} {model.name}" if mark else model.name
    return f"{text} ({', '.join(roles)})" if roles else text


def model_menu(model: ModelChoice, snapshot: Snapshot) -> Item:
    """One model's submenu: load it (or make it the default), unload it, pin it, and what it
    takes."""
    # The server answers admin requests while its default model loads or after it failed.
    can_act = snapshot.state in ("loading", "ready", "error")
    name = model.name
    on_its_way = model.loaded or model.state in ("starting", "loading")
    if model.kind in KIND_ROLES:  # an embedding model or a reranker is loaded, never the default
        load = Item("Load", f"load:{name}", enabled=can_act and not on_its_way)
    elif model.default and on_its_way:
        load = Item("Make default", enabled=False, checked=True, checkable=True)
    else:
        load = Item("Make default" if on_its_way else "Load", f"load:{name}", enabled=can_act)
    pin = Item(
        "Unpin" if model.pinned else "Pin",
        f"{'unpin' if model.pinned else 'pin'}:{name}",
        # An unpin always; a pin once the server serves it (so that the check shows).
        enabled=can_act and (model.pinned or model.state is not None),
        checked=model.pinned,
        checkable=True,
    )
    children = [load, Item("Unload", f"unload:{name}", enabled=can_act and model.loaded), pin]
    facts = []
    if model.loaded and model.memory_bytes:
        facts.append(f"{size_text(model.memory_bytes)} in memory")
    elif model.state in ("starting", "loading"):
        facts.append("Loading")
    elif model.size_bytes:
        facts.append(f"{size_text(model.size_bytes)} on disk")
    if model.queue:
        facts.append(f"{model.queue} in queue")
    if model.base_model:
        facts.append(f"Adapter on {model.base_model}")
    if model.state == "error" and model.error:
        facts.append(f"Error: {model.error}")
    if facts:
        children += [SEPARATOR, *(Item(fact, enabled=False) for fact in facts)]
    return Item(model_title(model), children=tuple(children))


def size_text(count: int) -> str:
    """Bytes as people read them (powers of 1000, as the server's messages)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count / 1e3:.1f} KB"


def _status_line(snapshot: Snapshot) -> str:
    state = snapshot.state.capitalize()
    if snapshot.model and snapshot.state in ("ready", "loading"):
        return f"{state}: {snapshot.model}" + (" (attached)" if snapshot.attached else "")
    return state


def find(items: list[Item], title_: str) -> Item | None:
    """The item with this title, submenus included (for tests and scripts)."""
    for item in items:
        if item.title == title_:
            return item
        found = find(list(item.children), title_)
        if found is not None:
            return found
    return None


def find_model(items: list[Item], name: str) -> Item | None:
    """The submenu of the model `name` in the Models menu, whatever marks its title has."""
    models = find(items, "Models")
    for item in models.children if models is not None else ():
        if item.children and _name_in_title(item.title) == name:
            return item
    return None


def _name_in_title(text: str) -> str:
    mark, _, rest = text.partition(" ")
    if mark not in MODEL_SYMBOLS.values():
        rest = text
    return rest.split(" (", 1)[0]
