"""The menubar app: its controller against a real `mlxserve serve` subprocess on the tiny
models, the Tk rendering of its menu driven under Xvfb (skipped where Xvfb is missing), what
`python -m menubar` says where it cannot open a window, and the dependencies its extra declares."""

from __future__ import annotations

import ast
import importlib.metadata
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from menubar import actions, login, menu
from menubar.controller import ServerController, Snapshot, wait_until

from ..helpers import skip_for_missing
from ..live_server import free_port

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "build" / "screenshots"
# The platforms a menubar module runs on: app.py (rumps) on macOS alone, the rest everywhere.
PLATFORMS = {
    "darwin": {"sys_platform": "darwin", "platform_machine": "arm64"},
    "linux": {"sys_platform": "linux", "platform_machine": "x86_64"},
}
RUNS_ON = {"app.py": ("darwin",)}
tk_is_the_window = pytest.mark.skipif(
    sys.platform == "darwin", reason="macOS: the rumps menu bar, and Tk needs no $DISPLAY there"
)


def controller_for(models: Path, tmp_path: Path, *serve_args: str) -> ServerController:
    """A controller for `mlxserve serve --model tiny` (and `serve_args`) on the tiny models."""
    return ServerController(
        port=free_port(),
        serve_args=["--model", str(models / "tiny"), "--models-dir", str(models), *serve_args],
        log_path=tmp_path / "server.log",
    )


def refresh_until(controller: ServerController, until, timeout: float = 60.0) -> Snapshot:
    deadline = time.monotonic() + timeout
    while not until(snapshot := controller.refresh()):
        assert time.monotonic() < deadline, (snapshot, controller.log_tail())
        time.sleep(0.1)
    return snapshot


def choice(snapshot: Snapshot, name: str):
    return next(m for m in snapshot.models if m.name == name)


def port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_start_load_another_with_a_request_in_flight_then_stop(tiny_models_dir, tmp_path):
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
        assert controller.load("tiny2")
        request.join(120)
        assert answers[0]["model"] == "tiny"  # finished on the model it started on
        assert answers[0]["usage"]["completion_tokens"] == 300
        loaded = refresh_until(controller, lambda s: s.state == "ready" and s.model == "tiny2")
        assert menu.title(loaded) == "● tiny2"
        assert {m.name for m in loaded.models if m.loaded} == {"tiny", "tiny2"}  # side by side
        assert [m.name for m in loaded.models if m.default] == ["tiny2"]
        assert {"starting", "ready"} <= set(seen)
    finally:
        process = controller.process
        controller.stop()
    assert process.poll() is not None and port_free(controller.port)
    assert controller.snapshot.state == "stopped"


def test_the_models_menu_pins_unloads_and_loads_two_served_models(tiny_models_dir, tmp_path):
    budget = 1024**3
    controller = controller_for(
        tiny_models_dir,
        tmp_path,
        "--model",
        str(tiny_models_dir / "tiny2"),
        "--memory-budget",
        "1G",
    )

    def click(snapshot: Snapshot, model: str, title: str) -> None:
        """What a click on `title` in `model`'s submenu does, on the actions' own thread."""
        item = {i.title: i for i in menu.find_model(menu.build(snapshot, False), model).children}
        assert item[title].enabled, (model, title, snapshot)
        worker = actions.perform(item[title].action, controller, shell=None)
        worker.join(120)
        assert not worker.is_alive()

    controller.start()
    try:
        assert wait_until(controller, {"ready", "error"}).state == "ready", controller.log_tail()
        both = refresh_until(controller, lambda s: all(m.loaded for m in s.models[:2]))
        tiny, tiny2 = both.models[:2]
        assert (tiny.name, tiny.default, tiny2.name, tiny2.default) == (
            "tiny",
            True,
            "tiny2",
            False,
        )
        assert tiny.memory_bytes > 0 and tiny2.memory_bytes > 0
        assert both.memory_budget_bytes == budget
        assert both.models_memory_bytes == tiny.memory_bytes + tiny2.memory_bytes
        used = menu.size_text(both.models_memory_bytes)
        assert menu.find(menu.build(both, False), f"Models: {used} of 1.1 GB")
        assert not [m for m in both.models if m.name == "mlxserve-demo-coder" and m.loaded]

        click(both, "tiny", "Pin")
        pinned = controller.snapshot
        assert choice(pinned, "tiny").pinned and not choice(pinned, "tiny2").pinned
        assert (
            menu.find_model(menu.build(pinned, False), "tiny").title == "● tiny (default, pinned)"
        )
        assert (
            httpx.get(controller.url + "/admin/status", timeout=60).json()["models"][0]["pinned"]
            is True
        )

        click(pinned, "tiny2", "Unload")
        # (not loaded at once; "unloaded" once its memory is free)
        unloaded = refresh_until(controller, lambda s: choice(s, "tiny2").state == "unloaded")
        assert choice(unloaded, "tiny2").memory_bytes == 0
        assert unloaded.models_memory_bytes == choice(unloaded, "tiny").memory_bytes
        assert unloaded.model == "tiny" and menu.title(unloaded) == "● tiny"
        tiny2_menu = menu.find_model(menu.build(unloaded, False), "tiny2")
        assert tiny2_menu.title == "tiny2"  # served, not in memory: no mark
        assert not menu.find(list(tiny2_menu.children), "Unload").enabled

        click(unloaded, "tiny2", "Load")
        default = refresh_until(controller, lambda s: s.model == "tiny2" and s.state == "ready")
        assert choice(default, "tiny2").loaded and choice(default, "tiny2").default
        assert choice(default, "tiny").loaded and choice(default, "tiny").pinned
        assert not choice(default, "tiny").default
        assert menu.title(default) == "● tiny2"
        assert menu.find_model(menu.build(default, False), "tiny2").title == "● tiny2 (default)"

        click(default, "tiny", "Unpin")
        assert not choice(controller.snapshot, "tiny").pinned

        assert controller.load("no-such-model") is False  # said in the menu, not raised
        refused = controller.refresh()
        assert "no-such-model" in refused.error and "does not exist" in refused.error
        assert refused.state == "ready"
        assert menu.find(menu.build(refused, False), f"Error: {refused.error}")
    finally:
        controller.stop()
    assert controller.snapshot.error is None


def test_a_crashed_server_is_an_error_with_the_log_tail(tiny_models_dir, tmp_path):
    controller = controller_for(tiny_models_dir, tmp_path)
    controller.start()
    try:
        wait_until(controller, {"ready"})
        os.kill(controller.process.pid, signal.SIGKILL)
        controller.process.wait(10)
        snapshot = controller.refresh()
        assert snapshot.state == "error" and "-9" in snapshot.error
        assert "model tiny ready" in snapshot.log_tail
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
        skip_for_missing("Xvfb is not installed (apt-get install xvfb): no display for the Tk menu")
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


def test_the_tk_menu_starts_lists_loads_and_stops(tiny_models_dir, tmp_path, display):
    from PIL import ImageGrab

    from menubar.tray import TkTray

    controller = controller_for(tiny_models_dir, tmp_path)
    tray = TkTray(controller)
    controller.start_polling(0.2)
    try:
        assert tray.button.cget("text") == "○ mlxserve"
        tray.menu.invoke(tray.labels().index("Start server"))
        pump(tray, lambda: controller.snapshot.state == "ready")
        # The window renders the snapshots on Tk's thread: the latest may not be drawn yet.
        pump(tray, lambda: "● tiny (default)" in tray.labels(tray.submenu("Models")))
        models_menu = tray.submenu("Models")
        assert {"● tiny (default)", "tiny2", "mlxserve-demo-coder"} <= set(tray.labels(models_menu))
        assert tray.labels(tray.submenu("● tiny (default)", models_menu))[:3] == [
            "Make default",
            "Unload",
            "Pin",
        ]
        assert any(label.startswith("Models: ") for label in tray.labels())
        assert tray.button.cget("text") == "● tiny"
        # Open it, its Models submenu and the default model's, for the screenshot.
        tray.menu.post(10, 40)
        tray.menu.tk.call(tray.menu, "postcascade", tray.labels().index("Models"))
        tray.root.update()
        models_menu.tk.call(
            models_menu, "postcascade", tray.labels(models_menu).index("● tiny (default)")
        )
        tray.root.update()
        time.sleep(0.2)
        tray.root.update()
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        ImageGrab.grab(xdisplay=display).save(SCREENSHOTS / "menubar-linux.png")
        tray.menu.unpost()
        tiny2_menu = tray.submenu("tiny2", models_menu)
        tiny2_menu.invoke(tray.labels(tiny2_menu).index("Load"))
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


def run_menubar(args: list[str], tmp_path: Path, python_code: str | None = None):
    """`python -m menubar ARGS` (or `python -c CODE ARGS`) with no $DISPLAY; the server log,
    were a server started, would go under tmp_path."""
    env = {name: value for name, value in os.environ.items() if name != "DISPLAY"}
    env["XDG_STATE_HOME"] = str(tmp_path)  # platformdirs' user_log_dir on Linux
    program = ["-c", python_code] if python_code else ["-m", "menubar"]
    return subprocess.run(
        [sys.executable, *program, *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


@tk_is_the_window
@pytest.mark.parametrize("start", [False, True], ids=["no-start", "start"])
def test_without_a_display_it_says_so_in_one_line_and_starts_no_server(start, tmp_path):
    # Were a server started, it would exit at once: its model does not exist.
    args = ["--port", str(free_port()), "--", "--model", str(tmp_path / "no-model")]
    result = run_menubar(args if start else ["--no-start", *args], tmp_path)
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("python -m menubar: error: no display to show the menu on")
    assert "$DISPLAY" in lines[0] and "Xvfb" in lines[0]
    assert "Traceback" not in result.stderr
    assert list(tmp_path.rglob("server.log")) == []


@tk_is_the_window
def test_without_tk_it_names_the_package_to_install(tmp_path):
    no_tkinter = (
        "import sys; sys.modules['tkinter'] = None; "
        "from menubar.__main__ import main; sys.exit(main())"
    )
    result = run_menubar(["--no-start"], tmp_path, python_code=no_tkinter)
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("python -m menubar: error: this Python has no Tk")
    assert lines[0].endswith("apt-get install python3-tk")


def third_party_imports(path: Path) -> set[str]:
    """The top-level modules `path` imports, anywhere in it, less the standard library's."""
    modules = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules |= {alias.name.partition(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            modules.add(node.module.partition(".")[0])
    return modules - set(sys.stdlib_module_names)


def test_the_menubar_extra_declares_every_module_the_menubar_imports():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = [
        Requirement(line)
        for line in project["dependencies"] + project["optional-dependencies"]["menubar"]
    ]
    distributions = importlib.metadata.packages_distributions()
    imported = {}
    for path in sorted((ROOT / "menubar").glob("*.py")):
        for module in third_party_imports(path):
            imported[path.name, module] = canonicalize_name(distributions.get(module, [module])[0])
    assert {"httpx", "platformdirs", "rumps"} <= set(imported.values())
    undeclared = [
        f"{file} imports {module} ({name}), which `pip install mlxserve[menubar]` on {platform}"
        " does not install"
        for (file, module), name in imported.items()
        for platform in RUNS_ON.get(file, tuple(PLATFORMS))
        if not any(
            canonicalize_name(requirement.name) == name
            and (requirement.marker is None or requirement.marker.evaluate(PLATFORMS[platform]))
            for requirement in declared
        )
    ]
    assert undeclared == []
