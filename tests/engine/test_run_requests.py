"""`run` on a cpu engine: a request of a prompts file that the engine cannot take is refused before anything runs, in
one line naming the file and its line (as `bench run` names its dataset's), not only the request's task id."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from dflash2_trt.cli import main


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from dflash2_trt.assets import trained_pair
    from dflash2_trt.engine.build import build_engine

    pair = trained_pair("qwen3")
    out = tmp_path_factory.mktemp("run") / "eng"
    build_engine(pair.drafter_dir, pair.target_dir, out, target_key="tiny",
                 overrides={"max_seq_len": 64, "max_input_len": 32, "max_num_tokens": 256})
    return out


@pytest.mark.parametrize("line,needle", [
    ({"task_id": "b", "input_ids": [5] * 33}, "request b: prompt of 33 tokens exceeds the engine's max_input_len 32"),
    ({"task_id": "b", "input_ids": [5, 999]}, "request b: token ids [999] outside the vocabulary [0, 256)"),
    ({"task_id": "b", "input_ids": [5, 6], "output_tokens": 60}, "request b: prompt (2) + max new tokens (60)"),
])
def test_a_bad_prompts_line_names_the_file_and_line(engine, tmp_path, line, needle):
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"task_id": "a", "input_ids": [5, 6, 7]}) + "\n" + json.dumps(line) + "\n")
    r = CliRunner().invoke(main, ["run", "--engine-dir", str(engine), "--prompts", str(f), "--max-new-tokens", "4"])
    assert r.exit_code == 1
    assert r.output.strip().splitlines() == [r.output.strip()]
    assert r.output.startswith(f"error: {f}:2: {needle}"), r.output


def _edited(engine, tmp_path, edit):
    """A copy of ``engine`` whose config.json ``edit`` changed, engine.json updated to match (a hand edit that
    also fixed the manifest, or a config of another version: the file checks pass)."""
    import shutil

    from dflash2_trt.engine.format import file_sha256

    d = tmp_path / "ex"
    shutil.copytree(engine, d)
    cfg = json.loads((d / "config.json").read_text())
    edit(cfg["pretrained_config"])
    (d / "config.json").write_text(json.dumps(cfg))
    man = json.loads((d / "engine.json").read_text())
    man["files"]["config.json"] = {"size": (d / "config.json").stat().st_size, "sha256": file_sha256(d / "config.json")}
    (d / "engine.json").write_text(json.dumps(man))
    return d


@pytest.mark.parametrize("edit,field,needle", [
    (lambda p: p.pop("hidden_size"), "hidden_size", "required field is missing"),
    (lambda p: p.pop("rotary_base"), "rotary_base", "required field is missing"),
    (lambda p: p["dflash2"].pop("mask_token_id"), "dflash2.mask_token_id", "required field is missing"),
    (lambda p: p["dflash2_engine"].update(selector="bogus"), "dflash2_engine.selector", "must be one of"),
    (lambda p: p.update(num_attention_heads="4"), "num_attention_heads", "must be an integer >= 1, got '4'"),
    (lambda p: p.update(layer_types="full_attention"), "layer_types", "expected a list of at least 4 layer kinds"),
    (lambda p: p.update(dtype="float8"), "dtype", "must be one of float32, float16, bfloat16"),
])
def test_a_damaged_engine_config_is_one_error_line_naming_its_field(engine, tmp_path, edit, field, needle):
    """What the network is built from, checked by field when the engine opens (an audit found each of these reaching
    the network's construction as a traceback)."""
    d = _edited(engine, tmp_path, edit)
    r = CliRunner().invoke(main, ["run", "--engine-dir", str(d), "--prompt-ids", "1,2", "--max-new-tokens", "2"])
    assert r.exit_code == 1 and r.output.strip().splitlines() == [r.output.strip()], r.output
    assert r.output.startswith(f"error: {d / 'config.json'}: pretrained_config.{field}: {needle}"), r.output


@pytest.mark.parametrize("edit,field", [
    (lambda p: p["dflash2"].update(block_size=p["dflash2"]["block_size"] + 1), "pretrained_config.max_draft_len"),
    (lambda p: p["dflash2"].update(target_layer_ids=[0, 7]), "pretrained_config.dflash2.target_layer_ids"),
])
def test_engine_config_values_the_step_would_trip_on_are_refused_by_field(engine, tmp_path, edit, field):
    d = _edited(engine, tmp_path, edit)
    r = CliRunner().invoke(main, ["run", "--engine-dir", str(d), "--prompt-ids", "1,2", "--max-new-tokens", "2"])
    assert r.exit_code == 1 and r.output.startswith(f"error: {d / 'config.json'}: {field}:"), r.output


def test_text_the_tokenizer_cannot_encode_is_named_by_file_and_line(engine, tmp_path):
    """A prompt's text the target's tokenizer cannot encode (a word outside the tiny word-level vocabulary) is named by
    its file and line, in `run --prompts`, `bench run --dataset` and `bench prepare-dataset --corpus` alike."""
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"task_id": 0, "input_ids": [5, 6]}) + "\n"
                 + json.dumps({"task_id": 1, "prompt": "zzzz", "output_tokens": 4}) + "\n")
    for args in (["run", "--engine-dir", str(engine), "--prompts", str(f), "--max-new-tokens", "4"],
                 ["bench", "run", "--engine-dir", str(engine), "--dataset", str(f), "--concurrency", "1",
                  "--no-progress"]):
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 1 and r.output.startswith(f"error: {f}:2: prompt: the tokenizer cannot encode"), \
            (args[0], r.output)
        assert "'zzzz'" in r.output
    # from the command line: the option is named, as every other option's error names it (it said "prompt:")
    r = CliRunner().invoke(main, ["run", "--engine-dir", str(engine), "--prompt", "zzzz"])
    assert r.exit_code == 1 and r.output == ("error: --prompt: the tokenizer cannot encode the prompt text: the word "
                                             "'zzzz' is not in its vocabulary\n"), r.output
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n\nzzzz\n")
    r = CliRunner().invoke(main, ["bench", "prepare-dataset", "--corpus", str(corpus), "--engine-dir", str(engine),
                                  "--output", str(tmp_path / "d.jsonl")])
    assert r.exit_code == 1 and r.output.startswith(f"error: {corpus}:3: prompt:"), r.output


def test_build_json_names_where_the_engine_is(tmp_path):
    """`build --json` prints engine.json's content and the directory the text line names ("wrote DIR")."""
    from dflash2_trt.assets import trained_pair

    pair = trained_pair("qwen3")
    out = tmp_path / "e"
    r = CliRunner().invoke(main, ["build", "--drafter", str(pair.drafter_dir), "--target-dir", str(pair.target_dir),
                                  "--output", str(out), "--no-verify", "--json", "--max-seq-len", "64",
                                  "--max-input-len", "32", "--max-num-tokens", "256"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output[r.output.index("{"):])
    assert doc.pop("output_dir") == str(out) and doc == json.loads((out / "engine.json").read_text())


def test_threads_set_torch_and_bad_counts_are_one_line(engine, monkeypatch):
    """`run --threads` / `generate --threads` (torch's CPU threads: under load, torch's default of one per core was
    measured 15 s against 0.7 s at one): the count is used, and outside 1 .. the CPUs this process may use it is one
    `error:` line before anything runs."""
    import torch

    from dflash2_trt import cpu_threads
    from dflash2_trt.assets import trained_pair

    pair = trained_pair("qwen3")
    commands = {"run": ["run", "--engine-dir", str(engine)],
                "generate": ["generate", "--drafter", str(pair.drafter_dir), "--target-dir", str(pair.target_dir)]}
    monkeypatch.setattr(cpu_threads, "available_cpus", lambda: 2)
    for name, argv in commands.items():
        seen = []
        torch.set_num_threads(2)
        monkeypatch.setattr(torch, "set_num_threads", lambda n, _set=torch.set_num_threads: (seen.append(n), _set(n)))
        r = CliRunner().invoke(main, [*argv, "--prompt-ids", "5,6,7", "--max-new-tokens", "3", "--threads", "1"])
        assert r.exit_code == 0, (name, r.output)
        assert seen[:1] == [1] and torch.get_num_threads() == 1, (name, seen)
        monkeypatch.undo()
        monkeypatch.setattr(cpu_threads, "available_cpus", lambda: 2)
        for bad, needle in (("0", "must be an integer >= 1, got 0"), ("3", "must be at most the 2 CPU cores")):
            r = CliRunner().invoke(main, [*argv, "--prompt-ids", "5,6,7", "--threads", bad])
            assert r.exit_code == 1 and r.output.startswith(f"error: --threads: {needle}"), (name, r.output)
            assert len(r.output.strip().splitlines()) == 1, r.output


def test_a_run_without_a_generation_step_has_no_mean_acceptance(engine):
    """One new token comes from the context step alone: there is no acceptance to average. It was printed as 0.00 (a
    drafter that never helps); it is `-` in the text and null in the JSON, as bench run says it."""
    argv = ["run", "--engine-dir", str(engine), "--prompt-ids", "5,6", "--max-new-tokens", "1"]
    r = CliRunner().invoke(main, argv)
    assert r.exit_code == 0, r.output
    assert "mean acceptance - over 0 steps" in r.output and "mean acceptance -," in r.output, r.output
    r = CliRunner().invoke(main, [*argv, "--json"])
    doc = json.loads(r.output)
    assert doc["totals"]["mean_acceptance"] is None and doc["requests"][0]["mean_acceptance"] is None
    assert doc["totals"]["generation_steps"] == 0
    r = CliRunner().invoke(main, ["run", "--engine-dir", str(engine), "--prompt-ids", "5,6", "--max-new-tokens", "6",
                                  "--json"])
    doc = json.loads(r.output)
    assert doc["totals"]["mean_acceptance"] >= 1.0 and doc["requests"][0]["mean_acceptance"] >= 1.0


def _run_with_stderr_on(engine, prompts, extra, tty: bool):
    """`run` as a user starts it, stderr on a terminal (a pseudo-terminal) or a pipe; returns (exit, stdout, stderr)."""
    import os
    import subprocess
    import sys

    argv = [sys.executable, "-m", "dflash2_trt.cli", "run", "--engine-dir", str(engine), "--prompts", str(prompts),
            "--max-new-tokens", "4", "--threads", "1", *extra]
    if not tty:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        return p.returncode, p.stdout, p.stderr
    import fcntl
    import struct
    import termios

    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))   # a terminal's size (0 columns: no bar)
    try:
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=slave, text=True)
        os.close(slave)
        slave = None
        out = p.communicate(timeout=120)[0]
        err = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:          # EIO: the child's end is closed
                break
            if not chunk:
                break
            err += chunk
        return p.returncode, out, err.decode(errors="replace")
    finally:
        os.close(master)
        if slave is not None:
            os.close(slave)


def test_a_bar_says_how_far_a_run_is_on_a_terminal_only(engine, tmp_path):
    """`run` printed nothing until every prompt had finished (200 prompts: 42 s of silence, a new user's review): on a
    terminal a bar of requests done now runs on stderr and is gone at the end; in a pipe or a log, and with
    --no-progress, stderr stays empty, and stdout is the same report."""
    f = tmp_path / "p.jsonl"
    f.write_text("".join(json.dumps({"task_id": i, "input_ids": [5 + i, 6, 7]}) + "\n" for i in range(3)))
    code, out, err = _run_with_stderr_on(engine, f, [], tty=True)
    assert code == 0, err
    assert "run:" in err and "/3 [" in err, repr(err)
    assert out.count("\n[") == 2 and out.startswith("[0] prompt 3 tokens"), out
    for extra, tty in (([], False), (["--no-progress"], True)):
        code, out2, err2 = _run_with_stderr_on(engine, f, extra, tty=tty)
        assert code == 0 and err2 == "" and out2.splitlines()[:-1] == out.splitlines()[:-1], (extra, tty, err2)


def test_weights_corrupted_in_place_are_one_line(engine, tmp_path):
    """A checkpoint file overwritten without changing its size (all `run` checks without --verify) gives NaN logits:
    one error line that says so and names --verify, not a traceback from the network's topk (a fuzzing review)."""
    import shutil
    import struct

    bad = tmp_path / "eng"
    shutil.copytree(engine, bad)
    f = bad / "checkpoint" / "rank0.safetensors"
    data = bytearray(f.read_bytes())
    start = 8 + struct.unpack("<Q", data[:8])[0]
    nan = struct.pack("<f", float("nan"))
    data[start:] = nan * ((len(data) - start) // 4) + data[len(data) - (len(data) - start) % 4:]
    f.write_bytes(bytes(data))
    r = CliRunner().invoke(main, ["run", "--engine-dir", str(bad), "--prompt-ids", "5,6,7", "--max-new-tokens", "4"])
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert r.output.strip().splitlines() == [r.output.strip()], r.output
    assert "the engine computed NaN values" in r.output and "run --verify" in r.output and "--check-values" in r.output
    r = CliRunner().invoke(main, ["run", "--engine-dir", str(bad), "--prompt-ids", "5,6,7", "--verify"])
    assert r.exit_code == 1 and "sha256 differs" in r.output, r.output


def test_a_small_pool_bounds_the_new_tokens_it_names(tmp_path):
    """An engine whose KV pool holds fewer tokens than max_seq_len (build --set num_kv_blocks): the new tokens the
    error names for a prompt are the ones the pool takes (asking for them runs; one more is refused)."""
    from dflash2_trt.testing.cli import cli, one_error_line

    out = tmp_path / "e"
    code, text = cli("build", "--target", "tiny", "--output", str(out), "--no-verify", "--set", "num_kv_blocks=4")
    assert code == 0, text
    line = one_error_line(*cli("run", "--engine-dir", str(out), "--prompt-ids", "5,6", "--max-new-tokens", "600"))
    assert "exceeds the engine's max_seq_len 512: at most 118 new tokens for this prompt" in line, line
    line = one_error_line(*cli("run", "--engine-dir", str(out), "--prompt-ids", "5,6", "--max-new-tokens", "119"))
    assert "needs 5 KV blocks, the pool has 4 (128 tokens): at most 118 new tokens for this prompt" in line, line
    code, text = cli("run", "--engine-dir", str(out), "--prompt-ids", "5,6", "--max-new-tokens", "118", "--json")
    assert code == 0 and json.loads(text[text.index("{"):])["requests"][0]["output_ids"], text
    # a prompt that with the draft slots fills the pool is told so, not "at most 0" (or a negative count)
    for n, new in ((120, 500), (200, 400)):
        line = one_error_line(*cli("run", "--engine-dir", str(out), "--prompt-ids", ",".join(["5"] * n),
                                   "--max-new-tokens", str(new)))
        assert line.endswith("the prompt and the draft slots alone fill the 128 tokens the engine's KV pool holds: a "
                             "shorter prompt"), line
    # serve --openai-port: the API's limit is the model's (it shortens to the pool), so an output cut there is
    # finish_reason "length", not "stop"
    from dflash2_trt.deploy.triton.repository import deploy_triton
    from dflash2_trt.deploy.triton.server import openai_frontend, repository_record

    repo = tmp_path / "repo"
    deploy_triton(out, repo)
    f = openai_frontend(repository_record(repo), repo, 0, "127.0.0.1:1", None)
    assert f.max_seq_len == 128 and f.cap(200, 20) == 100
