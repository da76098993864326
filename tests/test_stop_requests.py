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


@pytest.mark.parametrize("sig,code,line", [("SIGTERM", 143, "terminated (SIGTERM): stopped; any output in progress was removed"),
                                           ("SIGINT", 130, "interrupted")])
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
