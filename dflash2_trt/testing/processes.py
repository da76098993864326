"""Whether a process still runs, for the tests that check nothing outlives a stop."""

from __future__ import annotations

import glob
import os


def process_alive(pid: int) -> bool:
    """Running: it exists and is not a zombie (a child whose parent has ended, not yet reaped, has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


# Shared-memory segments the suite's multi-process jobs create in /dev/shm: MPICH's (one per job and node) and the
# Triton python backend's regions (the tests give them the prefix dflash2test<i>_). A job killed on purpose (the
# abrupt-stop and never-closing-rank tests) cannot remove its own.
SUITE_SHM_PATTERNS = ("/dev/shm/mpich_shm_*", "/dev/shm/dflash2test*")


def shm_segments(patterns=SUITE_SHM_PATTERNS) -> set[str]:
    return {p for pat in patterns for p in glob.glob(pat)}


def mapped_files() -> set[str]:
    """Every file some process of this machine maps (its /proc/<pid>/maps, where readable)."""
    found: set[str] = set()
    for maps in glob.glob("/proc/[0-9]*/maps"):
        try:
            with open(maps, errors="replace") as fh:
                for line in fh:
                    parts = line.split(maxsplit=5)
                    if len(parts) == 6 and parts[5].startswith("/"):
                        found.add(parts[5].strip().removesuffix(" (deleted)"))
        except OSError:
            continue
    return found


def remove_orphan_segments(created: set[str]) -> list[str]:
    """Unlink those of ``created`` (segments that appeared during a run) that no process maps any more: the ones a
    killed job left behind. Returns what was removed."""
    mapped = mapped_files()
    removed = []
    for path in sorted(created - mapped):
        try:
            os.unlink(path)
            removed.append(path)
        except OSError:
            continue
    return removed
