"""`dflash2-trt serve` options that cannot apply, refused before anything starts (issue 21 item 11 and its
weak spots): a --repository is served as written, so --max-batch-size / --no-decoupled / --tokenizer /
--ids-only with it used to be silently ignored; --ready-timeout must be positive."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from dflash2_trt.cli import main


@pytest.mark.parametrize("extra,needle", [
    (["--max-batch-size", "2"], "--max-batch-size: applies to --engine-dir only"),
    (["--no-decoupled"], "--no-decoupled: applies to --engine-dir only"),
    (["--tokenizer", "{tmp}"], "--tokenizer: applies to --engine-dir only"),
    (["--ids-only"], "--ids-only: applies to --engine-dir only"),
    (["--ready-timeout", "-5"], "--ready-timeout: must be a number of seconds > 0"),
    (["--ready-timeout", "nan"], "--ready-timeout: must be a number of seconds > 0"),
    (["--drain-timeout", "-1"], "--drain-timeout: must be a number of seconds in [0, 3600]"),
    (["--drain-timeout", "nan"], "--drain-timeout: must be a number of seconds in [0, 3600]"),
])
def test_options_that_cannot_apply_are_refused(tmp_path, extra, needle):
    repo = tmp_path / "repo"
    repo.mkdir()
    r = CliRunner().invoke(main, ["serve", "--repository", str(repo), "--port", "1",
                                  *[e.format(tmp=tmp_path) for e in extra]])
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 1 and len(lines) == 1 and lines[0].startswith(f"error: {needle}"), r.output
