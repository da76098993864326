"""Whether a process still runs, for the tests that check nothing outlives a stop."""

from __future__ import annotations


def process_alive(pid: int) -> bool:
    """Running: it exists and is not a zombie (a child whose parent has ended, not yet reaped, has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False
