"""What a menu item does, the same in every UI; the UI supplies the few platform pieces
(clipboard, opening a file, asking the user) through the `Shell` protocol."""

from __future__ import annotations

import threading
from typing import Protocol

from . import login
from .controller import PortConflict, ServerController


class Shell(Protocol):
    def copy(self, text: str) -> None: ...
    def open_path(self, path: str) -> None: ...
    def ask_use_running(self, conflict: PortConflict) -> bool | None:
        """Port taken by an mlxserve: True = use it, False = start on another port, None =
        cancel. (Taken by something else: the UI is only told, and another port is used.)"""
        ...

    def ask_stop_on_quit(self) -> bool | None:
        """True = stop the server and quit, False = quit and leave it running, None = cancel."""
        ...

    def quit(self) -> None: ...


def perform(action: str, controller: ServerController, shell: Shell) -> threading.Thread | None:
    """Do what the item `action` says. A model's action (load, unload, pin, unpin) runs on a
    thread of its own, returned: a load can wait on the server for a minute (room being made,
    an adapter's base loading) and the UI must not; its outcome shows in the snapshots."""
    verb, _, model = action.partition(":")
    if model and verb in ("load", "unload", "pin", "unpin"):
        worker = threading.Thread(
            target=model_action, args=(verb, model, controller), name=f"mlxserve-menubar-{verb}"
        )
        worker.daemon = True
        worker.start()
        return worker
    if action == "start":
        start(controller, shell)
    elif action == "stop":
        controller.stop()
    elif action == "copy_url":
        shell.copy(controller.url + "/v1")
    elif action == "open_logs":
        shell.open_path(str(controller.log_path))
    elif action == "toggle_login":
        login.toggle()
    elif action == "quit":
        quit_app(controller, shell)
    else:
        raise ValueError(f"unknown menu action {action!r}")
    return None


def model_action(verb: str, model: str, controller: ServerController) -> bool:
    """load, unload, pin or unpin `model`; False when the server refused (said in the
    snapshot's error)."""
    if verb == "load":
        return controller.load(model)
    if verb == "unload":
        return controller.unload(model)
    return controller.pin(model, verb == "pin")


def start(controller: ServerController, shell: Shell) -> None:
    conflict = controller.port_conflict()
    if conflict is None:
        controller.start()
        return
    if conflict.mlxserve:
        answer = shell.ask_use_running(conflict)
        if answer is None:
            return
        if answer:
            controller.attach()
            return
    controller.use_port(conflict.free_port)
    controller.start()


def quit_app(controller: ServerController, shell: Shell) -> None:
    if controller.process is not None and controller.process.poll() is None:
        answer = shell.ask_stop_on_quit()
        if answer is None:
            return
        if answer:
            controller.stop()
    controller.stop_polling()
    shell.quit()
