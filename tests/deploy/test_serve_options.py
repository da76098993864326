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


class _Running:
    """A server that runs until told otherwise; on its third poll a Ctrl-C arrives and Python loses its exception,
    as it does for one raised inside a weakref callback ("Exception ignored in ...")."""

    def __init__(self, lose_at: int | None = 3, exit_at: int = 300):
        self.polls, self.lose_at, self.exit_at = 0, lose_at, exit_at

    def alive(self) -> bool:
        import signal

        from dflash2_trt.testing.stops import lose_a_signal

        self.polls += 1
        if self.polls == self.lose_at:
            lose_a_signal(signal.SIGINT)
        return self.polls < self.exit_at   # it exits on its own, so that a wait that missed the stop ends too


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_serve_ends_on_a_ctrl_c_whose_exception_was_lost():
    import signal
    import time

    from dflash2_trt.deploy.triton.server import serve_until_stopped
    from dflash2_trt.errors import clear_stop_requests, pending_stop, stop_requested

    def handler(signum, frame):   # what serve installs: record the stop, then raise
        raise stop_requested(signum)

    old = signal.signal(signal.SIGINT, handler)
    try:
        srv = _Running()
        t0 = time.monotonic()
        assert serve_until_stopped(srv, poll_s=0.01)
        assert pending_stop() == signal.SIGINT and srv.polls <= 4 and time.monotonic() - t0 < 10
    finally:
        signal.signal(signal.SIGINT, old)
        clear_stop_requests()


def test_serve_reports_a_server_that_exited_on_its_own():
    from dflash2_trt.deploy.triton.server import serve_until_stopped

    assert serve_until_stopped(_Running(lose_at=None, exit_at=3), poll_s=0.01) is False


def test_the_readiness_wait_ends_on_a_recorded_stop(tmp_path):
    """A stop whose exception was lost while serve started (deploying, importing) ends the wait for tritonserver to
    be ready, instead of serve waiting out its ready timeout (900 s for a GPU engine) and then exiting 0."""
    import subprocess
    import sys
    import time

    from dflash2_trt.deploy.triton.server import TritonServer, free_port
    from dflash2_trt.testing.stops import stop_recorded_after

    srv = TritonServer.__new__(TritonServer)   # its readiness wait alone, on a process that never gets ready
    srv.http_port, srv.ready_timeout, srv.progress, srv.log_kept = free_port(), 60.0, None, True
    srv.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    t0 = time.monotonic()
    try:
        with stop_recorded_after(0.5), pytest.raises(KeyboardInterrupt):
            srv.wait_ready()
        assert time.monotonic() - t0 < 20
    finally:
        srv.proc.kill()
        srv.proc.wait()


@pytest.mark.parametrize("content,needle", [("", None), ("I1207 00:41:31.123456 1 server.cc:1] started\n", None),
                                            ("Data for JOB [1,1] offset 0\nW1207 00:41:31.1 1 pinned.cc:1] x\n", None),
                                            ('{"input_ids": [1]}\n', "is not a tritonserver log"),
                                            (None, "does not exist")])
def test_the_log_replaces_only_a_tritonserver_log(tmp_path, content, needle):
    """`serve --log FILE` wrote over any file (a reviewer's dataset) and gave a traceback for an unwritable path."""
    from dflash2_trt.deploy.triton.server import check_log_path
    from dflash2_trt.errors import ConfigError

    log = tmp_path / "triton.log" if content is not None else tmp_path / "none" / "triton.log"
    if content is not None:
        log.write_text(content)
    if needle is None:
        check_log_path(log)
    else:
        with pytest.raises(ConfigError, match=needle) as ei:
            check_log_path(log)
        assert ei.value.field == "--log"
    assert content is None or log.read_text() == content


@pytest.mark.parametrize("where", ["/dev/stdout", "/dev/stderr", "/dev/null"])
def test_the_log_may_be_this_processs_output_or_a_device(where):
    """`serve --log /dev/stdout` (a container's habit) writes there; nothing is replaced."""
    from dflash2_trt.deploy.triton.server import check_log_path

    check_log_path(where)


def test_a_repository_whose_engine_moved_is_one_line_before_the_server_starts(engine, tmp_path, monkeypatch):
    """`serve --repository` after the engine directory it was written for moved: the models failed inside the
    server, the tokenizer models with transformers' "Repo id must be in the form ..." (the path read as a Hub id).
    Now one line names the config file, the parameter and the path, before tritonserver is started; the tokenizer
    models themselves say what is missing where a server is started by hand."""
    import shutil

    from dflash2_trt.deploy.triton.repository import deploy_triton

    eng = tmp_path / "engine"
    shutil.copytree(engine, eng)
    repo = tmp_path / "repo"
    deploy_triton(eng, repo)
    argv = ["serve", "--repository", str(repo), "--port", str(_free_port())]
    eng.rename(tmp_path / "moved")
    r = CliRunner().invoke(main, argv)
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 1 and len(lines) == 1, r.output
    assert lines[0] == (f"error: {repo / 'tensorrt_llm' / 'config.pbtxt'}: gpt_model_path: {eng} is not a directory "
                        f"(moved or removed since `deploy triton` wrote this repository? write it again with "
                        f"--engine-dir at its new place)"), r.output
    (tmp_path / "moved").rename(eng)
    shutil.rmtree(eng / "tokenizer")
    r = CliRunner().invoke(main, argv)
    assert r.exit_code == 1 and f"config.pbtxt: tokenizer_dir: {eng / 'tokenizer'} is not a directory" in r.output
    import importlib.util
    import sys
    import types

    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", types.ModuleType("triton_python_backend_utils"))
    for name in ("preprocessing", "postprocessing"):     # the files the repository holds, as the stub loads them
        spec = importlib.util.spec_from_file_location(f"df2_{name}_moved", repo / name / "1" / "model.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        with pytest.raises(FileNotFoundError, match=r"tokenizer_dir .*: not a directory \(moved or removed"):
            module.load_tokenizer(str(eng / "tokenizer"))


def _free_port() -> int:
    from deploy_helpers import free_base_port

    return free_base_port()
