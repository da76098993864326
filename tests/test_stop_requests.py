"""A SIGTERM / Ctrl-C whose exception Python swallows (it lands while a destructor or weakref callback runs:
"Exception ignored in ...") still stops the command: the record of it (errors.stop_requested) is raised again
before an output is renamed into place and when the command returns. Seen in the suite: a SIGTERM during
`build` after the checkpoint was written, swallowed in a WeakSet callback, let the build finish with exit 0."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

from dflash2_trt.checkpoint.writer import AtomicOutputDir
from dflash2_trt.errors import Terminated, clear_stop_requests, stop_requested
from dflash2_trt.testing.stops import sigterm_twice

# the signal, the CLI's exit status for it, its one line on stderr
STOPS = [("SIGTERM", 143, "terminated (SIGTERM): stopped; any output in progress was removed"),
         ("SIGINT", 130, "interrupted")]

CHILD = textwrap.dedent("""
    import os, signal, sys, time
    from pathlib import Path
    import click
    from dflash2_trt import cli
    from dflash2_trt.checkpoint.writer import AtomicOutputDir

    class Swallows:
        def __del__(self):              # the handler's exception is raised in here and lost
            os.kill(os.getpid(), signal.{sig})
            for _ in range(1000):
                time.sleep(0.001)

    @cli.main.command("write-one")
    @click.argument("out")
    @click.option("--no-output", is_flag=True)
    def write_one(out, no_output):
        x = Swallows()
        del x
        if not no_output:
            with AtomicOutputDir(out) as tmp:
                (tmp / "data").write_text("complete")
        print("finished")

    cli.main(sys.argv[1:])
""")


@pytest.mark.parametrize("sig,code,line", STOPS)
@pytest.mark.parametrize("output", [True, False])
def test_a_swallowed_stop_still_stops_the_command(tmp_path, sig, code, line, output):
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, "-c", CHILD.replace("{sig}", sig), "write-one", str(out),
                        *([] if output else ["--no-output"])], capture_output=True, text=True, timeout=120)
    assert p.returncode == code, (p.returncode, p.stdout, p.stderr)
    assert [ln for ln in p.stderr.splitlines() if ln.strip()] == [line], p.stderr   # no "Exception ignored"
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_the_output_is_not_renamed_into_place_after_a_recorded_stop(tmp_path):
    final = tmp_path / "E"
    stop_requested(signal.SIGTERM)          # what a handler does before its exception is lost
    try:
        with pytest.raises(Terminated):
            with AtomicOutputDir(final) as tmp:
                (tmp / "data").write_text("complete")
    finally:
        clear_stop_requests()
    assert list(tmp_path.iterdir()) == []
    with AtomicOutputDir(final) as tmp:     # without a record, the same write lands
        (tmp / "data").write_text("complete")
    assert (final / "data").read_text() == "complete"


REPLACED = textwrap.dedent("""
    import os, signal, sys, time
    import click
    from dflash2_trt import cli
    from dflash2_trt.checkpoint.writer import AtomicOutputDir
    from dflash2_trt.errors import CheckpointError

    def extension_call():
        # what torch does when the handler's exception is raised inside its callback: it catches it and
        # raises its own error instead
        try:
            os.kill(os.getpid(), signal.{sig})
            for _ in range(1000):
                time.sleep(0.001)
        except KeyboardInterrupt:
            raise TypeError("could not determine the shape of object type 'torch.storage.UntypedStorage'") from None

    @cli.main.command("read-one")
    @click.argument("out")
    @click.option("--plain", is_flag=True)
    def read_one(out, plain):
        with AtomicOutputDir(out) as tmp:
            (tmp / "data").write_text("partial")
            if plain:
                extension_call()
            try:
                extension_call()
            except Exception as exc:
                raise CheckpointError(f"cannot read rank weights: {exc}", file=out) from None
        print("finished")

    cli.main(sys.argv[1:])
""")


@pytest.mark.parametrize("sig,code,line", STOPS)
@pytest.mark.parametrize("plain", [False, True])
def test_a_stop_turned_into_another_error_is_reported_as_the_stop(tmp_path, sig, code, line, plain):
    """Seen in CI: SIGTERM while the CPU engine read its rank weights came out of torch as a TypeError, was
    reported as a bad checkpoint file and the build exited 1. The recorded stop is what is reported, whether the
    replacement error is a DFlash2Error or any other exception (no traceback either way)."""
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, "-c", REPLACED.replace("{sig}", sig), "read-one", str(out),
                        *(["--plain"] if plain else [])], capture_output=True, text=True, timeout=120)
    assert p.returncode == code, (p.returncode, p.stdout, p.stderr)
    assert [ln for ln in p.stderr.splitlines() if ln.strip()] == [line], p.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_an_error_without_a_stop_is_still_an_error(tmp_path):
    child = REPLACED.replace("os.kill(os.getpid(), signal.{sig})", "raise KeyboardInterrupt")
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, "-c", child, "read-one", str(out)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 1, (p.returncode, p.stderr)
    assert p.stderr.strip().startswith("error: ") and "cannot read rank weights" in p.stderr, p.stderr


def test_no_progress_bars_where_stderr_is_not_a_terminal():
    """The console entry sets HF_HUB_DISABLE_PROGRESS_BARS (transformers' and huggingface_hub's bars read it) where
    stderr is not a terminal, unless the user set it."""
    import os
    import subprocess
    import sys

    probe = ("import atexit, os, sys; from dflash2_trt import cli; "
             "atexit.register(lambda: print('HF=' + os.environ.get('HF_HUB_DISABLE_PROGRESS_BARS', '-'))); "
             "sys.argv = ['dflash2-trt', 'targets', '--json']; cli.main()")
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_DISABLE_PROGRESS_BARS"}
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    assert r.stdout.strip().splitlines()[-1] == "HF=1", (r.stdout[-300:], r.stderr[-300:])
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                       env={**env, "HF_HUB_DISABLE_PROGRESS_BARS": "0"})
    assert r.stdout.strip().splitlines()[-1] == "HF=0"



SECOND_SIGTERM = textwrap.dedent("""
    import sys
    from dflash2_trt import cli
    from dflash2_trt.testing.stops import work_then_clean_up

    @cli.main.command("work")
    def work():
        work_then_clean_up(sys.argv[2])

    cli.main(sys.argv[1:2])
""")


@pytest.mark.parametrize("how", ["kept", "replaced", "lost"])
def test_a_second_sigterm(how):
    """The CLI ignores a second SIGTERM while a stop is unwinding (its clean-up is not cut short; also where an
    extension replaced the stop's exception on the way), but not after a first one whose exception was lost: that
    made a command immune to every later SIGTERM."""
    rc, out, err = sigterm_twice([sys.executable, "-c", SECOND_SIGTERM, "work", how], how == "lost")
    assert rc == 143 and out.split() == ["working", "cleaning", "cleaned"], (rc, out, err)
    assert [ln for ln in err.splitlines() if ln.strip()] == [
        "terminated (SIGTERM): stopped; any output in progress was removed"], err


AFTER_THE_OUTPUT = textwrap.dedent("""
    import os, signal, sys, time
    import click
    from dflash2_trt import cli
    from dflash2_trt.checkpoint.writer import AtomicOutputDir

    @cli.main.command("write-then-stop")
    @click.argument("out")
    def write_then_stop(out):
        with AtomicOutputDir(out) as tmp:
            (tmp / "data").write_text("complete")
        with AtomicOutputDir(out + "-second") as tmp:   # in progress when the stop comes: removed
            (tmp / "data").write_text("partial")
            os.kill(os.getpid(), signal.{sig})
            time.sleep(5)

    cli.main(sys.argv[1:])
""")


AFTER_A_FILE = textwrap.dedent("""
    import os, signal, sys, time
    import click
    from dflash2_trt import cli
    from dflash2_trt.bench.io import atomic_write_text

    @cli.main.command("file-then-stop")
    @click.argument("out")
    def file_then_stop(out):
        atomic_write_text(out, "complete\\n")    # a dataset, a report: in place, the old one replaced
        os.kill(os.getpid(), signal.{sig})        # the stop lands in the work after it (prepare-dataset's summary)
        time.sleep(5)

    cli.main(sys.argv[1:])
""")


@pytest.mark.parametrize("sig,code,line", STOPS)
def test_a_stop_after_a_file_was_written_says_it_was_kept(tmp_path, sig, code, line):
    """`bench prepare-dataset --force` stopped just after its file was in place said only "interrupted": the old file
    was gone and the new one complete, and nothing said so (a new user's review)."""
    out = tmp_path / "d.jsonl"
    out.write_text("old\n")
    p = subprocess.run([sys.executable, "-c", AFTER_A_FILE.replace("{sig}", sig), "file-then-stop", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == code, (p.returncode, p.stdout, p.stderr)
    assert [ln for ln in p.stderr.splitlines() if ln.strip()] == [f"{line} (complete and kept: {out})"], p.stderr
    assert out.read_text() == "complete\n" and sorted(x.name for x in tmp_path.iterdir()) == ["d.jsonl"]


@pytest.mark.parametrize("sig,code,line", STOPS)
def test_a_stop_after_an_output_was_complete_says_it_was_kept(tmp_path, sig, code, line):
    """The stop's line said "any output in progress was removed" also where an output was already in place (a
    reviewer's SIGTERM right after build's `wrote` line); it now names what is complete and kept."""
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, "-c", AFTER_THE_OUTPUT.replace("{sig}", sig), "write-then-stop", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == code, (p.returncode, p.stdout, p.stderr)
    assert [ln for ln in p.stderr.splitlines() if ln.strip()] == [f"{line} (complete and kept: {out})"], p.stderr
    assert (out / "data").read_text() == "complete" and sorted(x.name for x in tmp_path.iterdir()) == ["out"]
