"""The engine process with an abort on purpose, for the supervisor's tests: `python -m
tests.engine_faults ARGS` is `python -m mlxserve.ipc.engine_main ARGS`, except that once the
file named by $MLXSERVE_ABORT_FILE exists, the next batch step aborts the process (SIGABRT from
inside the step, as MLX's Metal backend aborts when a command buffer fails). The hook is here,
in the tests; the engine process itself has none."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ABORT_FILE = "MLXSERVE_ABORT_FILE"


def install(trigger: Path) -> None:
    from mlxserve.engine.mlx_lm_compat import ServerBatchGenerator

    step = ServerBatchGenerator._next

    def aborting_step(self, *args, **kwargs):
        if trigger.exists():
            trigger.unlink()
            os.abort()
        return step(self, *args, **kwargs)

    ServerBatchGenerator._next = aborting_step


if __name__ == "__main__":
    from mlxserve.ipc import engine_main

    install(Path(os.environ[ABORT_FILE]))
    sys.exit(engine_main.main())
