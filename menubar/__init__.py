"""mlxserve's menubar app: start, stop and switch the local server from the menu bar (rumps on
macOS, a Tk window elsewhere), driven by `controller.ServerController`."""
