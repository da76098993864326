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


@pytest.fixture(scope="module")
def api(server_stream, tokenizer):
    """The API on the decoupled server, rendering chat with the engine's own tokenizer (the tiny pairs' template joins
    the messages' contents)."""
    f = OpenAIFrontend(server_stream.http_url, ensemble="ensemble", model="tiny", tokenizer=tokenizer,
                       max_seq_len=512).start()
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


def test_chat_default_max_tokens_is_what_max_seq_len_leaves(server_stream, tokenizer, prompts):
    p = prompts[3]
    f = OpenAIFrontend(server_stream.http_url, ensemble="ensemble", model="tiny", tokenizer=tokenizer,
                       max_seq_len=len(p) + 3).start()
    try:
        code, body = _call(f, "POST", "/v1/chat/completions", {"messages": [{"role": "user",
                                                                             "content": tokenizer.decode(p)}],
                                                               "temperature": 0})
        assert code == 200 and body["usage"]["completion_tokens"] == 3, body
        assert body["choices"][0]["finish_reason"] == "length"
    finally:
        f.close()


def test_sampling_follows_the_seed(api, prompts, tokenizer):
    """temperature defaults to 1 (the OpenAI API's): sampled, and the same seed samples the same text."""
    req = {"prompt": tokenizer.decode(prompts[4]), "max_tokens": 8, "seed": 7}
    a, b = (_call(api, "POST", "/v1/completions", req) for _ in range(2))
    assert a[0] == b[0] == 200 and a[1]["choices"][0]["text"] == b[1]["choices"][0]["text"]
    assert a[1]["usage"]["completion_tokens"] == 8


@pytest.mark.parametrize("path, body, status, says", [
    ("/v1/completions", {"prompt": "x", "frequency_penalty": 0.5}, 400, "frequency_penalty 0.5: not supported"),
    ("/v1/completions", {"prompt": "x", "n": 2}, 400, "n 2: not supported (one choice per request)"),
    ("/v1/completions", {"prompt": "x", "stop": ["puni"]}, 400, "no stop sequences"),
    ("/v1/completions", {"prompt": "x", "repetition_penalty": 1.1}, 400, "repetition_penalty: not a field"),
    ("/v1/completions", {"prompt": [5, 6, 7]}, 400, "token ids are not taken here"),
    ("/v1/completions", {"prompt": "puni", "model": "gpt-4"}, 404, "does not exist; this server serves 'tiny'"),
    ("/v1/completions", {"prompt": "puni", "max_tokens": 0}, 400, "max_tokens must be an integer >= 1"),
    ("/v1/completions", {"prompt": "puni", "temperature": -1}, 400, "temperature must be a finite number >= 0"),
    ("/v1/completions", {"prompt": "puni", "top_p": 0.5}, 400, "top_p 0.5: not supported"),   # the ensemble's line
    ("/v1/completions", {"prompt": "hello"}, 400, "'hello' is not in its vocabulary"),        # the ensemble's line
    ("/v1/completions", {"prompt": "puni", "stream_options": {"include_usage": True}}, 400, "applies to stream"),
    ("/v1/chat/completions", {"messages": []}, 400, "messages must be a non-empty list"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "puni"}], "tools": []}, 400,
     "tools: not a field"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400,
     "only text parts"),
])
def test_what_the_engine_cannot_do_is_refused_by_name(api, path, body, status, says):
    code, got = _call(api, "POST", path, body)
    assert code == status and says in got["error"]["message"], got
    assert set(got["error"]) == {"message", "type", "param", "code"}


def test_a_body_that_is_not_json_and_a_chat_without_template(api, server_stream, tmp_path):
    code, got = _call(api, "POST", "/v1/completions", raw="{not json")
    assert code == 400 and "not JSON" in got["error"]["message"]
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
