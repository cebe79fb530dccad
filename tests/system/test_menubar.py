"""The menubar app: its controller against a real `mlxserve serve` subprocess on the tiny
models, and the Tk rendering of its menu driven under Xvfb (skipped where Xvfb is missing)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from menubar import login, menu
from menubar.controller import ServerController, wait_until

from ..live_server import free_port

SCREENSHOTS = Path(__file__).resolve().parents[2] / "build" / "screenshots"


def controller_for(models: Path, tmp_path: Path) -> ServerController:
    return ServerController(
        port=free_port(),
        serve_args=["--model", str(models / "tiny"), "--models-dir", str(models)],
        log_path=tmp_path / "server.log",
    )


def port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_start_switch_with_a_request_in_flight_then_stop(tiny_models_dir, tmp_path):
    controller = controller_for(tiny_models_dir, tmp_path)
    seen: list[str] = []
    controller.on_change(lambda snapshot: seen.append(snapshot.state))
    controller.start()
    try:
        ready = wait_until(controller, {"ready", "error"})
        assert ready.state == "ready", controller.log_tail()
        assert ready.model == "tiny" and {"tiny", "tiny2"} <= {m.name for m in ready.models}
        assert [m.name for m in ready.models if m.loaded] == ["tiny"]
        body = {"prompt": "def f():\n", "max_tokens": 300, "temperature": 0, "ignore_eos": True}
        answers: list[dict] = []
        request = threading.Thread(
            target=lambda: answers.append(
                httpx.post(controller.url + "/v1/completions", json=body, timeout=120).json()
            )
        )
        request.start()
        deadline = time.monotonic() + 30
        while controller.refresh().queue == 0 and request.is_alive():
            assert time.monotonic() < deadline
            time.sleep(0.005)
        controller.switch("tiny2")
        request.join(120)
        assert answers[0]["model"] == "tiny"  # finished on the model it started on
        assert answers[0]["usage"]["completion_tokens"] == 300
        switched = wait_until(controller, {"ready"}, timeout=60)
        deadline = time.monotonic() + 60
        while switched.model != "tiny2" and time.monotonic() < deadline:
            time.sleep(0.1)
            switched = controller.refresh()
        assert switched.model == "tiny2"
        assert [m.name for m in switched.models if m.loaded] == ["tiny2"]
        assert {"starting", "ready"} <= set(seen)
    finally:
        process = controller.process
        controller.stop()
    assert process.poll() is not None and port_free(controller.port)
    assert controller.snapshot.state == "stopped"


def test_a_crashed_server_is_an_error_with_the_log_tail(tiny_models_dir, tmp_path):
    controller = controller_for(tiny_models_dir, tmp_path)
    controller.start()
    try:
        wait_until(controller, {"ready"})
        os.kill(controller.process.pid, signal.SIGKILL)
        controller.process.wait(10)
        snapshot = controller.refresh()
        assert snapshot.state == "error" and "-9" in snapshot.error
        assert "serving on http://127.0.0.1" in snapshot.log_tail
        assert menu.title(snapshot).startswith("⚠")
        assert menu.find(menu.build(snapshot, False), "Start server").enabled
    finally:
        controller.stop()


def test_port_taken_by_an_mlxserve_offers_it_and_by_something_else_offers_another(
    tiny_models_dir, tmp_path
):
    first = controller_for(tiny_models_dir, tmp_path)
    first.start()
    try:
        wait_until(first, {"ready"})
        second = ServerController(port=first.port, log_path=tmp_path / "second.log")
        conflict = second.port_conflict()
        assert conflict.mlxserve and conflict.free_port != first.port
        second.attach()
        assert second.refresh().state == "ready" and second.snapshot.attached
        stop_item = menu.find(menu.build(second.snapshot, False), "Stop server")
        assert not stop_item.enabled  # an attached server is not ours to stop
    finally:
        first.stop()
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        conflict = ServerController(port=other.getsockname()[1]).port_conflict()
        assert conflict is not None and not conflict.mlxserve


def test_launch_at_login_writes_and_removes_the_login_item(tmp_path):
    path = login.enable(home=tmp_path, platform="darwin")
    assert path.name == "com.mlxserve.menubar.plist" and b"RunAtLoad" in path.read_bytes()
    assert login.toggle(home=tmp_path, platform="darwin") is False and not path.exists()
    desktop = login.enable(home=tmp_path, platform="linux")
    assert "Exec=" in desktop.read_text() and login.enabled(home=tmp_path, platform="linux")


@pytest.fixture
def display():
    if shutil.which("Xvfb") is None:
        pytest.skip("Xvfb is not installed (apt-get install xvfb): no display for the Tk menu")
    # -displayfd: Xvfb takes a display number no other X server holds, and writes it once ready.
    ready, told = os.pipe()
    server = subprocess.Popen(
        ["Xvfb", "-displayfd", str(told), "-screen", "0", "640x480x24", "-nolisten", "tcp"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        pass_fds=(told,),
    )
    os.close(told)
    with os.fdopen(ready) as answer:
        number = answer.readline().strip()
    assert number, "Xvfb did not start"
    previous = os.environ.get("DISPLAY")
    os.environ["DISPLAY"] = f":{number}"
    yield f":{number}"
    if previous is None:
        os.environ.pop("DISPLAY", None)
    else:
        os.environ["DISPLAY"] = previous
    server.terminate()
    server.wait(10)


def pump(tray, until, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        tray.root.update()
        if until():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out; menu: {tray.labels()}")


def test_the_tk_menu_starts_lists_switches_and_stops(tiny_models_dir, tmp_path, display):
    from PIL import ImageGrab

    from menubar.tray import TkTray

    controller = controller_for(tiny_models_dir, tmp_path)
    tray = TkTray(controller)
    controller.start_polling(0.2)
    try:
        assert tray.button.cget("text") == "○ mlxserve"
        tray.menu.invoke(tray.labels().index("Start server"))
        pump(tray, lambda: controller.snapshot.state == "ready")
        pump(tray, lambda: "tiny2" in tray.labels(tray.submenu("Models")))
        models_menu = tray.submenu("Models")
        assert {"tiny", "tiny2", "mlxserve-demo-coder"} <= set(tray.labels(models_menu))
        assert tray.button.cget("text") == "● tiny"
        tray.menu.post(10, 40)  # open it, and its Models submenu, for the screenshot
        tray.menu.tk.call(tray.menu, "postcascade", tray.labels().index("Models"))
        tray.root.update()
        time.sleep(0.2)
        tray.root.update()
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        ImageGrab.grab(xdisplay=display).save(SCREENSHOTS / "menubar-linux.png")
        tray.menu.unpost()
        models_menu.invoke(tray.labels(models_menu).index("tiny2"))
        pump(tray, lambda: controller.snapshot.model == "tiny2")
        pump(tray, lambda: tray.button.cget("text") == "● tiny2")
        process = controller.process
        tray.menu.invoke(tray.labels().index("Stop server"))
        pump(tray, lambda: tray.button.cget("text") == "○ mlxserve")
        assert process.poll() is not None and port_free(controller.port)
    finally:
        controller.stop_polling()
        controller.stop()
        tray.root.destroy()
