"""The menu as data: what each UI (rumps, Tk) renders from a controller snapshot, and the
actions its items trigger. Keeping it here keeps the two UIs identical and testable."""

from __future__ import annotations

from dataclasses import dataclass, field

from .controller import Snapshot

SYMBOLS = {"stopped": "○", "starting": "◌", "loading": "◌", "ready": "●", "error": "⚠"}


@dataclass(frozen=True)
class Item:
    title: str
    action: str | None = None  # "start", "stop", "switch:NAME", "copy_url", ... (see actions)
    enabled: bool = True
    checked: bool = False
    children: tuple[Item, ...] = field(default_factory=tuple)


SEPARATOR = Item("-")


def title(snapshot: Snapshot) -> str:
    """The menu bar's text: a state symbol and, while running, the model."""
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
            children=tuple(
                Item(
                    m.name, f"switch:{m.name}", enabled=snapshot.state == "ready", checked=m.loaded
                )
                for m in snapshot.models
            )
            or (Item("(start the server to list models)", enabled=False),),
        ),
        SEPARATOR,
        Item(snapshot.url, enabled=False),
        Item("Copy endpoint URL", "copy_url"),
        Item(
            f"{snapshot.tokens_per_second:.1f} tokens/s, {snapshot.queue} in queue",
            enabled=False,
        ),
        Item("Open logs", "open_logs"),
        Item("Launch at login", "toggle_login", checked=launch_at_login),
        SEPARATOR,
        Item("Quit", "quit"),
    ]
    return items


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
