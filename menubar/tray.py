"""The menu in a small Tk window: the Linux (and fallback) rendering of the same menu the macOS
app shows in the menu bar. Tk comes with most Pythons (Debian's: python3-tk), so it runs
anywhere with a display, Xvfb too."""

from __future__ import annotations

import queue
import shutil
import subprocess
import sys

from . import actions, login, menu
from .controller import PortConflict, ServerController, Snapshot


class NoWindow(RuntimeError):
    """Tk cannot open a window here (no display, or no Tk for this Python); the message says
    what to do instead."""


def _import_tkinter():
    try:
        import tkinter
    except ImportError as error:
        if sys.platform == "darwin":
            fix = "brew install python-tk, or use python.org's Python"
        elif "libtk" in str(error) or "libtcl" in str(error):
            fix = "apt-get install libtk8.6"
        else:
            fix = "apt-get install python3-tk"
        raise NoWindow(f"this Python has no Tk for the menu window ({error}): {fix}") from None
    return tkinter


class TkTray:
    """The window is one menu button titled like the menu bar item; its menu is rebuilt from
    each snapshot (on Tk's thread: the controller publishes from its polling thread)."""

    def __init__(self, controller: ServerController, root=None):
        tk = _import_tkinter()
        self.tk = tk
        self.controller = controller
        try:
            self.root = root or tk.Tk()
        except tk.TclError as error:
            if "display" not in str(error):
                raise NoWindow(f"Tk cannot open the menu window: {error}") from None
            raise NoWindow(
                f"no display to show the menu on ({error}); on a server use the HTTP API,"
                " or run the menu under Xvfb: xvfb-run python -m menubar"
            ) from None
        self.root.title("mlxserve")
        self.root.attributes("-topmost", True)
        self.button = tk.Menubutton(self.root, relief="raised", padx=12, pady=4, width=28)
        self.menu = tk.Menu(self.button, tearoff=False)
        self.button["menu"] = self.menu
        self.button.pack(fill="both", expand=True)
        self._snapshots: queue.SimpleQueue[Snapshot] = queue.SimpleQueue()
        self._variables: list = []  # Tk variables of check items, kept alive
        controller.on_change(self._snapshots.put)
        self.render(controller.snapshot)
        self.root.after(100, self._drain)

    # ---- rendering ----------------------------------------------------------------------------

    def render(self, snapshot: Snapshot) -> None:
        self.button.configure(text=menu.title(snapshot))
        self._variables.clear()
        self._fill(self.menu, menu.build(snapshot, login.enabled()))

    def _fill(self, target, items) -> None:
        tk = self.tk
        target.delete(0, "end")
        for item in items:
            if item == menu.SEPARATOR:
                target.add_separator()
            elif item.children:
                submenu = tk.Menu(target, tearoff=False)
                self._fill(submenu, item.children)
                target.add_cascade(label=item.title, menu=submenu)
            elif item.checked or item.checkable:
                variable = tk.BooleanVar(value=item.checked)
                self._variables.append(variable)
                target.add_checkbutton(
                    label=item.title,
                    variable=variable,
                    command=self._command(item.action),
                    state="normal" if item.enabled else "disabled",
                )
            else:
                target.add_command(
                    label=item.title,
                    command=self._command(item.action),
                    state="normal" if item.enabled and item.action else "disabled",
                )

    def _command(self, action: str | None):
        return (lambda: self.perform(action)) if action else None

    def _drain(self) -> None:
        latest = None
        while not self._snapshots.empty():
            latest = self._snapshots.get()
        if latest is not None:
            self.render(latest)
        if self.root.winfo_exists():
            self.root.after(100, self._drain)

    # ---- what the tests and the user drive ------------------------------------------------------

    def perform(self, action: str) -> None:
        actions.perform(action, self.controller, self)

    def labels(self, target=None) -> list[str]:
        target = target or self.menu
        end = target.index("end")
        return [
            target.entrycget(i, "label") if target.type(i) != "separator" else "-"
            for i in range(0 if end is None else end + 1)
        ]

    def submenu(self, label: str, parent=None):
        """The cascade `label` of `parent` (the top menu by default)."""
        parent = parent or self.menu
        return self.root.nametowidget(parent.entrycget(self.labels(parent).index(label), "menu"))

    def run(self) -> None:
        self.root.mainloop()

    # ---- the Shell the actions need -------------------------------------------------------------

    def copy(self, text: str) -> None:
        self.root.clipboard_clear()
        self.root.clipboard_append(text)

    def open_path(self, path: str) -> None:
        opener = "open" if sys.platform == "darwin" else shutil.which("xdg-open")
        if opener:
            subprocess.Popen([opener, path])

    def ask_use_running(self, conflict: PortConflict) -> bool | None:
        from tkinter import messagebox

        return messagebox.askyesnocancel(
            "mlxserve",
            f"An mlxserve server already runs on port {conflict.port}.\n\n"
            f"Yes: use it. No: start another on port {conflict.free_port}.",
        )

    def ask_stop_on_quit(self) -> bool | None:
        from tkinter import messagebox

        return messagebox.askyesnocancel("mlxserve", "Stop the server too?")

    def quit(self) -> None:
        self.root.destroy()
