"""Whether this process was started by an MPI launcher, and as one of how many: shared by both backends (a TensorRT
engine's ranks run one per process under ``mpirun``; a cpu or cuda engine runs every rank in one process and refuses
such a launch)."""

from __future__ import annotations

import os

from ..errors import ConfigError

# the world size MPI launchers put in each process's environment (Open MPI, MPICH / Intel MPI's hydra, PMIx)
LAUNCHER_SIZE_ENV = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE")


def launched_size() -> int | None:
    """The number of processes an MPI launcher started (from its environment), or None outside one."""
    for key in LAUNCHER_SIZE_ENV:
        value = os.environ.get(key)
        if value:
            try:
                return int(value)
            except ValueError:
                raise ConfigError(f"not an integer: {value!r}", field=key) from None
    return None


def several_processes() -> int | None:
    """The size of an MPI launch of more than one process this process is part of, else None (an unreadable launcher
    variable counts as no launch: for the commands that run as one process it never mattered)."""
    try:
        size = launched_size()
    except ConfigError:
        return None
    return size if size is not None and size > 1 else None
