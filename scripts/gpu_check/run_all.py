"""``scripts/gpu_check.sh --all OUT_DIR``: everything a GPU session measures, in one call that ends inside its budget.

The device tool brings back at most 8 files from its output folder, no more than two folders down, and the call
has about 570 s, the wheels' install included. So the parts (:data:`PARTS`, most valuable first) write into a
scratch folder outside OUT_DIR, and after each part OUT_DIR gets, replaced whole:

- ``results.tar.gz``: every part's files and logs so far (``kernels.json``, ``e2e/``, ``trt_session/``,
  ``<part>.log``, ``summary.json``); the device tool brings back no file over 16 MiB, so an archive over
  :data:`MAX_ARCHIVE_BYTES` (15 MiB) is made again without the largest of :data:`OPTIONAL` (Nsight Compute's reports,
  the profile's source and details pages, compute-sanitizer's logs; then, were that not enough, the largest of the
  rest) until it fits;
- ``summary.json``: each part's exit status, seconds and limit (124: stopped at its limit; ``skipped``: too little
  budget left to start it), and ``left_out`` where the archive left files out (each one's path, size and why).

Each part runs in its own process group under its own limit, cut to what is left of the budget
(``DFLASH2_GPU_BUDGET_S``, default 540 s from the start of this script): a part that crashes or overruns is
stopped (SIGTERM, then SIGKILL after 5 s) and the next one starts; the files of the parts before it are already in
OUT_DIR; while a part runs its files so far are packed every REPACK_S seconds (its summary entry says
``running``). Stopped from outside (the call's own limit: SIGTERM or Ctrl-C), the running part is stopped too (a
part runs in a session of its own, out of reach of a stop aimed at this group) after STOP_GRACE_S to save, its files
are packed, the summary says ``interrupted`` and the exit status is 128 + the signal; killed outright (SIGKILL), the
part dies with this process (PR_SET_PDEATHSIG) and OUT_DIR keeps the last repack. Exit status 0 (the parts' own
statuses are in the summary).
"""

from __future__ import annotations

import contextlib
import fnmatch
import gzip
import io
import json
import os
import signal
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))
from dflash2_trt.bench.io import atomic_write_bytes  # noqa: E402 - the repository's package, from this checkout
from dflash2_trt.children import die_with_parent, run_limited, stop_signals_raise  # noqa: E402
DEFAULT_BUDGET_S = 540.0
PACK_RESERVE_S = 10.0      # kept back for stopping a part (5 s grace) and packing its files
MIN_PART_S = 20.0          # a part that would get less is not started
KILL_GRACE_S = 5.0
STOP_GRACE_S = 3.0         # stopped from outside: a part gets this long after SIGTERM to save what it has
REPACK_S = 20.0            # while a part runs, its files so far are packed this often (a SIGKILL from outside loses
                           # at most that much)


@dataclass(frozen=True)
class Part:
    name: str
    limit: float
    argv: Callable[[Path, float], list[str]]   # (scratch folder, this run's limit) -> the command
    # the least time in which the part can finish something (None: run_all's min_part); given less it is skipped, not
    # started to be stopped before its first result
    min_s: float | None = None


def default_parts(python: str = sys.executable) -> list[Part]:
    """The parts of the GPU run, most valuable first: the plugins' kernels (checks and timings), the engine flow
    (lossless in at most half of its limit, then the real-width steps in the rest), the TensorRT session's binding on
    device pointers, the timed workloads under Nsight Compute (``profile.py``: why a kernel misses its bound), the
    gpu-marked tests (``-v``: each test's result is in the log as it ends), and with what is left the kernels' small
    cases under compute-sanitizer (``sanitize.py``)."""
    return [
        Part("kernels", 150, lambda w, s: [python, str(HERE / "gpu_check.py"), "--json", str(w / "kernels.json")]),
        Part("e2e", 300, lambda w, s: [python, str(REPO / "scripts" / "gpu_e2e.py"), "--out", str(w / "e2e"),
                                       "--budget", str(max(int(s - 10), 1))]),
        # 5 prompts (one more than the runtime's 4 slots: a request joins while others generate, a mixed step) of 8
        # new tokens: its defaults (6 x 16) took 57-88 s on a 2-core CPU machine, over a 45 s limit
        Part("trt_session", 75, lambda w, s: [python, str(REPO / "scripts" / "gpu_check_trt_session.py"),
                                              "--out", str(w / "trt_session"), "--prompts", "5", "--new", "8"]),
        # its first ncu run gets at least 15 s, plus 10 s for its exports and ~16 s for its stop ladder (profile.py)
        Part("profile", 120, lambda w, s: [python, str(HERE / "profile.py"), str(w / "profile"),
                                           "--limit", str(max(int(s - 10), 1))], min_s=45),
        # DFLASH2_REQUIRE_GPU: where torch sees no GPU the tests fail instead of all skipping (a green part, seen)
        # tests/gpu only: the one gpu-marked test elsewhere (tests/plugins: gpu_check.py whole) repeats the kernels
        # part. 26 s for its 9 tests on an H100 (2026-12-05)
        Part("pytest_gpu", 60, lambda w, s: ["env", "DFLASH2_REQUIRE_GPU=1", python, "-m", "pytest", "-v", "-p",
                                             "no:cacheprovider", "-m", "gpu", str(REPO / "tests" / "gpu")], min_s=35),
        # the library's build (cached: seconds), then three tools of at least 15 s each (sanitize.py MIN_SHARE_S; 39 s
        # for the three on an H100), inside its limit less 10 s
        Part("sanitize", 90, lambda w, s: [python, str(HERE / "sanitize.py"), str(w / "sanitize"),
                                           "--limit", str(max(int(s - 10), 1))], min_s=60),
    ]


MAX_ARCHIVE_BYTES = 15 << 20   # the device tool brings back no file over 16 MiB: a larger archive would be all lost
# what may be left out of a too large archive, where it holds them (paths under the scratch folder): Nsight Compute's
# reports, the source-counter and details pages of the profile (per SASS line of every launch), compute-sanitizer's
# logs (its own reports are in sanitize.json); the largest first
OPTIONAL = ("profile/*.ncu-rep", "profile/*-source.csv", "profile/*-details.csv", "sanitize/*.log")
SUMMARY = "summary.json"


def _files(work: Path) -> list[Path]:
    # os.walk ignores a folder removed while it walks (Path.rglob raises)
    return sorted(Path(d) / f for d, _, files in os.walk(work, onerror=lambda e: None) for f in files)


def _write_archive(tmp: Path, work: Path, found: list[Path], skip: set[str]) -> dict[str, tuple[int, int]]:
    """``found`` less ``skip`` as a gzipped tar at ``tmp``; per member its size and about what it added to the
    archive (the compressed bytes written meanwhile)."""
    sizes: dict[str, tuple[int, int]] = {}
    with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w") as tar:
        for p in found:
            name = str(p.relative_to(work))
            if name in skip:
                continue
            try:                  # read whole first: a file rewritten meanwhile cannot leave a short member behind
                if not p.is_file():
                    continue
                data = p.read_bytes()
                mtime = p.stat().st_mtime
            except FileNotFoundError:
                continue
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), mtime
            before = raw.tell()
            tar.addfile(info, io.BytesIO(data))
            sizes[name] = (len(data), raw.tell() - before)
    return sizes


def pack(work: Path, out: Path, max_bytes: int | None = None, note=None) -> list[dict]:
    """``out/results.tar.gz`` from everything under ``work``, replaced whole (a reader never sees half an archive; an
    error leaves the one before and no temporary file). A part may be writing while this packs (the repack while it
    runs): a file that goes away meanwhile (a temporary file renamed into place, a folder removed) is left out, not an
    error. An archive over ``max_bytes`` (default :data:`MAX_ARCHIVE_BYTES`) is made again without the largest files
    of :data:`OPTIONAL` (then, where that is not enough, without the largest of the rest but ``summary.json``) until
    it fits; ``note(left_out)`` is called before each such try (to say so in ``work/summary.json``, which goes in
    too). Returns what was left out: per file its path, size and why."""
    max_bytes = MAX_ARCHIVE_BYTES if max_bytes is None else max_bytes
    tmp = out / ".results.tar.gz.tmp"
    left_out: list[dict] = []
    try:
        found = _files(work)
        sizes = _write_archive(tmp, work, found, set())
        while (total := tmp.stat().st_size) > max_bytes:
            optional = {n for pat in OPTIONAL for n in sizes if fnmatch.fnmatchcase(n, pat)}
            others = {n for n in sizes if n not in optional and n != SUMMARY}
            pool, why = (optional, "optional") if optional else (others, "the rest")
            if not pool:
                break     # nothing more to leave out: the archive as it is (summary.json alone over the limit)
            over = total - max_bytes
            for name in sorted(pool, key=lambda n: (-sizes[n][1], -sizes[n][0], n)):
                left_out.append({"file": name, "bytes": sizes[name][0],
                                 "why": f"results.tar.gz {total} bytes > {max_bytes}: {why} files left out, largest "
                                        "first"})
                over -= sizes[name][1]
                if over < 0:
                    break
            if note is not None:
                note(left_out)
                found = _files(work)
            skip = {d["file"] for d in left_out}
            sizes = _write_archive(tmp, work, found, skip)
        os.replace(tmp, out / "results.tar.gz")
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return left_out


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def run_all(out: Path, parts: list[Part], budget: float, say=print, *, reserve: float = PACK_RESERVE_S,
            min_part: float = MIN_PART_S) -> dict:
    """Run ``parts`` in order inside ``budget`` seconds (see the module docstring); returns the summary."""
    start = time.monotonic()
    deadline = start + budget
    out.mkdir(parents=True, exist_ok=True)
    summary: dict = {}

    def save(work: Path) -> None:
        summary.pop("left_out", None)          # said again where this pack leaves something out

        def note(left_out: list[dict]) -> None:
            summary["left_out"] = left_out
            (work / "summary.json").write_bytes(json.dumps(summary, indent=1).encode())

        (work / "summary.json").write_bytes(json.dumps(summary, indent=1).encode())
        pack(work, out, note=note)
        atomic_write_bytes(out / "summary.json", json.dumps(summary, indent=1).encode())

    def repack(work: Path) -> None:   # while a part runs: a failure to pack must not stop the part
        try:
            save(work)
        except Exception as e:  # noqa: BLE001 - said; the next repack or the part's end tries again
            say(f"gpu_check --all: repacking failed ({type(e).__name__}: {e}); the part goes on")

    # a stop from outside (the call's own limit: SIGTERM) reaches the running part, which is in a session of its own:
    # it gets STOP_GRACE_S to save, then is killed with its children; what it wrote is packed and the summary says
    # "interrupted". A SIGKILL from outside cannot be handled: the part then gets SIGTERM from the kernel (it dies with
    # this process), and OUT_DIR keeps what the last repack (every REPACK_S) held.
    # A second signal is ignored (stop_signals_raise), so the part's stop ladder and the last save run to their end;
    # a stop between parts (in a save) is saved again on the way out.
    with tempfile.TemporaryDirectory(prefix="gpu_check_all.") as tmp, stop_signals_raise():
        work = Path(tmp)
        try:
            for part in parts:
                left = deadline - time.monotonic() - reserve
                limit = min(float(part.limit), left)
                if limit < (min_part if part.min_s is None else part.min_s):
                    summary[part.name] = {"exit": None, "skipped": f"{max(left, 0):.0f} s of the budget left",
                                          "seconds": 0, "limit": part.limit}
                    say(f"== {part.name}: skipped ({summary[part.name]['skipped']})")
                else:
                    argv = part.argv(work, limit)
                    say(f"== {part.name} (limit {limit:.0f} s): {' '.join(argv)}")
                    t0 = time.monotonic()
                    summary[part.name] = {"exit": "running", "seconds": None, "limit": round(limit, 1)}
                    try:
                        rc = run_limited(argv, limit, work / f"{part.name}.log", own_group=True, cwd=REPO,
                                         ladder=((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, None)),
                                         interrupted=((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, None)),
                                         preexec_fn=die_with_parent(), tick=(REPACK_S, lambda: repack(work)))
                    except BaseException:
                        summary[part.name] = {"exit": "interrupted", "seconds": round(time.monotonic() - t0, 1),
                                              "limit": round(limit, 1)}
                        say(f"== {part.name}: interrupted after {time.monotonic() - t0:.0f} s; its files so far go "
                            f"to {out / 'results.tar.gz'}")
                        raise
                    secs = time.monotonic() - t0
                    summary[part.name] = {"exit": rc, "seconds": round(secs, 1), "limit": round(limit, 1)}
                    say(tail(work / f"{part.name}.log"))
                    say(f"== {part.name}: exit {rc} after {secs:.0f} s")
                save(work)
        except BaseException:
            save(work)
            raise
    say(json.dumps(summary, indent=1))
    say(f"gpu_check --all: {time.monotonic() - start:.0f} s of a {budget:.0f} s budget; everything in "
        f"{out / 'results.tar.gz'}")
    return summary


def select(parts: list[Part], names: str | None) -> list[Part]:
    """``names`` (comma-separated, run in the default order; None: all): a second call of a session runs what the
    first one could not. Raises ValueError naming an unknown part."""
    if names is None:
        return parts
    wanted = [n for n in names.split(",") if n]
    known = [p.name for p in parts]
    bad = [n for n in wanted if n not in known]
    if bad or not wanted:
        raise ValueError(f"--parts: expected a comma-separated list of {', '.join(known)}, got {names!r}")
    return [p for p in parts if p.name in wanted]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    names = None
    if len(args) == 3 and args[1] == "--parts":
        names = args[2]
        args = args[:1]
    if len(args) != 1:
        print("usage: run_all.py OUT_DIR [--parts kernels,e2e,...]", file=sys.stderr)
        return 2
    try:
        parts = select(default_parts(), names)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    raw = os.environ.get("DFLASH2_GPU_BUDGET_S", str(DEFAULT_BUDGET_S))
    try:
        budget = float(raw)
    except ValueError:
        budget = -1.0
    if not budget > 0:
        print(f"error: DFLASH2_GPU_BUDGET_S must be a positive number of seconds, got {raw!r}", file=sys.stderr)
        return 2
    run_all(Path(args[0]), parts, budget)
    return 0


if __name__ == "__main__":
    sys.exit(main())
