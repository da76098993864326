"""A real tritonserver (nvidia-pytriton's, on 127.0.0.1) serving the generated CPU repository.

Over HTTP and gRPC (tritonclient): every shipped prompt gives exactly the target's own greedy
continuation, as ids (tensorrt_llm) and as text (ensemble); streamed responses concatenate to the
non-streamed output; seeded sampling is reproducible; bad requests are errors that leave the server
serving; a bounded load of 200 requests at concurrency 4 and 16 (40 at 1) loses nothing and gets every
token right."""

from __future__ import annotations

import json
import queue
import urllib.error
import urllib.request

import numpy as np
import pytest

from dflash2_trt.sampling import GREEDY_REQUEST_TEMPERATURE

from deploy_helpers import MAX_NEW

pytestmark = pytest.mark.triton

grpcclient = pytest.importorskip("tritonclient.grpc")
httpclient = pytest.importorskip("tritonclient.http")
InferenceServerException = pytest.importorskip("tritonclient.utils").InferenceServerException


def _in(mod, name, arr, dt):
    x = mod.InferInput(name, list(arr.shape), dt)
    x.set_data_from_numpy(arr)
    return x


def ids_inputs(mod, prompt, max_new=MAX_NEW, **extra):
    # the tensorrt_llm model directly, as a TensorRT-LLM client: greedy is a positive temperature below 1e-5
    # (unset is TensorRT-LLM's 1.0, 0 is refused: engine_io.yaml request_temperature)
    extra.setdefault("temperature", GREEDY_REQUEST_TEMPERATURE)
    ins = [_in(mod, "input_ids", np.array([prompt], dtype=np.int32), "INT32"),
           _in(mod, "input_lengths", np.array([[len(prompt)]], dtype=np.int32), "INT32"),
           _in(mod, "request_output_len", np.array([[max_new]], dtype=np.int32), "INT32")]
    types = {bool: "BOOL", float: "FP32", int: "INT32"}
    for k, v in extra.items():
        if k == "seed":
            ins.append(_in(mod, k, np.array([[v]], dtype=np.uint64), "UINT64"))
        else:
            ins.append(_in(mod, k, np.array([[v]], dtype={bool: bool, float: np.float32, int: np.int32}[type(v)]),
                           types[type(v)]))
    return ins


def text_inputs(mod, text, max_new=MAX_NEW, **extra):
    ins = [_in(mod, "text_input", np.array([[text.encode()]], dtype=np.object_), "BYTES"),
           _in(mod, "max_tokens", np.array([[max_new]], dtype=np.int32), "INT32")]
    for k, v in extra.items():
        dt, np_dt = {bool: ("BOOL", bool), float: ("FP32", np.float32), int: ("UINT64", np.uint64)}[type(v)]
        if k != "seed" and type(v) is int:   # the ensemble's other integer inputs (top_k, end_id, ...) are INT32
            dt, np_dt = "INT32", np.int32
        ins.append(_in(mod, k, np.array([[v]], dtype=np_dt), dt))
    return ins


@pytest.fixture(scope="module")
def http(server_plain):
    c = httpclient.InferenceServerClient(server_plain.http_url, connection_timeout=60, network_timeout=120)
    yield c
    c.close()


@pytest.fixture(scope="module")
def grpc_plain(server_plain):
    c = grpcclient.InferenceServerClient(server_plain.grpc_url)
    yield c
    c.close()


class Stream:
    """One gRPC stream on the decoupled server; ``run`` returns a request's responses."""

    def __init__(self, url):
        self.client = grpcclient.InferenceServerClient(url)
        self.q: queue.Queue = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.q.put((result, error)))
        self.n = 0

    def run(self, model, inputs, timeout=60):
        self.n += 1
        rid = f"r{self.n}"
        self.client.async_stream_infer(model, inputs, request_id=rid, enable_empty_final_response=True)
        out = []
        while True:
            result, error = self.q.get(timeout=timeout)
            if error is not None:
                raise error
            assert result.get_response().id == rid
            out.append(result)
            if result.get_response().parameters["triton_final_response"].bool_param:
                return out

    def close(self):
        self.client.stop_stream()
        self.client.close()


@pytest.fixture(scope="module")
def stream(server_stream):
    s = Stream(server_stream.grpc_url)
    yield s
    s.close()


def _ids(result):
    ids = result.as_numpy("output_ids")
    assert ids.shape[:2] == (1, 1)
    n = int(result.as_numpy("sequence_length").reshape(-1)[0])
    return ids.reshape(-1)[:n].tolist()


def _text(result):
    return b"".join(result.as_numpy("text_output").reshape(-1)).decode()


def test_greedy_ids_over_http_and_grpc(http, grpc_plain, prompts, greedy):
    assert len(prompts) == len(greedy) >= 8
    for p, want in zip(prompts, greedy):
        assert _ids(http.infer("tensorrt_llm", ids_inputs(httpclient, p))) == want
        assert _ids(grpc_plain.infer("tensorrt_llm", ids_inputs(grpcclient, p))) == want


def test_greedy_text_over_http_and_grpc(http, grpc_plain, prompts, greedy, tokenizer):
    for p, want in zip(prompts, greedy):
        text, expect = tokenizer.decode(p), tokenizer.decode(want, skip_special_tokens=True)
        assert _text(http.infer("ensemble", text_inputs(httpclient, text))) == expect
        assert _text(grpc_plain.infer("ensemble", text_inputs(grpcclient, text))) == expect


def test_perf_metrics_and_token_counts(http, prompts, greedy):
    r = http.infer("tensorrt_llm", ids_inputs(httpclient, prompts[0], return_perf_metrics=True,
                                              return_num_input_tokens=True, return_num_output_tokens=True))
    drafts = int(r.as_numpy("total_draft_tokens").reshape(-1)[0])
    accepted = int(r.as_numpy("total_accepted_draft_tokens").reshape(-1)[0])
    rate = float(r.as_numpy("acceptance_rate").reshape(-1)[0])
    assert drafts > 0 and drafts % 7 == 0 and 0 <= accepted <= drafts
    assert rate == pytest.approx(accepted / drafts, rel=1e-6)
    # 1 token from the context step + per generation step (accepted drafts + 1), before the length cut
    assert 1 + accepted + drafts // 7 >= len(greedy[0]) > accepted + drafts // 7 - 7
    assert int(r.as_numpy("num_input_tokens").reshape(-1)[0]) == len(prompts[0])
    assert int(r.as_numpy("num_output_tokens").reshape(-1)[0]) == len(greedy[0])
    assert int(r.as_numpy("kv_cache_alloc_total_blocks").reshape(-1)[0]) >= 1      # declared, so returned
    assert int(r.as_numpy("kv_cache_reused_blocks").reshape(-1)[0]) == 0
    plain = http.infer("tensorrt_llm", ids_inputs(httpclient, prompts[0]))
    assert plain.as_numpy("acceptance_rate") is None     # only with return_perf_metrics, as TensorRT-LLM's
    e = http.infer("ensemble", text_inputs(httpclient, "bafe befu", return_perf_metrics=True))
    assert int(e.as_numpy("total_draft_tokens").reshape(-1)[0]) % 7 == 0


def test_streaming_concatenates_to_the_non_streamed_output(stream, http, prompts, greedy, tokenizer):
    for p, want in zip(prompts[:8], greedy):
        parts = stream.run("tensorrt_llm", ids_inputs(grpcclient, p, streaming=True, return_perf_metrics=True))
        chunks = [_ids(r) for r in parts]
        assert sum(chunks, []) == want and len(chunks) > 1 and chunks[0] == want[:1]
        one = stream.run("tensorrt_llm", ids_inputs(grpcclient, p))       # decoupled, not streaming: one response
        assert len(one) == 1 and _ids(one[0]) == want
        texts = [_text(r) for r in stream.run("ensemble", text_inputs(grpcclient, tokenizer.decode(p), stream=True))]
        whole = _text(http.infer("ensemble", text_inputs(httpclient, tokenizer.decode(p))))
        assert len(texts) == len(chunks) and "".join(texts) == whole == tokenizer.decode(want)


def test_http_generate_stream_endpoint(server_stream, prompts, greedy, tokenizer):
    body = json.dumps({"text_input": tokenizer.decode(prompts[0]), "max_tokens": MAX_NEW, "stream": True}).encode()
    req = urllib.request.Request(f"http://{server_stream.http_url}/v2/models/ensemble/generate_stream", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        events = [json.loads(line[len(b"data: "):]) for line in r.read().splitlines() if line.startswith(b"data: ")]
    assert len(events) > 1 and "".join(e["text_output"] for e in events) == tokenizer.decode(greedy[0])
    # a JSON field that names no input is a request parameter to Triton: refused, naming it (not ignored)
    code, body = _post(f"{server_stream.http_url}/v2/models/ensemble/generate_stream",
                       {"text_input": "puni kiku", "max_tokens": 4, "stream": True, "repetition_penalty": 5.0})
    assert code == 400 and "preprocessing: request parameter 'repetition_penalty': not an input" in body, body


def _post(url, body):
    """(status, body text) of a JSON POST."""
    req = urllib.request.Request(f"http://{url}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_request_parameters_are_refused_by_name(server_plain, http, grpc_plain, prompts, greedy, tokenizer):
    """Triton's /generate turns a JSON field that names no model input into a request parameter (and an ensemble
    forwards its parameters to every composing model): the models read none, so one is an error naming it, as an
    unknown input is, on every transport; Triton's own request options (priority, timeout) are not forwarded and
    still serve, and so does the server."""
    url = f"{server_plain.http_url}/v2/models"
    text = {"text_input": "puni kiku", "max_tokens": 4}
    code, body = _post(f"{url}/ensemble/generate", text)
    assert code == 200 and json.loads(body)["text_output"], body
    code, body = _post(f"{url}/ensemble/generate", {**text, "repetition_penalty": 5.0})
    assert code == 400 and "preprocessing: request parameter 'repetition_penalty': not an input of this model" in body
    code, body = _post(f"{url}/ensemble/generate", {**text, "min_tokens": 2, "lora_task_id": 3})
    assert code == 400 and "request parameters 'lora_task_id', 'min_tokens'" in body, body
    code, body = _post(f"{url}/tensorrt_llm/generate", {"input_ids": prompts[0], "input_lengths": len(prompts[0]),
                                                         "request_output_len": 4, "temperature": 1e-6, "foo": 1})
    assert code == 400 and "request parameter 'foo'" in body, body
    with pytest.raises(InferenceServerException, match="request parameter 'num_return_sequences'"):
        grpc_plain.infer("ensemble", text_inputs(grpcclient, "puni kiku"), parameters={"num_return_sequences": 2})
    with pytest.raises(InferenceServerException, match="request parameter 'bad_words'"):
        http.infer("tensorrt_llm", ids_inputs(httpclient, prompts[0]), parameters={"bad_words": "x"})
    want = tokenizer.decode(greedy[0])
    assert _text(http.infer("ensemble", text_inputs(httpclient, tokenizer.decode(prompts[0])), priority=1,
                            timeout=10 ** 8)) == want
    assert _text(grpc_plain.infer("ensemble", text_inputs(grpcclient, tokenizer.decode(prompts[0])), priority=1,
                                  timeout=10 ** 8)) == want


def test_the_ensemble_decodes_greedily_at_0_and_without_a_temperature(http, prompts, greedy, tokenizer):
    """The ensemble's preprocessing hands the engine a greedy request temperature for a client's 0, a tiny one or
    none (TensorRT-LLM alone would sample at 1.0 or refuse 0), or top_k 1, and refuses a negative one."""
    text = tokenizer.decode(prompts[0])
    for extra in ({}, {"temperature": 0.0}, {"temperature": 1e-7}):
        assert _text(http.infer("ensemble", text_inputs(httpclient, text, **extra))) == tokenizer.decode(greedy[0])
    with pytest.raises(InferenceServerException, match="TEMPERATURE must be a finite number >= 0"):
        http.infer("ensemble", text_inputs(httpclient, text, temperature=-1.0))
    # a sampling temperature goes through unchanged: the ensemble's draw is the tensorrt_llm model's at the same
    # temperature and seed (and not the greedy output)
    drawn = _ids(http.infer("tensorrt_llm", ids_inputs(httpclient, prompts[0], temperature=1.0, seed=11)))
    via = _text(http.infer("ensemble", text_inputs(httpclient, text, temperature=1.0, seed=11)))
    assert via == tokenizer.decode(drawn) and drawn != greedy[0]
    # top_k 1 is greedy at that same temperature and seed (preprocessing makes it so for every backend), and top_k 0
    # leaves the draw as it was; a top_k the engine cannot honour is refused by name
    assert _text(http.infer("ensemble", text_inputs(httpclient, text, temperature=1.0, seed=11, top_k=1))) == \
        tokenizer.decode(greedy[0])
    assert _text(http.infer("ensemble", text_inputs(httpclient, text, temperature=1.0, seed=11, top_k=0))) == via
    with pytest.raises(InferenceServerException, match="top_k 5: not supported") as e:
        http.infer("ensemble", text_inputs(httpclient, text, temperature=1.0, top_k=5))
    assert e.value.status() == "400"
    # the python tensorrt_llm model makes runtime_top_k 1 greedy by itself; behind the tensorrtllm backend only
    # preprocessing does: its own output, asked directly, is the greedy request temperature
    pre = [_in(httpclient, "QUERY", np.array([[text.encode()]], dtype=np.object_), "BYTES"),
           _in(httpclient, "REQUEST_OUTPUT_LEN", np.array([[4]], dtype=np.int32), "INT32"),
           _in(httpclient, "TEMPERATURE", np.array([[1.0]], dtype=np.float32), "FP32")]
    sampled = http.infer("preprocessing", pre).as_numpy("OUT_TEMPERATURE").item()
    greedy_t = http.infer("preprocessing", pre + [_in(httpclient, "TOP_K", np.array([[1]], dtype=np.int32), "INT32")]
                          ).as_numpy("OUT_TEMPERATURE").item()
    assert sampled == 1.0 and greedy_t == np.float32(GREEDY_REQUEST_TEMPERATURE)


def test_seeded_sampling_is_reproducible(http, stream, prompts):
    def sample(seed, client=http, mod=httpclient):
        return _ids(client.infer("tensorrt_llm", ids_inputs(mod, prompts[3], 24, temperature=1.0, seed=seed)))

    a, b, c = sample(7), sample(7), sample(8)
    assert a == b and len(a) == 24
    assert a != c   # another seed, another draw (24 tokens at T = 1: equal only by a fluke of ~0)
    streamed = stream.run("tensorrt_llm", ids_inputs(grpcclient, prompts[3], 24, temperature=1.0, seed=7,
                                                     streaming=True))
    assert sum((_ids(r) for r in streamed), []) == a   # the same draw whatever the transport and batching


@pytest.mark.parametrize("extra,needle", [
    ({"beam_width": 2}, "beam_width: 2 is not supported"),
    ({"streaming": True}, "streaming needs a decoupled model"),
    ({"temperature": -1.0}, "temperature"),
    ({"temperature": 0.0}, "0 is refused by TensorRT-LLM's EAGLE decoding layer"),   # as its backend would fail it
])
def test_bad_requests_are_errors_and_the_server_keeps_serving(http, grpc_plain, prompts, greedy, extra, needle):
    # the request's own fault: HTTP 400 / gRPC INVALID_ARGUMENT (a 500 / INTERNAL reads as the server's to a client's
    # retry logic), through the ensemble too
    with pytest.raises(InferenceServerException, match=needle) as e:
        http.infer("tensorrt_llm", ids_inputs(httpclient, prompts[0], **extra))
    assert e.value.status() == "400"
    with pytest.raises(InferenceServerException, match=needle) as e:
        grpc_plain.infer("tensorrt_llm", ids_inputs(grpcclient, prompts[0], **extra))
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    with pytest.raises(InferenceServerException, match="outside the vocabulary"):
        http.infer("tensorrt_llm", ids_inputs(httpclient, [5, 999]))
    with pytest.raises(InferenceServerException, match=r"cannot encode the text \(QUERY\): the word 'hello' is not in its vocabulary") as e:
        http.infer("ensemble", text_inputs(httpclient, "hello"))
    assert e.value.status() == "400"
    assert _ids(http.infer("tensorrt_llm", ids_inputs(httpclient, prompts[0]))) == greedy[0]


def test_bad_streaming_request_ends_its_stream_with_an_error(stream, prompts, greedy):
    with pytest.raises(InferenceServerException, match="request_output_len: must be >= 1"):
        stream.run("tensorrt_llm", ids_inputs(grpcclient, prompts[0], 0, streaming=True))
    parts = stream.run("tensorrt_llm", ids_inputs(grpcclient, prompts[0], streaming=True))
    assert sum((_ids(r) for r in parts), []) == greedy[0]


def test_bounded_load(server_stream, prompts, greedy):
    """120 requests at concurrency 4 and 16, 20 of them one at a time: nothing lost, every token the target's."""
    from dflash2_trt.deploy.triton.load import LoadRequest, render, run_load

    reqs = [LoadRequest(prompts[i % len(prompts)], MAX_NEW, greedy[i % len(prompts)]) for i in range(120)]
    # one at a time, 200 requests took 42 s of the suite and showed nothing 20 do not: the requests cycle through the
    # prompts, so 20 (2 cycles of 10) are a sixth of the 120 prompt for prompt. 120 at concurrency 16 keep 16 in
    # flight for 7 rounds (200: 19 s of the suite, the slowest test; 120 show nothing less)
    assert len(reqs) % len(prompts) == 0 and 20 % len(prompts) == 0
    sizes = {1: 20, 4: len(reqs), 16: len(reqs)}
    reports = {}
    for c, n in sizes.items():
        rep = run_load(server_stream.grpc_url, reqs[:n], c, K=7, timeout=60)
        print(render(rep))
        assert rep["requests"] == n and rep["output_tokens"] == sum(len(r.expected) for r in reqs[:n])
        reports[c] = rep
    # the same greedy requests accept the same drafts however they are batched (the 20 are a sixth of the 120)
    scaled = {(r["total_accepted_draft_tokens"] * (len(reqs) // sizes[c]),
               r["total_draft_tokens"] * (len(reqs) // sizes[c])) for c, r in reports.items()}
    assert len(scaled) == 1, scaled
    # in-flight batching across requests: more requests per second with more of them in flight
    assert reports[16]["requests_per_s"] > 1.5 * reports[1]["requests_per_s"]


def test_a_short_request_does_not_wait_for_a_long_one_without_decoupling(server_plain, prompts):
    """Not decoupled, the model still batches in flight: a 1-token request sent while a 300-token one is being
    decoded is answered first (the model answers each request through its sender when it ends, as TensorRT-LLM's
    backend does; a model that returned its batch's responses from execute() held the short one until the long one
    ended: a reviewer's 3-token request took 4.7 s)."""
    import threading
    import time

    done: dict[str, float] = {}

    def ask(name, max_new):
        c = httpclient.InferenceServerClient(server_plain.http_url, connection_timeout=60, network_timeout=120)
        try:   # end_id -1: no end token stops it, so the long one runs its 300 tokens
            c.infer("tensorrt_llm", ids_inputs(httpclient, prompts[1], max_new, end_id=-1))
            done[name] = time.monotonic()
        finally:
            c.close()

    long = threading.Thread(target=ask, args=("long", 300))
    long.start()
    time.sleep(0.5)
    assert "long" not in done, "the long request ended before the short one was sent: nothing was tested"
    ask("short", 1)
    long.join(timeout=120)
    assert set(done) == {"long", "short"}
    assert done["short"] < done["long"], done


def test_tensorrt_llms_own_example_request_runs(server_plain, prompts, greedy, tokenizer):
    """The request TensorRT-LLM's Triton guide has users send first (`bad_words` and `stop_words` empty) runs and gives
    the target's tokens; a word in bad_words is refused in one 400 naming it (banning words is logits processing)."""
    url = f"{server_plain.http_url}/v2/models/ensemble/generate"
    text = tokenizer.decode(prompts[0])
    code, body = _post(url, {"text_input": text, "max_tokens": MAX_NEW, "bad_words": "", "stop_words": ""})
    assert code == 200, body
    assert json.loads(body)["text_output"] == tokenizer.decode(greedy[0], skip_special_tokens=True)
    code, body = _post(url, {"text_input": text, "max_tokens": MAX_NEW, "bad_words": "puni", "stop_words": ""})
    assert code == 400 and "bad_words ['puni']: not supported" in body, body
