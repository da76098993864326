"""``bench serve``: the client-side load against an OpenAI-compatible server, here this project's own API in front of
the real tritonserver serving the tiny engine. The texts it collects are held to the target's own greedy decoding,
its tokens per streamed event to ``bench run``'s emitted acceptance on the same engine and dataset."""

from __future__ import annotations

import json
import socket

import pytest

from deploy_helpers import MAX_NEW, cli, one_error_line, start_server, stop_and_check
from dflash2_trt.assets.phrase_tokenizer import WORDS
from dflash2_trt.bench.serve import Sent, arrival_offsets, compare_outputs
from dflash2_trt.deploy.triton.openai_api import OpenAIFrontend

pytestmark = pytest.mark.triton
pytest.importorskip("pytriton")

N = 6


@pytest.fixture(scope="module")
def api(server_stream, tokenizer, engine):
    man = json.loads((engine / "engine.json").read_text())
    f = OpenAIFrontend(server_stream.http_url, ensemble="ensemble", model="tiny", tokenizer=tokenizer,
                       max_seq_len=man["limits"]["max_seq_len"], block_size=man["block_size"]).start()
    yield f
    f.close()


@pytest.fixture(scope="module")
def target_api(tmp_path_factory, engine, tokenizer):
    """The same engine directory's target alone (deploy triton --target-only), on a server of its own, behind the API
    as `serve --openai-port` makes it (server.openai_frontend: one slot per step, not the draft block)."""
    from dflash2_trt.deploy.triton.repository import deploy_triton
    from dflash2_trt.deploy.triton.server import openai_frontend, repository_record

    repo = tmp_path_factory.mktemp("repo") / "target-only"
    res = deploy_triton(engine, repo, decoupled=True, target_only=True)
    record = repository_record(repo)
    assert record["target_only"] is True
    assert "eagle_choices" not in (repo / "tensorrt_llm" / "config.pbtxt").read_text() and res.ensemble == "ensemble"
    srv = start_server(repo)
    f = openai_frontend(record, repo, 0, srv.http_url, "tiny-target")
    assert f.block_size == 1 and openai_frontend({**record, "target_only": False}, repo, 0, srv.http_url,
                                                 None).block_size == 1   # what the model reads: config.pbtxt
    f.start()
    yield f
    f.close()
    stop_and_check(srv)


def _dataset(path, lines):
    path.write_text("".join(json.dumps(d) + "\n" for d in lines))
    return path


@pytest.fixture(scope="module")
def text_dataset(tmp_path_factory, prompts, tokenizer):
    return _dataset(tmp_path_factory.mktemp("bench-serve") / "text.jsonl",
                    [{"task_id": i, "prompt": tokenizer.decode(p), "output_tokens": MAX_NEW}
                     for i, p in enumerate(prompts[:N])])


def test_outputs_are_the_targets_greedy_decoding_and_events_are_engine_steps(api, text_dataset, engine, greedy,
                                                                              tokenizer, prompts, tmp_path):
    out = tmp_path / "serve.json"
    code, text = cli("bench", "serve", "--base-url", f"http://127.0.0.1:{api.port}", "--dataset", str(text_dataset),
                     "--concurrency", "1,4", "--json", str(out), "--save-outputs", "--no-progress")
    assert code == 0, text
    rows = [ln.split() for ln in text.splitlines() if ln[:4].strip().isdigit()]
    assert [(r[0], r[1], r[2]) for r in rows] == [("1", "served", "6/6"), ("4", "served", "6/6")], text
    doc = json.loads(out.read_text())
    assert doc["format"] == "dflash2-trt bench serve report" and doc["model"] == "tiny" and doc["usage_per_event"]
    assert doc["endpoint"] == f"http://127.0.0.1:{api.port}/v1/completions"
    for lv in doc["levels"]:
        assert (lv["completed"], lv["failed"], lv["prompt_tokens_differ"]) == (N, 0, 0)
        assert [o["text"] for o in lv["outputs"]] == [tokenizer.decode(g[:MAX_NEW]) for g in greedy[:N]]
        assert lv["output_tokens"] == N * MAX_NEW and lv["input_tokens"] == sum(map(len, prompts[:N]))
        assert all(o["finish_reason"] == "length" for o in lv["outputs"])
        assert lv["ttft_s"]["max"] <= lv["latency_s"]["max"] and lv["itl_s"]["min"] > 0
        assert lv["tokens_per_event"]["mean"] > 1.5   # the trained drafter: several tokens per engine step
        hist = lv["tokens_per_event"]["histogram"]
        assert sum(int(k) * v for k, v in hist.items()) == N * (MAX_NEW - 1)   # all but each first token
        assert lv["queue_s"] is None and lv["requests_per_s"] > 0
    # the same engine in-process at concurrency 1: the tokens each generation step gave a request
    run_json = tmp_path / "run.json"
    code, text = cli("bench", "run", "--engine-dir", str(engine), "--dataset", str(text_dataset), "--concurrency", "1",
                     "--no-baseline", "--json", str(run_json), "--no-progress")
    assert code == 0, text
    emitted = json.loads(run_json.read_text())["runs"][0]["speculative"]["acceptance"]["emitted_mean"]
    assert doc["levels"][0]["tokens_per_event"]["mean"] == pytest.approx(emitted, rel=1e-12)


def test_id_lines_are_decoded_by_the_engines_tokenizer(api, engine, prompts, greedy, tokenizer, tmp_path):
    ds = _dataset(tmp_path / "ids.jsonl", [{"input_ids": p, "output_tokens": 5} for p in prompts[:3]])
    base = ["bench", "serve", "--base-url", f"http://127.0.0.1:{api.port}/v1", "--dataset", str(ds),
            "--concurrency", "2", "--no-progress"]
    line = one_error_line(*cli(*base))
    assert f"{ds}:1" in line and "--tokenizer" in line
    out = tmp_path / "r.json"
    code, text = cli(*base, "--engine-dir", str(engine), "--json", str(out), "--save-outputs")
    assert code == 0, text
    lv = json.loads(out.read_text())["levels"][0]
    assert lv["prompt_tokens_differ"] == 0 and lv["input_tokens"] == sum(map(len, prompts[:3]))
    assert [o["text"] for o in lv["outputs"]] == [tokenizer.decode(g[:5]) for g in greedy[:3]]


def test_a_failed_request_is_counted_and_the_command_fails(api, text_dataset, tmp_path):
    lines = [json.loads(x) for x in text_dataset.read_text().splitlines()][:2]
    lines.append({"task_id": "huge", "prompt": " ".join([WORDS[20]] * 5000), "output_tokens": 4})   # > max_seq_len
    ds = _dataset(tmp_path / "bad.jsonl", lines)
    out = tmp_path / "r.json"
    code, text = cli("bench", "serve", "--base-url", f"http://127.0.0.1:{api.port}", "--dataset", str(ds),
                     "--concurrency", "2", "--json", str(out), "--no-progress")
    err = [ln for ln in text.splitlines() if ln.startswith("error: ")]
    assert code == 1 and len(err) == 1 and "1 of 3 requests failed at concurrency 2" in err[0], text
    assert "task huge: HTTP 400" in err[0], text
    lv = json.loads(out.read_text())["levels"][0]     # written before the command failed
    assert (lv["completed"], lv["failed"]) == (2, 1) and lv["errors"][0]["task_id"] == "huge"
    assert lv["output_tokens"] == 2 * MAX_NEW


def test_refusals_before_any_load(api, text_dataset, tmp_path):
    with socket.socket() as s:   # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ds = ["--dataset", str(text_dataset), "--no-progress"]
    line = one_error_line(*cli("bench", "serve", "--base-url", f"http://127.0.0.1:{port}", *ds))
    assert "--base-url" in line and "no OpenAI-compatible server answers" in line
    line = one_error_line(*cli("bench", "serve", "--base-url", f"http://127.0.0.1:{api.port}", "--model", "other", *ds))
    assert "the first request" in line and "HTTP 404" in line and "'tiny'" in line
    line = one_error_line(*cli("bench", "serve", "--base-url", "127.0.0.1:8000", *ds))
    assert "--base-url" in line and "http://HOST:PORT" in line
    line = one_error_line(*cli("bench", "serve", "--base-url", f"http://127.0.0.1:{api.port}", "--save-outputs", *ds))
    assert "--save-outputs" in line and "--json" in line
    line = one_error_line(*cli("bench", "serve", "--base-url", f"http://127.0.0.1:{api.port}", "--json",
                               str(text_dataset), *ds))
    assert "--json" in line and "nothing was written" in line
    other = tmp_path / "other.json"
    other.write_text('{"a": 1}\n')
    line = one_error_line(*cli("bench", "serve", "--base-url", f"http://127.0.0.1:{api.port}", "--json", str(other),
                               *ds))
    assert "not a `bench serve` report" in line and other.read_text() == '{"a": 1}\n'
    line = one_error_line(*cli("bench", "serve", "--base-url", f"http://127.0.0.1:{api.port}", "--request-rate", "0",
                               *ds))
    assert "--request-rate" in line
    line = one_error_line(*cli("serve", "--repository", str(tmp_path), "--target-only"))
    assert "--target-only: applies to --engine-dir only" in line


def test_request_rate_and_chat(api, text_dataset, tmp_path):
    out = tmp_path / "r.json"
    code, text = cli("bench", "serve", "--base-url", f"http://127.0.0.1:{api.port}", "--dataset", str(text_dataset),
                     "--concurrency", "2", "--request-rate", "40", "--burstiness", "0.5", "--num-requests", "4",
                     "--chat", "--json", str(out), "--no-progress")
    assert code == 0, text
    doc = json.loads(out.read_text())
    assert doc["endpoint"].endswith("/v1/chat/completions") and doc["settings"]["request_rate"] == 40.0
    lv = doc["levels"][0]
    assert lv["completed"] == 4 and lv["queue_s"] is not None and lv["queue_s"]["min"] >= 0
    assert lv["wall_s"] >= arrival_offsets(4, 40.0, 0.5, 0)[-1] > 0   # the last request was sent when it was due
    assert lv["tokens_per_event"]["mean"] > 1


def test_arrival_offsets():
    assert arrival_offsets(3, float("inf"), 1.0, 0) == [0.0, 0.0, 0.0]
    assert arrival_offsets(3, 10.0, float("inf"), 0) == [0.0, 0.1, 0.2]   # no burstiness: even gaps
    a = arrival_offsets(4000, 20.0, 1.0, 7)
    assert a == arrival_offsets(4000, 20.0, 1.0, 7) and a[0] == 0.0 and a == sorted(a)
    assert a[-1] / 3999 == pytest.approx(1 / 20, rel=0.05)          # the mean gap is 1 / rate
    gaps = [b - x for x, b in zip(a, a[1:])]
    bursty = arrival_offsets(4000, 20.0, 0.25, 7)
    bgaps = [b - x for x, b in zip(bursty, bursty[1:])]
    var = lambda g: sum((x - sum(g) / len(g)) ** 2 for x in g) / len(g)   # noqa: E731
    assert var(bgaps) > 2 * var(gaps)   # gamma shape 1/4: four times Poisson's variance at the same mean


def test_against_the_target_alone_served_the_speedup_and_identical_outputs(api, target_api, text_dataset, greedy,
                                                                           tokenizer, tmp_path):
    """The target alone (serve --target-only) is the target's greedy decoding, one token a step; as the baseline of
    the combined engine's server both emit the same texts, and the speedup is the ratio of their output tokens/s."""
    out = tmp_path / "ar.json"
    code, text = cli("bench", "serve", "--base-url", f"http://127.0.0.1:{api.port}", "--baseline-url",
                     f"http://127.0.0.1:{target_api.port}", "--dataset", str(text_dataset), "--concurrency", "1,4",
                     "--json", str(out), "--save-outputs", "--no-progress")
    assert code == 0, text
    doc = json.loads(out.read_text())
    assert doc["baseline"]["model"] == "tiny-target" and "baseline: http://127.0.0.1:" in text
    want = [tokenizer.decode(g[:MAX_NEW]) for g in greedy[:N]]
    for lv in doc["levels"]:
        ar = lv["baseline"]
        assert [o["text"] for o in ar["outputs"]] == want and [o["text"] for o in lv["outputs"]] == want
        assert ar["tokens_per_event"] == {"mean": 1.0, "events": N * (MAX_NEW - 1),
                                          "histogram": {"1": N * (MAX_NEW - 1)}}
        assert lv["outputs_identical"] == {"identical": N, "compared": N}
        assert lv["speedup"] == pytest.approx(lv["output_tokens_per_s"] / ar["output_tokens_per_s"])
    assert text.count("outputs identical 6/6") == 2, text
    line = one_error_line(*cli("bench", "serve", "--base-url", f"http://127.0.0.1:{api.port}", "--baseline-url",
                               f"http://127.0.0.1:{api.port}/v1", "--dataset", str(text_dataset)))
    assert "--baseline-url" in line and "the served endpoint itself" in line
    line = one_error_line(*cli("bench", "serve", "--base-url", f"http://127.0.0.1:{api.port}", "--baseline-model",
                               "x", "--dataset", str(text_dataset)))
    assert "--baseline-model" in line and "--baseline-url" in line


def test_compare_outputs():
    def done(i, text):
        s = Sent(i, i, start=1.0, end=2.0)
        s.events = [(1.5, 1, text)]
        return s

    a = [done(0, "x y"), done(1, "z"), done(2, "w")]
    b = [done(0, "x y"), done(1, "q"), Sent(2, 2, start=1.0, error="HTTP 500: boom")]
    assert compare_outputs(a, b) == {"identical": 1, "compared": 2}
