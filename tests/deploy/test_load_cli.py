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

    def stuck(*a, **kw):   # let go, the workers take the rest at once and end (joined below, while still patched)
        never.wait(60)

    monkeypatch.setattr(grpc, "InferenceServerClient", Client)
    monkeypatch.setattr(load, "stream_one", stuck)
    t0 = time.monotonic()
    try:
        with stop_recorded_after(0.3), pytest.raises(KeyboardInterrupt):
            load.run_load("127.0.0.1:1", [load.LoadRequest([5, 6], 4, None)] * 4, 2)
        assert time.monotonic() - t0 < 10
    finally:
        never.set()
        for th in threading.enumerate():
            if th.name.startswith("load-"):
                th.join(10)


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


def test_the_json_report_never_replaces_an_input(engine, tmp_path, capsys):
    """--json used to write over anything (a reviewer's run replaced the engine's engine.json) and was checked only
    after the whole run; now it is checked first and replaces only an earlier load report."""
    before = (engine / "engine.json").read_bytes()
    assert main(["--engine-dir", str(engine), "--json", str(engine / "engine.json")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --json: ") and "engine directory" in err[0], err
    assert (engine / "engine.json").read_bytes() == before
    other = tmp_path / "data.json"
    other.write_text('{"a": 1}')
    assert main(["--engine-dir", str(engine), "--json", str(other)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a Triton load report" in err[0], err
    assert other.read_text() == '{"a": 1}'
    assert main(["--engine-dir", str(engine), "--json", str(tmp_path / "none" / "r.json")]) == 1
    assert "does not exist" in capsys.readouterr().err


def test_max_tokens_past_the_engine_is_refused_before_the_target_decodes(engine, capsys):
    assert main(["--engine-dir", str(engine), "--max-tokens", "100000", "--requests", "2"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --max-tokens: 100000: the longest prompt") \
        and "max_seq_len" in err[0], err


def test_an_earlier_load_report_may_be_replaced(tmp_path):
    import json

    from dflash2_trt.bench.io import LOAD_FORMAT, check_output_file, existing_output

    earlier = tmp_path / "load.json"
    earlier.write_text(json.dumps({"format": LOAD_FORMAT, "levels": []}))
    assert existing_output(earlier)[0] == "load"
    assert check_output_file(earlier, field="--json", replaces="load") == earlier


def test_a_request_that_ends_at_its_end_token_at_once_is_measured():
    """A response leaves out the end token (serving.py), so a request that ends at its first token gets one empty
    final response: the load tool counts it (0 tokens, its time to first response) instead of failing on a TTFT of
    None when it sorts the percentiles (an independent review)."""
    import queue

    import numpy as np

    from dflash2_trt.deploy.triton import load

    class Result:
        def __init__(self, ids, final):
            self.ids, self.final = ids, final

        def get_response(self):
            param = type("P", (), {"bool_param": self.final})()
            return type("R", (), {"id": "0", "parameters": {"triton_final_response": param}})()

        def as_numpy(self, name):
            return {"output_ids": np.zeros((1, 1, 0), dtype=np.int32) if not self.ids else
                    np.array([[self.ids]], dtype=np.int32),
                    "total_accepted_draft_tokens": np.array([[0]]), "total_draft_tokens": np.array([[0]])}.get(name)

    class Client:
        def async_stream_infer(self, *a, **k):
            pass

    grpc = type("G", (), {"InferInput": lambda *a: type("I", (), {"set_data_from_numpy": lambda self, x: None})()})
    q: queue.Queue = queue.Queue()
    q.put((Result([], True), None))
    res = load.stream_one(Client(), grpc, q, 0, load.LoadRequest([5, 6], 4, []))
    assert res.error is None and res.output_ids == [] and res.ttft_s is not None and res.latency_s is not None
