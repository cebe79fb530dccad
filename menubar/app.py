"""The macOS menu bar app (rumps): renders `menu.build` and forwards clicks to `actions`.

Optional: `pip install "mlxserve[menubar]"` brings rumps on macOS. Elsewhere `python -m menubar`
uses the Tk window (tray.py) with the same menu.
"""

from __future__ import annotations

import subprocess

import rumps

from . import actions, login, menu
from .controller import PortConflict, ServerController, Snapshot


class MenubarApp(rumps.App):
    def __init__(self, controller: ServerController):
        super().__init__("mlxserve", title=menu.title(controller.snapshot), quit_button=None)
        self.controller = controller
        self._latest: Snapshot | None = controller.snapshot
        # The controller publishes from its polling thread; AppKit wants the main thread.
        controller.on_change(self._remember)
        self._timer = rumps.Timer(self._render_latest, 0.5)
        self._timer.start()

    def _remember(self, snapshot: Snapshot) -> None:
        self._latest = snapshot

    def _render_latest(self, _timer) -> None:
        snapshot, self._latest = self._latest, None
        if snapshot is None:
            return
        self.title = menu.title(snapshot)
        self.menu.clear()
        self.menu = [self._item(i) for i in menu.build(snapshot, login.enabled())]

    def _item(self, item: menu.Item):
        if item == menu.SEPARATOR:
            return rumps.separator
        callback = None
        if item.action and item.enabled:
            action = item.action
            callback = lambda _sender: actions.perform(action, self.controller, self)  # noqa: E731
        entry = rumps.MenuItem(item.title, callback=callback)
        entry.state = 1 if item.checked else 0
        for child in item.children:
            entry.add(self._item(child))
        return entry

    # ---- the Shell the actions need -------------------------------------------------------------

    def copy(self, text: str) -> None:
        subprocess.run(["pbcopy"], input=text.encode(), check=False)

    def open_path(self, path: str) -> None:
        subprocess.Popen(["open", path])

    def ask_use_running(self, conflict: PortConflict) -> bool | None:
        answer = rumps.alert(
            "mlxserve",
            f"An mlxserve server already runs on port {conflict.port}.",
            ok="Use it",
            cancel="Cancel",
            other=f"Start on port {conflict.free_port}",
        )
        return {1: True, -1: False}.get(answer)

    def ask_stop_on_quit(self) -> bool | None:
        answer = rumps.alert(
            "Quit mlxserve",
            "Stop the server too?",
            ok="Stop and quit",
            cancel="Cancel",
            other="Quit, keep it running",
        )
        return {1: True, -1: False}.get(answer)

    def quit(self) -> None:
        rumps.quit_application()
