"""This process's rank as its launcher set it, read without MLX: the front process decides
from it whether the engine runs beside it (rank 0) or in this process (every other rank)."""

from __future__ import annotations

import os

# mlx.launch's ring, JACCL and NCCL backends; then mpirun's, for the MPI backend (Open MPI's,
# MPICH's)
RANK_VARIABLES = ("MLX_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")


def launched_rank(environment: dict[str, str] | None = None) -> int | None:
    """The rank the launcher gave this process; None when no launcher's variable says."""
    environment = os.environ if environment is None else environment
    for name in RANK_VARIABLES:
        value = environment.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return None


def engine_in_front(engine_in_process: bool, distributed: bool) -> bool:
    """Whether the engine runs in the HTTP server's process: when asked, and on a distributed
    server's ranks but rank 0 (they serve no HTTP: the process is the engine), and where no
    launcher's variable tells rank 0 apart before MLX starts."""
    if engine_in_process:
        return True
    if distributed:
        return launched_rank() != 0
    return False
