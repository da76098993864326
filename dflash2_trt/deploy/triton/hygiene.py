"""Nothing left running, nothing left in ``/dev/shm``: what a tritonserver started here leaves, cleaned.

Triton's python backend runs every python model in a stub process (``triton_python_backend_stub``, started
through ``sh -c``) and talks to it through a shared-memory region ``/dev/shm/triton_python_backend_shm_region_*``
(1 MiB and up each). The stubs ignore SIGTERM; a tritonserver that dies (or is SIGKILLed) while its models
load leaves them orphaned (measured 70-240 MiB resident each, running forever) and their regions in place. So:

* every working directory (``dflash2-triton-*``, ``dflash2-serve-*`` in the temp dir) carries an ``owner``
  file (pid and start time of the process that made it) and a ``shm_regions`` list of the regions its
  server's processes mapped;
* a watchdog (:func:`watchdog_main`, its own session) outlives the starting process: it records the server
  group's regions while it runs, and when the starting process is gone (its pipe closes: any exit,
  SIGKILL included) it stops the server's whole process group (SIGTERM, then SIGKILL), unlinks the
  recorded regions nobody maps any more and removes the working directories;
* :func:`sweep_leftovers` (every ``serve`` / :class:`TritonServer` start) finds working directories whose
  owner is dead and does the same for them (their processes are found by the directory path in their
  command line), naming each thing it removes.

Processes are only ever signalled when their command line names one of these directories; regions only
when this tool recorded them (or an orphan stub of such a directory names it) and no live process maps them.
Limit: the watchdog records every 0.5 s, so when ``serve`` and its watchdog are SIGKILLed together, a region
the server made in the last half second before and no stub names yet cannot be attributed (and is left).
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

SHM_DIR = Path("/dev/shm")
SHM_PREFIX = "triton_python_backend_shm_region_"
WORK_PREFIXES = ("dflash2-triton-", "dflash2-serve-")
OWNER_FILE, REGIONS_FILE = "owner", "shm_regions"


# ---- processes ------------------------------------------------------------------------------------
def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name ([0] = state), or None when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def start_time(pid: int) -> str | None:
    st = _stat(pid)
    return st[19] if st and st[0] not in ("Z", "X") else None   # field 22 of stat: start time in clock ticks


def _pids() -> list[int]:
    try:
        return [int(d) for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return []


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group ``pgid``."""
    out = []
    for pid in _pids():
        st = _stat(pid)
        if st and st[0] not in ("Z", "X") and st[2] == str(pgid):
            out.append(pid)
    return out


def _cmdline(pid: int) -> list[str]:
    try:
        return [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        return []


def processes_naming(path: Path) -> list[int]:
    """Live processes (not this one) whose command line names ``path`` or something inside it."""
    p = str(path)
    out = []
    for pid in _pids():
        if pid == os.getpid():
            continue
        st = _stat(pid)
        if not st or st[0] in ("Z", "X"):
            continue
        if any(a == p or a.startswith(p + "/") or (p + "/") in a for a in _cmdline(pid)):
            out.append(pid)
    return out


def _kill_all(pids, sig) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _wait_gone(pids, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    left = list(pids)
    while left and time.monotonic() < deadline:
        left = [p for p in left if start_time(p) is not None]
        if left:
            time.sleep(0.05)
    return left


# ---- shared memory --------------------------------------------------------------------------------
def regions_of(pids) -> set[str]:
    """The python-backend regions ``pids`` map or name on their command line (a stub gets its region's name
    as an argument)."""
    names = set()
    for pid in pids:
        for a in _cmdline(pid):
            if a.startswith(SHM_PREFIX):
                names.add(a)
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            continue
        for line in maps.splitlines():
            i = line.find(str(SHM_DIR / SHM_PREFIX))
            if i >= 0:
                names.add(Path(line[i:].split()[0]).name)
    return names


def _mapped_anywhere(names: set[str]) -> set[str]:
    """Of ``names``, those some live process still maps (another server's are never touched)."""
    if not names:
        return set()
    found = set()
    for pid in _pids():
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            continue
        for n in names:
            if n not in found and (str(SHM_DIR / n)) in maps:
                found.add(n)
    return found


def unlink_regions(names) -> list[str]:
    """Unlink the regions of ``names`` that exist and no live process maps; returns the removed ones."""
    names = {n for n in names if n.startswith(SHM_PREFIX) and "/" not in n}
    existing = {n for n in names if (SHM_DIR / n).exists()}
    removed = []
    for n in sorted(existing - _mapped_anywhere(existing)):
        try:
            (SHM_DIR / n).unlink()
            removed.append(n)
        except OSError:
            pass
    return removed


# ---- working directories ------------------------------------------------------------------------
def make_work_dir(prefix: str) -> Path:
    """``mkdtemp`` with an ``owner`` file: this process's pid and start time."""
    d = Path(tempfile.mkdtemp(prefix=prefix))
    (d / OWNER_FILE).write_text(f"{os.getpid()} {start_time(os.getpid())}\n")
    return d


def owner_alive(work: Path) -> bool | None:
    """True/False when ``work`` names its owner; None when it has no (readable) owner file: not ours to judge."""
    try:
        pid_s, t = (work / OWNER_FILE).read_text().split()
        pid = int(pid_s)
    except (OSError, ValueError):
        return None
    return start_time(pid) == t


def record_regions(work: Path, names) -> None:
    """Add ``names`` to ``work``'s region list (kept for a later run if this one dies)."""
    if not names:
        return
    f = work / REGIONS_FILE
    try:
        have = set(f.read_text().split()) if f.exists() else set()
        new = set(names) - have
        if new:
            with open(f, "a") as fh:
                fh.write("".join(n + "\n" for n in sorted(new)))
    except OSError:
        pass


def recorded_regions(work: Path) -> set[str]:
    try:
        return set((work / REGIONS_FILE).read_text().split())
    except OSError:
        return set()


def clean_work_dirs(works, *, pgid: int | None = None, grace: float = 5.0) -> dict:
    """Stop what ``works`` (and process group ``pgid``) left running, unlink their regions, remove the dirs.
    Returns ``{"processes": [...], "regions": [...], "dirs": [...]}`` of what was done."""
    works = [Path(w) for w in works]
    pids = set(group_members(pgid)) if pgid is not None else set()
    for w in works:
        pids |= set(processes_naming(w))
    pids.discard(os.getpid())
    regions = regions_of(pids)
    for w in works:
        regions |= recorded_regions(w)
    if pids:
        _kill_all(pids, signal.SIGTERM)   # tritonserver unloads and exits on it; the stubs ignore it
        left = _wait_gone(pids, grace)
        regions |= regions_of(left) | (regions_of(group_members(pgid)) if pgid is not None else set())
        _kill_all(left, signal.SIGKILL)
        _wait_gone(left, 5.0)
    if pgid is not None:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    removed = unlink_regions(regions)
    dirs = []
    for w in works:
        if w.exists():
            shutil.rmtree(w, ignore_errors=True)
            if not w.exists():
                dirs.append(str(w))
    return {"processes": sorted(pids), "regions": removed, "dirs": dirs}


def sweep_leftovers(echo=None) -> dict:
    """Clean the working directories (and their processes and regions) of runs whose owner is dead: a
    ``serve`` that was SIGKILLed together with its watchdog. ``echo`` gets one line per directory."""
    root = Path(tempfile.gettempdir())
    try:
        stale = sorted(p for p in root.iterdir() if p.name.startswith(WORK_PREFIXES) and p.is_dir()
                       and not p.is_symlink() and owner_alive(p) is False)
    except OSError:
        return {"processes": [], "regions": [], "dirs": []}
    total = {"processes": [], "regions": [], "dirs": []}
    for w in stale:
        done = clean_work_dirs([w])
        for k in total:
            total[k] += done[k]
        if echo is not None and (done["processes"] or done["regions"] or done["dirs"]):
            echo(f"note: cleaned up after a tritonserver run that was killed: {w}"
                 + (f", stopped {len(done['processes'])} process(es) ({', '.join(map(str, done['processes']))})"
                    if done["processes"] else "")
                 + (f", removed {len(done['regions'])} /dev/shm region(s) ({', '.join(done['regions'])})"
                    if done["regions"] else ""))
    return total


# ---- the watchdog ---------------------------------------------------------------------------------
def start_watchdog(pgid: int, works) -> "object":
    """A watchdog process for server group ``pgid`` (see the module doc); returns its Popen. Closing its
    stdin (what the starting process's death does) makes it clean up and exit."""
    import subprocess

    return subprocess.Popen([sys.executable, "-m", "dflash2_trt.deploy.triton.hygiene", str(pgid),
                             *[str(w) for w in works]], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)


def watchdog_main(argv) -> int:
    pgid, works = int(argv[0]), [Path(w) for w in argv[1:]]
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # a terminal's Ctrl-C is for the server's owner, not us
    fd = sys.stdin.fileno()
    while True:
        r, _, _ = select.select([fd], [], [], 0.5)
        if r and not os.read(fd, 4096):
            break                       # the starting process is gone, or done: clean up
        members = group_members(pgid)
        if works and works[0].exists():
            record_regions(works[0], regions_of(members))
        if not members and not any(w.exists() for w in works):
            return 0                    # cleaned up by its owner already
    clean_work_dirs(works, pgid=pgid)
    return 0


if __name__ == "__main__":  # pragma: no cover - the watchdog process
    sys.exit(watchdog_main(sys.argv[1:]))
