"""Launch at login: a LaunchAgent plist on macOS, an XDG autostart entry on Linux."""

from __future__ import annotations

import plistlib
import sys
from pathlib import Path

LABEL = "com.mlxserve.menubar"


def login_item_path(home: Path | None = None, platform: str = sys.platform) -> Path:
    home = home or Path.home()
    if platform == "darwin":
        return home / "Library" / "LaunchAgents" / f"{LABEL}.plist"
    return home / ".config" / "autostart" / "mlxserve-menubar.desktop"


def command() -> list[str]:
    return [sys.executable, "-m", "menubar"]


def enabled(home: Path | None = None, platform: str = sys.platform) -> bool:
    return login_item_path(home, platform).exists()


def enable(home: Path | None = None, platform: str = sys.platform) -> Path:
    path = login_item_path(home, platform)
    path.parent.mkdir(parents=True, exist_ok=True)
    if platform == "darwin":
        plist = {"Label": LABEL, "ProgramArguments": command(), "RunAtLoad": True}
        path.write_bytes(plistlib.dumps(plist))
    else:
        path.write_text(
            "[Desktop Entry]\nType=Application\nName=mlxserve\n"
            f"Exec={' '.join(command())}\nX-GNOME-Autostart-enabled=true\n"
        )
    return path


def disable(home: Path | None = None, platform: str = sys.platform) -> None:
    login_item_path(home, platform).unlink(missing_ok=True)


def toggle(home: Path | None = None, platform: str = sys.platform) -> bool:
    """Flip the setting; returns whether it is now on."""
    if enabled(home, platform):
        disable(home, platform)
        return False
    enable(home, platform)
    return True
