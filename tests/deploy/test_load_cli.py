"""`python -m dflash2_trt.deploy.triton.load` (docs/cli.md §2): bad arguments are refused before the target decodes
and a server starts, and a bad engine directory is one `error:` line, never a traceback."""

from __future__ import annotations

import pytest

from dflash2_trt.deploy.triton.load import main


@pytest.mark.parametrize("args,needle", [
    (["--requests", "0"], "--requests: must be >= 1, got 0"),
    (["--concurrency", "1,0"], "--concurrency: must be >= 1, got 0"),
    (["--concurrency", "1,x"], "--concurrency: expected comma-separated integers"),
    (["--max-tokens", "0"], "--max-tokens: must be >= 1, got 0"),
])
def test_bad_arguments_are_refused_up_front(tmp_path, capsys, args, needle):
    with pytest.raises(SystemExit) as exc:
        main(["--engine-dir", str(tmp_path), *args])
    assert exc.value.code == 2
    assert needle in capsys.readouterr().err


def test_a_bad_engine_directory_is_one_error_line(tmp_path, capsys):
    assert main(["--engine-dir", str(tmp_path / "none")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "not a directory" in err[0], err
