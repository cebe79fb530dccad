"""mlxserve's menubar app: start and stop the local server, and load, unload and pin its models,
from the menu bar (rumps on macOS, a Tk window elsewhere), driven by
`controller.ServerController`."""
