"""``serve --openai-port``: the OpenAI-compatible API in front of the ensemble, against the real tritonserver serving
the tiny engine (decoupled: in-flight batching, streamed responses). Greedy outputs are held to the target's own greedy
decoding; a chat request's rendered prompt to the target's decoding of the rendered ids."""

from __future__ import annotations

import http.client
import json
import shutil

import pytest

from deploy_helpers import MAX_NEW
from dflash2_trt.assets import trained_pair
from dflash2_trt.assets.phrase_tokenizer import WORDS
from dflash2_trt.deploy.triton.openai_api import OpenAIFrontend
from dflash2_trt.tokenizer import find_tokenizer

pytestmark = pytest.mark.triton
pytest.importorskip("pytriton")

USER, GEN = 10, 11
TEMPLATE = ("{% for m in messages %}{% if not loop.first %} {% endif %}"
            f"{{% if m['role'] == 'user' %}}{WORDS[USER]} {{% endif %}}{{{{ m['content'] }}}}{{% endfor %}}"
            f"{{% if add_generation_prompt %}} {WORDS[GEN]}{{% endif %}}")


def _limits(engine):
    man = json.loads((engine / "engine.json").read_text())
    return {"max_seq_len": man["limits"]["max_seq_len"], "block_size": man["block_size"]}


@pytest.fixture(scope="module")
def api(server_stream, tokenizer, engine):
    """The API on the decoupled server, rendering chat with the engine's own tokenizer (the tiny pairs' template joins
    the messages' contents), with the engine's limits (as serve reads them from engine.json)."""
    f = OpenAIFrontend(server_stream.http_url, ensemble="ensemble", model="tiny", tokenizer=tokenizer,
                       **_limits(engine)).start()
    yield f
    f.close()


@pytest.fixture(scope="module")
def chat_api(server_stream, tmp_path_factory):
    """The same server, rendering chat with a template that marks the user's turn and opens the assistant's."""
    d = tmp_path_factory.mktemp("openai") / "tok"
    shutil.copytree(trained_pair("qwen3").target_dir, d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["chat_template"] = TEMPLATE
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    f = OpenAIFrontend(server_stream.http_url, ensemble="ensemble", model="tiny-chat", tokenizer=find_tokenizer(d),
                       max_seq_len=None).start()
    yield f
    f.close()


def _call(f, method, path, body=None, raw=None):
    """(status, JSON body or the list of server-sent events) of one request to the API ``f``."""
    c = http.client.HTTPConnection("127.0.0.1", f.port, timeout=120)
    try:
        data = raw if raw is not None else None if body is None else json.dumps(body)
        c.request(method, path, data, {"Content-Type": "application/json"})
        r = c.getresponse()
        text = r.read().decode()
        if r.getheader("Content-Type", "").startswith("text/event-stream"):
            return r.status, [ln[len("data: "):] for ln in text.split("\n") if ln.startswith("data: ")]
        return r.status, json.loads(text)
    finally:
        c.close()


def test_models_and_routes(api):
    code, body = _call(api, "GET", "/v1/models")
    assert code == 200 and [m["id"] for m in body["data"]] == ["tiny"] and body["object"] == "list"
    assert _call(api, "GET", "/health")[0] == 200
    code, body = _call(api, "POST", "/v1/embeddings", {"input": "x"})
    assert code == 404 and body["error"]["type"] == "not_found_error"


def test_completion_is_the_targets_greedy_decoding(api, prompts, greedy, tokenizer):
    text = tokenizer.decode(prompts[0])
    code, body = _call(api, "POST", "/v1/completions", {"model": "tiny", "prompt": text, "max_tokens": MAX_NEW,
                                                         "temperature": 0})
    assert code == 200, body
    ch = body["choices"][0]
    assert ch["text"] == tokenizer.decode(greedy[0][:MAX_NEW]) and ch["finish_reason"] == "length"
    assert body["object"] == "text_completion" and body["model"] == "tiny" and body["id"].startswith("cmpl-")
    assert body["usage"] == {"prompt_tokens": len(prompts[0]), "completion_tokens": MAX_NEW,
                             "total_tokens": len(prompts[0]) + MAX_NEW}


def test_streamed_completion_and_usage(api, prompts, greedy, tokenizer):
    code, events = _call(api, "POST", "/v1/completions", {"prompt": tokenizer.decode(prompts[1]), "max_tokens": MAX_NEW,
                                                          "temperature": 0, "stream": True,
                                                          "stream_options": {"include_usage": True}})
    assert code == 200 and events[-1] == "[DONE]", events
    chunks = [json.loads(e) for e in events[:-1]]
    assert len(chunks) > 3   # one chunk per engine step, not one for the whole output
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == tokenizer.decode(greedy[1][:MAX_NEW])
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == MAX_NEW
    assert chunks[-1]["usage"]["prompt_tokens"] == len(prompts[1]) and len({c["id"] for c in chunks}) == 1


def test_chat_renders_the_template_then_decodes_as_the_target(chat_api, prompts, tokenizer, target):
    from dflash2_trt.reference.loop import target_generate

    p = prompts[2]
    want = target_generate(target, [USER, *p, GEN], 6)
    msgs = [{"role": "user", "content": tokenizer.decode(p).strip()}]
    code, body = _call(chat_api, "POST", "/v1/chat/completions", {"messages": msgs, "max_tokens": 6,
                                                                  "temperature": 0})
    assert code == 200, body
    assert body["choices"][0]["message"] == {"role": "assistant", "content": tokenizer.decode(want)}
    assert body["object"] == "chat.completion" and body["usage"]["prompt_tokens"] == len(p) + 2
    code, events = _call(chat_api, "POST", "/v1/chat/completions", {"messages": msgs, "max_completion_tokens": 6,
                                                                    "temperature": 0, "stream": True})
    chunks = [json.loads(e) for e in events[:-1]]
    assert code == 200 and events[-1] == "[DONE]" and chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == tokenizer.decode(want)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length" and chunks[-1]["object"] == "chat.completion.chunk"
    # text parts are joined as one content
    parts = [{"role": "user", "content": [{"type": "text", "text": tokenizer.decode(p[:3]).strip()},
                                          {"type": "text", "text": tokenizer.decode(p[3:])}]}]
    code, body = _call(chat_api, "POST", "/v1/chat/completions", {"messages": parts, "max_tokens": 6,
                                                                  "temperature": 0})
    assert code == 200 and body["choices"][0]["message"]["content"] == tokenizer.decode(want), body


def test_the_length_limit(api, engine, tokenizer, prompts):
    """A chat completion's default max_tokens is what max_seq_len leaves after the prompt and the step's draft slots;
    a max_tokens past that is shortened by the engine's model (as TensorRT-LLM's executor shortens it) and the output
    still ends with finish_reason "length"."""
    from concurrent.futures import ThreadPoolExecutor

    lim = _limits(engine)
    p = prompts[3]
    room = lim["max_seq_len"] - len(p) - lim["block_size"]
    calls = (("/v1/chat/completions", {"messages": [{"role": "user", "content": tokenizer.decode(p)}]}),
             ("/v1/completions", {"prompt": tokenizer.decode(p), "max_tokens": 5000}))
    with ThreadPoolExecutor(2) as pool:   # both at once: the engine batches them (half the suite's time)
        answers = list(pool.map(lambda c: _call(api, "POST", c[0], {**c[1], "temperature": 0}), calls))
    for code, got in answers:
        assert code == 200 and got["usage"]["completion_tokens"] == room, got["usage"]
        assert got["choices"][0]["finish_reason"] == "length"


def test_stop_strings_end_the_output_and_are_left_out(api, prompts, greedy, tokenizer):
    g = greedy[0]
    j = next(j for j in range(2, len(g)) if g[j] not in g[:j])   # the first place its word is generated
    stop = WORDS[g[j]]
    want = tokenizer.decode(g[:j + 1])[:-len(stop)]
    other = WORDS[next(w for w in range(3, 255) if w not in g)]   # a second stop string that never comes
    req = {"prompt": tokenizer.decode(prompts[0]), "max_tokens": MAX_NEW, "temperature": 0, "stop": [other, stop]}
    code, body = _call(api, "POST", "/v1/completions", req)
    assert code == 200 and body["choices"][0]["text"] == want, body
    assert body["choices"][0]["finish_reason"] == "stop" and body["usage"]["completion_tokens"] == j + 1
    code, events = _call(api, "POST", "/v1/completions", {**req, "stop": stop, "stream": True})
    chunks = [json.loads(e) for e in events[:-1]]
    assert code == 200 and "".join(c["choices"][0]["text"] for c in chunks) == want, chunks
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_a_stop_string_whose_tokens_decode_otherwise(api, prompts, greedy, tokenizer):
    """The engine matches a stop string's tokens: "w\\n" encodes to w's token, which decodes to " w"; that text is
    what the output ends with, and what is left out."""
    g = greedy[0]
    j = next(j for j in range(2, len(g)) if g[j] not in g[:j])
    req = {"prompt": tokenizer.decode(prompts[0]), "max_tokens": MAX_NEW, "temperature": 0,
           "stop": WORDS[g[j]] + "\n"}
    for stream in (False, True):
        code, got = _call(api, "POST", "/v1/completions", {**req, "stream": stream})
        chunks = [json.loads(e) for e in got[:-1]] if stream else [got]
        assert code == 200 and "".join(c["choices"][0]["text"] for c in chunks) == tokenizer.decode(g[:j]), got
        assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    code, got = _call(api, "POST", "/v1/completions", {**req, "stop": " "})
    assert code == 400 and "the stop word ' ' (STOP_WORDS_DICT) encodes to no tokens" in got["error"]["message"], got


def test_a_stream_triton_cut_off_is_an_error_not_an_end():
    """http.client ends a chunked body whose last chunk never came as if it were complete: the API says 503."""
    import socket
    import threading

    from dflash2_trt.deploy.triton.openai_api import ApiError, _events

    event = b'data: {"text_output": " puni"}\n\n'
    for complete in (True, False):
        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen()

        def answer():
            conn, _ = srv.accept()
            conn.recv(65536)
            body = b"%x\r\n%s\r\n" % (len(event), event) + (b"0\r\n\r\n" if complete else b"")
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                         + body)
            conn.close()

        t = threading.Thread(target=answer)
        t.start()
        c = http.client.HTTPConnection("127.0.0.1", srv.getsockname()[1], timeout=10)
        c.request("POST", "/v2/models/ensemble/generate_stream", "{}")
        r = c.getresponse()
        if complete:
            assert [e["text_output"] for e in _events(r)] == [" puni"]
        else:
            with pytest.raises(ApiError) as e:
                list(_events(r))
            assert e.value.status == 503 and "ended the response before it was complete" in e.value.message
        c.close()
        t.join()
        srv.close()


def test_many_clients_at_once(api, prompts, tokenizer):
    """A burst of connections (a load tool's) is queued, not refused: http.server's default backlog of 5 dropped
    clients under such a burst."""
    from concurrent.futures import ThreadPoolExecutor

    req = {"prompt": tokenizer.decode(prompts[5]), "max_tokens": 1, "temperature": 0}
    with ThreadPoolExecutor(64) as pool:
        got = list(pool.map(lambda _: _call(api, "POST", "/v1/completions", req)[0], range(128)))
    assert got == [200] * 128


def test_neutral_values_of_fields_load_tools_send(api, prompts, tokenizer, greedy):
    """vLLM's and SGLang's benchmark clients send these at their neutral values: taken, and the output is the greedy
    one."""
    req = {"prompt": tokenizer.decode(prompts[0]), "max_tokens": 4, "temperature": 0, "repetition_penalty": 1.0,
           "ignore_eos": True, "best_of": 1, "n": None, "top_k": -1, "min_tokens": 0, "logprobs": None, "user": "u",
           "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    code, events = _call(api, "POST", "/v1/completions", req)
    chunks = [json.loads(e) for e in events[:-1]]
    assert code == 200 and "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == \
        tokenizer.decode(greedy[0][:4]), chunks
    assert all("usage" in c for c in chunks)
    code, body = _call(api, "POST", "/v1/chat/completions", {
        "messages": [{"role": "user", "content": tokenizer.decode(prompts[0])}], "max_tokens": 4, "temperature": 0,
        "tool_choice": "none", "tools": [], "response_format": {"type": "text"}, "parallel_tool_calls": False,
        "store": False, "metadata": {"k": "v"}, "max_completion_tokens": 4, "reasoning_effort": None,
        "suffix": None})
    assert code == 200 and body["choices"][0]["message"]["content"] == tokenizer.decode(greedy[0][:4]), body


def test_sampling_follows_the_seed(api, prompts, tokenizer):
    """temperature defaults to 1 (the OpenAI API's): sampled, and the same seed samples the same text."""
    req = {"prompt": tokenizer.decode(prompts[4]), "max_tokens": 8, "seed": 7}
    a, b = (_call(api, "POST", "/v1/completions", req) for _ in range(2))
    assert a[0] == b[0] == 200 and a[1]["choices"][0]["text"] == b[1]["choices"][0]["text"]
    assert a[1]["usage"]["completion_tokens"] == 8


@pytest.mark.parametrize("path, body, status, says", [
    ("/v1/completions", {"prompt": "x", "frequency_penalty": 0.5}, 400, "frequency_penalty 0.5: not supported"),
    ("/v1/completions", {"prompt": "x", "n": 2}, 400, "n 2: not supported (one choice per request)"),
    ("/v1/completions", {"prompt": "x", "stop": [""]}, 400, "stop must be a non-empty string"),
    ("/v1/completions", {"prompt": "x", "repetition_penalty": 1.1}, 400, "repetition_penalty 1.1: not supported"),
    ("/v1/completions", {"prompt": "x", "n": True}, 400, "n true: not supported"),
    ("/v1/completions", {"prompt": "x", "logprobs": 0}, 400, "logprobs 0: not supported"),
    ("/v1/completions", {"prompt": "x", "stream": 0}, 400, "stream must be true or false"),
    ("/v1/completions", {"prompt": "x", "frobnicate": 1}, 400, "frobnicate: not a field this server takes"),
    ("/v1/completions", {"prompt": "puni", "top_p": 0}, 400, "top_p must be a finite number in (0, 1]"),
    ("/v1/completions", {"prompt": "puni", "seed": 2**70}, 400, "seed must be an integer in [0, "),
    ("/v1/completions", {"prompt": "hello", "stream": True}, 400, "'hello' is not in its vocabulary"),
    ("/v1/completions", {"prompt": [5, 6, 7]}, 400, "token ids are not taken here"),
    ("/v1/completions", {"prompt": "puni", "model": "gpt-4"}, 404, "does not exist; this server serves 'tiny'"),
    ("/v1/completions", {"prompt": "puni", "max_tokens": 0}, 400, "max_tokens must be an integer in [1, "),
    ("/v1/completions", {"prompt": "puni", "temperature": -1}, 400, "temperature must be a finite number >= 0"),
    ("/v1/completions", {"prompt": "puni", "top_p": 0.5}, 400, "top_p 0.5: not supported"),   # the ensemble's line
    ("/v1/completions", {"prompt": "hello"}, 400, "'hello' is not in its vocabulary"),        # the ensemble's line
    ("/v1/completions", {"prompt": "puni", "stream_options": {"include_usage": True}}, 400, "applies to stream"),
    ("/v1/chat/completions", {"messages": []}, 400, "messages must be a non-empty list"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "puni"}], "tools": [{"type": "function"}]},
     400, "no tools"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hello"}]}, 400,
     "'hello' is not in its vocabulary"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400,
     "only text parts"),
])
def test_what_the_engine_cannot_do_is_refused_by_name(api, path, body, status, says):
    code, got = _call(api, "POST", path, body)
    assert code == status and says in got["error"]["message"], got
    assert not got["error"]["message"].startswith("data:"), got   # a streamed request's error too: the message alone
    assert set(got["error"]) == {"message", "type", "param", "code"}


def test_a_body_that_is_not_json_and_a_chat_without_template(api, server_stream, tmp_path):
    code, got = _call(api, "POST", "/v1/completions", raw="{not json")
    assert code == 400 and "not JSON" in got["error"]["message"]
    c = http.client.HTTPConnection("127.0.0.1", api.port, timeout=30)
    c.putrequest("POST", "/v1/completions")
    c.putheader("Content-Length", "abc")
    c.endheaders()
    r = c.getresponse()
    assert r.status == 400 and "numeric Content-Length" in json.loads(r.read())["error"]["message"]
    c.close()
    assert _call(api, "GET", "/v1/completions")[0] == 405 and _call(api, "DELETE", "/v1/models")[0] == 405
    d = tmp_path / "tok"
    shutil.copytree(trained_pair("qwen3").target_dir, d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    del cfg["chat_template"]
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    f = OpenAIFrontend(server_stream.http_url, ensemble="ensemble", model="t", tokenizer=find_tokenizer(d)).start()
    try:
        code, got = _call(f, "POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "puni"}]})
        assert code == 400 and "has no chat template" in got["error"]["message"], got
    finally:
        f.close()
