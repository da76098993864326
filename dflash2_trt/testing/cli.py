"""The command line in-process, for the tests: one place for running ``dflash2-trt ARGS`` and for the one-line error
rule (a failed command prints exactly one ``error:`` line, no traceback)."""

from __future__ import annotations


def cli(*args):
    """``dflash2-trt ARGS`` in-process: (exit code, output)."""
    from click.testing import CliRunner

    from ..cli import main

    r = CliRunner().invoke(main, list(args))
    return r.exit_code, r.output


def one_error_line(code, text):
    """The single ``error:`` line of a failed command (asserting the failure, and that it is exactly one line)."""
    assert code != 0
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in text, text
    return lines[0]
