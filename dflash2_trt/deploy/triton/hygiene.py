"""Nothing left running, nothing left in ``/dev/shm``: what a tritonserver started here leaves, cleaned.

Triton's python backend runs every python model in a stub process (``triton_python_backend_stub``, started
through ``sh -c``) and talks to it through a shared-memory region in ``/dev/shm`` (1 MiB and up each). The
stubs ignore SIGTERM; a tritonserver that dies (or is SIGKILLed) while its models load leaves them orphaned
(measured 70-240 MiB resident each, running forever) and their regions in place. So:

* every server started here names its regions itself: the python backend's ``shm-region-prefix-name``
  option is set to :func:`region_prefix` of the server's working directory, so every region it or its
  stubs make, at any moment (a model still loading while the server shuts down included), is found by
  name; no region of another server can match;
* every working directory (``dflash2-triton-*``, ``dflash2-serve-*`` in the temp dir) carries an ``owner``
  file (pid and start time of the process that made it);
* a watchdog (:func:`watchdog_main`, its own session) outlives the starting process: when that process is
  gone (its pipe closes: any exit, SIGKILL included) it stops the server's whole process group (SIGTERM,
  then SIGKILL), unlinks the regions with the server's prefix that no live process maps and removes the
  working directories;
* :func:`sweep_leftovers` (every ``serve`` / :class:`TritonServer` start) finds working directories whose
  owner is dead and does the same for them (their processes are found by the directory path in their
  command line), naming each thing it removes.

Processes are only ever signalled when their command line names one of these directories (or they are in
the server's group, or in the group a tritonserver or follower rank naming one leads: under an MPI launcher each rank
leads its own); regions only when their name carries the prefix of one of these directories and no live
process maps them.
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

from ...children import proc_cmdline as _cmdline, proc_pids as _pids, proc_stat as _stat

SHM_DIR = Path("/dev/shm")
SHM_OURS = "dflash2_trt_"          # + the working directory's name: see region_prefix
WORK_PREFIXES = ("dflash2-triton-", "dflash2-serve-")
OWNER_FILE = "owner"


# ---- processes ------------------------------------------------------------------------------------
def start_time(pid: int) -> str | None:
    st = _stat(pid)
    return st[19] if st and st[0] not in ("Z", "X") else None   # field 22 of stat: start time in clock ticks


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group ``pgid``."""
    out = []
    for pid in _pids():
        st = _stat(pid)
        if st and st[0] not in ("Z", "X") and st[2] == str(pgid):
            out.append(pid)
    return out


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
def region_prefix(work: Path) -> str:
    """The ``shm-region-prefix-name`` of the server whose working directory is ``work``: unique per
    directory (``mkdtemp`` names), a valid POSIX shared-memory name."""
    return f"{SHM_OURS}{Path(work).name.replace('-', '_')}_"


def backend_config(work: Path) -> str:
    """The tritonserver argument that makes the python backend name its regions with ``work``'s prefix."""
    return f"--backend-config=python,shm-region-prefix-name={region_prefix(work)}"


def regions_with_prefix(prefix: str) -> set[str]:
    try:
        return {n for n in os.listdir(SHM_DIR) if n.startswith(prefix)}
    except OSError:
        return set()


def _mapped_anywhere(names: set[str]) -> set[str]:
    """Of ``names``, those some live process still maps."""
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


def unlink_regions(work: Path) -> list[str]:
    """Unlink the regions named with ``work``'s prefix that no live process maps; returns the removed ones."""
    existing = regions_with_prefix(region_prefix(work))
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


def _is_rank(pid: int) -> bool:
    """A process of ours that leads a session under an MPI launcher: a tritonserver or a Triton follower rank."""
    cmd = _cmdline(pid)
    return bool(cmd) and (Path(cmd[0]).name == "tritonserver" or "dflash2_trt.deploy.triton.follower" in cmd)


def _with_led_groups(pids) -> set[int]:
    """``pids`` and the members of every process group a tritonserver or follower rank among them leads (under
    mpiexec each rank leads its own: a server with its stubs). Only those: a user's shell job that merely names the
    directory keeps its group. A pid that changed (exited, reused) while it was looked at is left alone."""
    out = set(pids)
    for pid in pids:
        born = start_time(pid)
        try:
            leads = os.getpgid(pid) == pid
        except (ProcessLookupError, PermissionError):
            continue
        if leads and born is not None and _is_rank(pid) and start_time(pid) == born:
            out |= set(group_members(pid))
    return out


def kill_named(work: Path, exclude=()) -> list[int]:
    """SIGKILL every process naming ``work`` (but ``exclude``) and the groups they lead; wait for them."""
    pids = _with_led_groups(set(processes_naming(Path(work))) - set(exclude)) - set(exclude) - {os.getpid()}
    _kill_all(pids, signal.SIGKILL)
    _wait_gone(pids, 5.0)
    return sorted(pids)


def clean_work_dirs(works, *, pgid: int | None = None, grace: float = 5.0) -> dict:
    """Stop what ``works`` (and process group ``pgid``) left running, unlink their regions, remove the dirs.
    Returns ``{"processes": [...], "regions": [...], "dirs": [...]}`` of what was done."""
    works = [Path(w) for w in works]
    pids = set(group_members(pgid)) if pgid is not None else set()
    for w in works:
        pids |= _with_led_groups(processes_naming(w))
    pids.discard(os.getpid())
    if pids:
        _kill_all(pids, signal.SIGTERM)   # tritonserver unloads and exits on it; the stubs ignore it
        left = _wait_gone(pids, grace)
        _kill_all(left, signal.SIGKILL)
        _wait_gone(left, 5.0)
    if pgid is not None:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        _wait_gone(group_members(pgid), 5.0)
    removed = [n for w in works for n in unlink_regions(w)]   # after the processes: none can make another
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
        if not group_members(pgid) and not any(w.exists() for w in works):
            return 0                    # cleaned up by its owner already
    clean_work_dirs(works, pgid=pgid)
    return 0


if __name__ == "__main__":  # pragma: no cover - the watchdog process
    sys.exit(watchdog_main(sys.argv[1:]))
