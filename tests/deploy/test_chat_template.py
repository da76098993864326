"""``--chat``: prompt text goes through the target tokenizer's chat template (one user message, the assistant's turn
opened) before it is encoded, alike in ``run``, ``generate``, ``analyze`` and ``bench prepare-dataset``.

The tiny pairs' own template joins the messages' contents (their language has no roles), so a template that adds
words of the language around the message stands in for a chat model's: what it renders is known word by word, and
the engine's output on the rendered prompt is held to the target's own greedy decoding of those ids."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from click.testing import CliRunner

from dflash2_trt.assets import trained_pair
from dflash2_trt.assets.phrase_tokenizer import WORDS
from dflash2_trt.cli import main
from dflash2_trt.errors import ConfigError
from dflash2_trt.tokenizer import ChatFormat, encode_text, find_tokenizer

USER, GEN, THINK, ASSISTANT = 10, 11, 12, 13   # word ids the template writes
TEMPLATE = ("{% for m in messages %}{% if not loop.first %} {% endif %}"
            f"{{% if m['role'] == 'user' %}}{WORDS[USER]} {{% else %}}{WORDS[ASSISTANT]} {{% endif %}}"
            "{{ m['content'] }}{% endfor %}"
            f"{{% if add_generation_prompt %}} {WORDS[GEN]}{{% endif %}}"
            f"{{% if enable_thinking %}} {WORDS[THINK]}{{% endif %}}")
NEW = 8


def _with_template(directory, template):
    """Set (or, with None, remove) ``chat_template`` in ``directory``'s tokenizer_config.json."""
    p = directory / "tokenizer_config.json"
    cfg = json.loads(p.read_text())
    cfg.pop("chat_template", None)
    if template is not None:
        cfg["chat_template"] = template
    p.write_text(json.dumps(cfg, indent=2))


@pytest.fixture(scope="module")
def chat_target_dir(tmp_path_factory):
    """The tiny qwen3 target directory with a chat template that marks the user's turn and opens the assistant's."""
    out = tmp_path_factory.mktemp("chat") / "target"
    shutil.copytree(trained_pair("qwen3").target_dir, out)
    _with_template(out, TEMPLATE)
    return out


@pytest.fixture(scope="module")
def chat_engine(tmp_path_factory, chat_target_dir):
    """A cpu engine of that target (its tokenizer copy carries the template)."""
    out = tmp_path_factory.mktemp("chat") / "engine"
    r = _run("build", "--drafter", trained_pair("qwen3").drafter_dir, "--target-dir", chat_target_dir, "--backend",
             "cpu", "--output", out, "--max-batch-size", 4)
    assert r.exit_code == 0, r.output
    return out


def _engine_with_template(chat_engine, tmp_path, name, template):
    """A copy of ``chat_engine`` whose tokenizer has ``template`` (engine.json's sizes and hashes follow the edit, as a
    rebuild from such a target would write them)."""
    import hashlib

    eng = tmp_path / name
    shutil.copytree(chat_engine, eng)
    _with_template(eng / "tokenizer", template)
    man = json.loads((eng / "engine.json").read_text())
    data = (eng / "tokenizer" / "tokenizer_config.json").read_bytes()
    man["files"]["tokenizer/tokenizer_config.json"].update(size=len(data), sha256=hashlib.sha256(data).hexdigest())
    (eng / "engine.json").write_text(json.dumps(man, indent=2))
    return eng


def _run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_encode_text_renders_the_template_first(chat_engine, prompts, tokenizer):
    tok = find_tokenizer(chat_engine / "tokenizer")
    p = prompts[0]
    text = tokenizer.decode(p)
    assert encode_text(tok, text) == p                                         # without --chat: the text as it is
    assert encode_text(tok, text, chat=ChatFormat()) == [USER, *p, GEN]
    assert encode_text(tok, text, chat=ChatFormat(enable_thinking=True)) == [USER, *p, GEN, THINK]


def test_run_chat_decodes_the_rendered_prompt_as_the_target_does(chat_engine, prompts, tokenizer, target):
    from dflash2_trt.reference.loop import target_generate

    p = prompts[1]
    rendered = [USER, *p, GEN]
    r = _run("run", "--engine-dir", chat_engine, "--prompt", tokenizer.decode(p), "--chat", "--max-new-tokens", NEW,
             "--json")
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["chat_template"] == {"add_generation_prompt": True, "enable_thinking": False}
    req = rep["requests"][0]
    assert req["prompt_len"] == len(rendered)
    assert req["output_ids"] == target_generate(target, rendered, NEW)   # the target's own greedy decoding
    # the same ids given as ids: the same output, and no chat_template in that report
    r2 = _run("run", "--engine-dir", chat_engine, "--prompt-ids", ",".join(map(str, rendered)), "--max-new-tokens",
              NEW, "--json")
    assert r2.exit_code == 0, r2.output
    rep2 = json.loads(r2.stdout)
    assert rep2["requests"][0]["output_ids"] == req["output_ids"] and "chat_template" not in rep2
    # the text report says it
    r3 = _run("run", "--engine-dir", chat_engine, "--prompt", tokenizer.decode(p), "--chat", "--enable-thinking",
              "--max-new-tokens", 2)
    assert r3.exit_code == 0, r3.output
    assert "as a user message through the target's chat template, enable_thinking true" in r3.stdout
    assert f"prompt {len(rendered) + 1} tokens" in r3.stdout


def test_run_chat_renders_the_text_lines_of_a_prompts_file_only(chat_engine, prompts, tokenizer, tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"task_id": "t", "prompt": tokenizer.decode(prompts[2])}) + "\n"
                 + json.dumps({"task_id": "i", "input_ids": prompts[3]}) + "\n")
    r = _run("run", "--engine-dir", chat_engine, "--prompts", f, "--chat", "--max-new-tokens", 1, "--json")
    assert r.exit_code == 0, r.output
    lens = {q["task_id"]: q["prompt_len"] for q in json.loads(r.stdout)["requests"]}
    assert lens == {"t": len(prompts[2]) + 2, "i": len(prompts[3])}


@pytest.mark.parametrize("args, says", [
    (["--prompt-ids", "5,6,7", "--chat"], "error: --chat: puts prompt text through the chat template, but every "
                                          "prompt here is token ids"),
    (["--prompt", WORDS[5], "--enable-thinking"], "error: --enable-thinking: is a chat template variable: give --chat"),
])
def test_run_refuses_chat_options_that_would_do_nothing(chat_engine, args, says):
    r = _run("run", "--engine-dir", chat_engine, *args)
    assert r.exit_code == 1 and r.output.startswith(says) and r.output.count("\n") == 1, r.output


def test_a_tokenizer_without_a_template_or_a_failing_one_is_one_line(tmp_path, chat_engine):
    for name, template, says in (("none", None, "has no chat template"),
                                 ("raises", "{{ raise_exception('one turn only') }}", "failed on the messages: "
                                                                                      ".*one turn only")):
        eng = _engine_with_template(chat_engine, tmp_path, name, template)
        r = _run("run", "--engine-dir", eng, "--prompt", WORDS[5], "--chat")
        assert r.exit_code == 1 and r.output.startswith("error: --prompt: --chat: the tokenizer"), r.output
        assert r.output.count("\n") == 1 and re.search(says, r.output), r.output
        with pytest.raises(ConfigError, match=says):
            encode_text(find_tokenizer(eng / "tokenizer"), WORDS[5], chat=ChatFormat())


def test_the_shipped_tiny_template_renders_the_text_as_it_is(engine, prompts, tokenizer):
    """The tiny pairs' own template (their language has no roles) joins the contents: --chat changes nothing there."""
    p = prompts[0]
    assert encode_text(tokenizer, tokenizer.decode(p), chat=ChatFormat()) == p


def test_prepare_dataset_chat_writes_the_rendered_ids(chat_engine, prompts, tokenizer, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(tokenizer.decode(prompts[0]) + "\n\n" + tokenizer.decode(prompts[1]) + "\n")
    out = tmp_path / "chat.jsonl"
    r = _run("bench", "prepare-dataset", "--corpus", corpus, "--engine-dir", chat_engine, "--chat", "--output", out)
    assert r.exit_code == 0, r.output
    assert "(corpus, chat template, enable_thinking false)" in r.stdout
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["input_ids"] for x in lines] == [[USER, *prompts[0], GEN], [USER, *prompts[1], GEN]]
    pf = tmp_path / "prompts.json"
    pf.write_text(json.dumps({"prompts": [tokenizer.decode(prompts[2]), prompts[3]]}))
    r = _run("bench", "prepare-dataset", "--prompts", pf, "--engine-dir", chat_engine, "--chat", "--enable-thinking",
             "--output", tmp_path / "p.jsonl")
    assert r.exit_code == 0, r.output
    ids = [json.loads(x)["input_ids"] for x in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert ids == [[USER, *prompts[2], GEN, THINK], prompts[3]]


@pytest.mark.parametrize("source, says", [
    (["--synthetic", "token-unif-dist", "--input-min", "4", "--input-max", "8", "--output-min", "4", "--output-max",
      "8", "--num-requests", "2"], "--synthetic prompts are token ids"),
    (["--builtin", "tiny"], "--builtin prompts are token ids"),
    (["--prompts", "IDS"], "holds token-id lists only"),
])
def test_prepare_dataset_refuses_chat_without_text(chat_engine, tmp_path, source, says):
    ids = tmp_path / "ids.json"
    ids.write_text(json.dumps([[5, 6, 7]]))
    out = tmp_path / "d.jsonl"
    r = _run("bench", "prepare-dataset", *[str(ids) if a == "IDS" else a for a in source],
             "--engine-dir", chat_engine, "--chat", "--output", out)
    assert r.exit_code == 1 and "--chat" in r.output and says in r.output and r.output.count("\n") == 1, r.output
    assert not out.exists()


def test_generate_chat(chat_target_dir, prompts, tokenizer):
    pair = trained_pair("qwen3")
    p = prompts[4]
    r = _run("generate", "--drafter", pair.drafter_dir, "--target-dir", chat_target_dir, "--prompt",
             tokenizer.decode(p), "--chat", "--max-new-tokens", 4, "--json")
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["prompt_ids"] == [USER, *p, GEN]
    assert rep["chat_template"]["enable_thinking"] is False
    r = _run("generate", "--drafter", pair.drafter_dir, "--target-dir", chat_target_dir, "--prompt-ids", "5,6",
             "--chat")
    assert r.exit_code == 1 and "error: --chat:" in r.output and "--prompt-ids" in r.output, r.output


def test_analyze_chat(chat_target_dir, prompts, tokenizer, tmp_path):
    from dflash2_trt.analyze import load_prompts

    pf = tmp_path / "prompts.json"
    pf.write_text(json.dumps([tokenizer.decode(prompts[5]), prompts[6]]))
    assert load_prompts(pf, chat_target_dir, ChatFormat()) == [[USER, *prompts[5], GEN], prompts[6]]
    assert load_prompts(pf, chat_target_dir) == [prompts[5], prompts[6]]
    pair = trained_pair("qwen3")
    r = _run("analyze", "--drafter", pair.drafter_dir, "--target-dir", chat_target_dir, "--chat")
    assert r.exit_code == 1 and "built-in prompt set is token ids" in r.output, r.output


def test_a_tensorrt_engine_renders_the_same_prompt(chat_engine, prompts, tokenizer, tmp_path):
    """`run --chat` on a TensorRT-LLM engine directory (the project runtime over the CPU stand-in of TensorRT) renders
    the text before either runtime path is chosen: the same prompt and tokens as the cpu engine it stands in for."""
    from dflash2_trt.engine.run import run_engine
    from dflash2_trt.testing import tensorrt_standin as trt
    from dflash2_trt.testing.engines import standin_trt_engine_dir

    d = standin_trt_engine_dir(chat_engine, tmp_path / "trt")
    text = tokenizer.decode(prompts[7])
    got = run_engine(d, prompt=text, chat=ChatFormat(), max_new_tokens=NEW, trt=trt)
    want = run_engine(chat_engine, prompt=text, chat=ChatFormat(), max_new_tokens=NEW)
    assert got["backend"] == "trtllm" and got["chat_template"] == want["chat_template"]
    assert got["requests"][0]["prompt_len"] == len(prompts[7]) + 2
    assert got["requests"][0]["output_ids"] == want["requests"][0]["output_ids"]
    with pytest.raises(ConfigError, match="--chat: puts prompt text"):
        run_engine(d, prompt_ids="5,6", chat=ChatFormat(), trt=trt)


def test_prepare_dataset_does_not_cut_a_rendered_prompt(chat_engine, prompts, tokenizer, tmp_path):
    """--max-input-len cuts a prompt's end, which for a rendered one is the assistant's turn the template opened: it
    is refused there (one line, nothing written), and cuts plain text as before."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(tokenizer.decode(prompts[0]) + "\n")
    n = len(prompts[0])
    out = tmp_path / "d.jsonl"
    args = ["bench", "prepare-dataset", "--corpus", corpus, "--engine-dir", chat_engine, "--output", out]
    r = _run(*args, "--chat", "--max-input-len", n + 1)
    assert r.exit_code == 1 and r.output.startswith(f"error: --max-input-len: {corpus}:1 is {n + 2} tokens"), r.output
    assert "cut off the assistant's turn" in r.output and r.output.count("\n") == 1 and not out.exists(), r.output
    assert _run(*args, "--chat", "--max-input-len", n + 2).exit_code == 0
    assert json.loads(out.read_text())["input_ids"] == [USER, *prompts[0], GEN]
    assert _run(*args, "--max-input-len", n - 1, "--force").exit_code == 0
    assert json.loads(out.read_text())["input_ids"] == prompts[0][:n - 1]


def test_prepare_dataset_cuts_the_ids_beside_rendered_prompts(chat_engine, prompts, tokenizer, tmp_path):
    """Only a rendered prompt is kept whole: token-id prompts in the same file are cut as before."""
    pf = tmp_path / "mixed.json"
    pf.write_text(json.dumps([tokenizer.decode(prompts[0][:3]), prompts[1]]))
    out = tmp_path / "d.jsonl"
    r = _run("bench", "prepare-dataset", "--prompts", pf, "--engine-dir", chat_engine, "--chat", "--max-input-len", 5,
             "--output", out)
    assert r.exit_code == 0, r.output
    assert [json.loads(x)["input_ids"] for x in out.read_text().splitlines()] == [[USER, *prompts[0][:3], GEN],
                                                                                  prompts[1][:5]]


def test_the_engines_limit_note_says_to_shorten_rendered_prompts(chat_engine, tokenizer, tmp_path):
    corpus = tmp_path / "long.txt"
    corpus.write_text(" ".join(WORDS[3 + i % 200] for i in range(300)) + "\n")
    r = _run("bench", "prepare-dataset", "--corpus", corpus, "--engine-dir", chat_engine, "--chat", "--output",
             tmp_path / "d.jsonl")
    assert r.exit_code == 0, r.output
    assert "longer than the engine's max_input_len" in r.stderr and "shorten them" in r.stderr, r.stderr
    assert "--max-input-len 256 cuts them" not in r.stderr


def test_empty_text_and_a_template_that_renders_nothing_are_named(chat_engine, tmp_path):
    r = _run("run", "--engine-dir", chat_engine, "--prompt", " ", "--chat")
    assert r.exit_code == 1 and r.output == "error: --prompt: the prompt text is empty\n", r.output
    eng = _engine_with_template(chat_engine, tmp_path, "empty", "{% if false %}x{% endif %}")
    r = _run("run", "--engine-dir", eng, "--prompt", WORDS[5], "--chat")
    assert r.exit_code == 1 and "rendered the messages as empty text" in r.output, r.output


def test_named_templates(chat_engine, prompts, tokenizer, tmp_path):
    """Hugging Face renders the template named "default" among named ones; without one, the error says so."""
    eng = _engine_with_template(chat_engine, tmp_path, "named", [{"name": "default", "template": TEMPLATE},
                                                                 {"name": "tool_use", "template": "x"}])
    tok = find_tokenizer(eng / "tokenizer")
    assert encode_text(tok, tokenizer.decode(prompts[0]), chat=ChatFormat()) == [USER, *prompts[0], GEN]
    eng = _engine_with_template(chat_engine, tmp_path, "nodefault", [{"name": "a", "template": TEMPLATE},
                                                                     {"name": "b", "template": "x"}])
    r = _run("run", "--engine-dir", eng, "--prompt", WORDS[5], "--chat")
    assert r.exit_code == 1 and "has named chat templates (a, b) and none named \"default\"" in r.output, r.output


def test_a_chat_template_file_travels_with_the_engine(tmp_path, prompts, tokenizer):
    """A target whose template is chat_template.jinja (transformers 5's own layout): build copies it, --chat uses it."""
    t = tmp_path / "target"
    shutil.copytree(trained_pair("qwen3").target_dir, t)
    _with_template(t, None)
    (t / "chat_template.jinja").write_text(TEMPLATE)
    eng = tmp_path / "engine"
    r = _run("build", "--drafter", trained_pair("qwen3").drafter_dir, "--target-dir", t, "--backend", "cpu",
             "--output", eng, "--no-verify")
    assert r.exit_code == 0, r.output
    assert (eng / "tokenizer" / "chat_template.jinja").read_text() == TEMPLATE
    r = _run("run", "--engine-dir", eng, "--prompt", tokenizer.decode(prompts[0]), "--chat", "--max-new-tokens", 1,
             "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["requests"][0]["prompt_len"] == len(prompts[0]) + 2, r.output


def test_analyze_chat_counts_only_the_prompts_it_uses(chat_target_dir, prompts, tokenizer, tmp_path):
    pf = tmp_path / "prompts.json"
    pf.write_text(json.dumps([prompts[0], prompts[1], tokenizer.decode(prompts[2])]))
    pair = trained_pair("qwen3")
    r = _run("analyze", "--drafter", pair.drafter_dir, "--target-dir", chat_target_dir, "--prompts", pf, "--chat",
             "--max-prompts", 2)
    assert r.exit_code == 1 and "token-id lists only (--max-prompts)" in r.output, r.output
