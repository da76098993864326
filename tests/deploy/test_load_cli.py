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


def test_a_recorded_stop_ends_a_load_run_whose_requests_hang(monkeypatch):
    """A Ctrl-C whose exception Python lost (recorded by errors.stop_requested) ends the wait for the load's workers,
    here stuck on a server that never answers."""
    import threading
    import time

    import tritonclient.grpc as grpc

    from dflash2_trt.deploy.triton import load
    from dflash2_trt.testing.stops import stop_recorded_after

    class Client:
        def __init__(self, url):
            pass

        def start_stream(self, callback):
            pass

        def stop_stream(self):
            pass

        def close(self):
            pass

    never = threading.Event()
    monkeypatch.setattr(grpc, "InferenceServerClient", Client)
    monkeypatch.setattr(load, "stream_one", lambda *a, **kw: never.wait(60))
    t0 = time.monotonic()
    try:
        with stop_recorded_after(0.3), pytest.raises(KeyboardInterrupt):
            load.run_load("127.0.0.1:1", [load.LoadRequest([5, 6], 4, None)] * 4, 2)
        assert time.monotonic() - t0 < 10
    finally:
        never.set()


@pytest.mark.parametrize("lost", [False, True])
def test_a_stop_is_one_line_and_its_exit_status(tmp_path, capsys, monkeypatch, lost):
    import signal

    from dflash2_trt.deploy.triton import load
    from dflash2_trt.errors import DFlash2Error, pending_stop, stop_requested

    def run(args, concurrency):
        stop_requested(signal.SIGTERM)
        if lost:   # its exception was lost, and an error came of it (a broken stream, say)
            raise DFlash2Error("stream broke")
        raise stop_requested(signal.SIGTERM)

    monkeypatch.setattr(load, "_run", run)
    assert main(["--engine-dir", str(tmp_path)]) == 143
    assert capsys.readouterr().err.strip().splitlines() == ["terminated (SIGTERM)"]
    assert pending_stop() is None   # not left for the next caller
