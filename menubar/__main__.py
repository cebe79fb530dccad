"""python -m menubar [--port 8080] [--no-start] [-- serve flags...]"""

from __future__ import annotations

import argparse
import sys

from . import actions
from .controller import ServerController
from .tray import NoWindow, TkTray


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m menubar", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--no-start", action="store_true", help="do not start the server")
    parser.add_argument("serve_args", nargs="*", help="flags for `mlxserve serve` (after --)")
    args = parser.parse_args(argv)
    controller = ServerController(args.host, args.port, args.serve_args, args.api_key)
    try:
        ui = _ui(controller)  # before the server starts: no window, no server left behind
    except NoWindow as error:
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return 2
    if not args.no_start:
        actions.start(controller, ui)
    controller.start_polling(1.0)
    ui.run()
    return 0


def _ui(controller: ServerController):
    if sys.platform == "darwin":
        try:
            from .app import MenubarApp

            return MenubarApp(controller)
        except ImportError:  # rumps not installed: the Tk window still works
            pass
    return TkTray(controller)


if __name__ == "__main__":
    sys.exit(main())
