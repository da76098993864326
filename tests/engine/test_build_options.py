"""What `build` refuses or says about its inputs and options before anything is written: a registered target's name
given with another family's checkpoints, a drafter trained for another block than the target's build config, a
published pair planned from its shipped configs, options a cpu build has no use for, a non-empty --output in a dry
run. (Found by a new-user walk through README and docs/cli.md.)"""

from __future__ import annotations

import json

from click.testing import CliRunner

from dflash2_trt.assets import trained_pair
from dflash2_trt.cli import main
from dflash2_trt.targets import PUBLISHED_DIR


def _cli(*args, env=None):
    r = CliRunner().invoke(main, list(args), env=env)
    return r.exit_code, r.stdout, r.stderr


def test_a_target_name_with_another_familys_checkpoints_is_refused():
    muse = trained_pair("muse_glimmer")
    code, out, err = _cli("build", "--target", "tiny", "--drafter", str(muse.drafter_dir), "--target-dir",
                          str(muse.target_dir), "--dry-run", "--backend", "cpu")
    assert code == 1 and out == ""
    line = err.strip()
    assert line.count("\n") == 0, err
    assert line.startswith(f"error: {muse.target_dir / 'config.json'}: architectures: a muse_glimmer model, but target "
                           f"'tiny' is qwen3"), line
    assert "--target muse-glimmer-30b or tiny-muse" in line
    # the matching name plans it
    code, out, err = _cli("build", "--target", "tiny-muse", "--drafter", str(muse.drafter_dir), "--target-dir",
                          str(muse.target_dir), "--dry-run", "--backend", "cpu", "--json")
    assert code == 0, err
    assert json.loads(out)["family"] == "muse_glimmer"


def test_a_drafter_trained_for_another_block_is_named(tmp_path):
    pair = trained_pair("qwen3")
    drafter = tmp_path / "drafter16"
    drafter.mkdir()
    cfg = json.loads((pair.drafter_dir / "config.json").read_text())
    cfg["dflash_config"]["block_size"] = 16
    (drafter / "config.json").write_text(json.dumps(cfg))   # config only: enough for a dry run
    args = ("build", "--target", "tiny", "--drafter", str(drafter), "--target-dir", str(pair.target_dir),
            "--dry-run", "--backend", "cpu", "--json")
    code, out, err = _cli(*args)
    assert code == 0, err
    assert json.loads(out)["settings"]["block_size"] == 8     # the build config's, as before: now said
    assert "trained with block_size 16" in err and "builds block 8" in err and "--block-size 16" in err, err
    code, out, err = _cli(*args, "--block-size", "16")
    assert code == 0, err
    assert json.loads(out)["settings"]["block_size"] == 16 and "trained with block_size" not in err


def test_a_dry_run_plans_a_published_pair_from_its_shipped_configs(tmp_path):
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "DFLASH2_TRT_MODELS": str(tmp_path / "none")}
    code, out, err = _cli("build", "--target", "qwen3.8-27b", "--dry-run", "--json", env=env)
    assert code == 0, err
    plan = json.loads(out)
    assert plan["drafter_dir"] == str(PUBLISHED_DIR / "z-lab__Qwen3.8-27B-DFlash2")
    assert plan["target_dir"] == str(PUBLISHED_DIR / "Qwen__Qwen3.8-27B")
    assert err.count("note: ") == 2 and "read from its config shipped in the package" in err, err
    # a real build never takes configs for weights
    code, out, err = _cli("build", "--target", "qwen3.8-27b", "--output", str(tmp_path / "e"), env=env)
    assert code == 1 and "is not available locally" in err and not (tmp_path / "e").exists()


def test_options_a_cpu_build_has_no_use_for_are_refused(tmp_path):
    for extra, field in ((["--no-keep-checkpoint"], "--no-keep-checkpoint"), (["--reconvert"], "--reconvert"),
                         (["--gpu-memory-gib", "80"], "--gpu-memory-gib"),
                         (["--no-keep-checkpoint", "--dry-run"], "--no-keep-checkpoint")):
        code, out, err = _cli("build", "--target", "tiny", "--backend", "cpu", "--output", str(tmp_path / "e"),
                              *extra)
        assert code == 1 and err.startswith(f"error: {field}: "), (extra, err)
        assert not (tmp_path / "e").exists()


def test_a_dry_run_refuses_a_non_empty_output_as_the_build_would(tmp_path):
    out_dir = tmp_path / "engine"
    out_dir.mkdir()
    (out_dir / "keep.txt").write_text("x")
    code, out, err = _cli("build", "--target", "tiny", "--backend", "cpu", "--output", str(out_dir), "--dry-run")
    assert code == 1 and "output directory is not empty (pass --force" in err, err
    force = ("build", "--target", "tiny", "--backend", "cpu", "--output", str(out_dir), "--dry-run", "--force")
    code, out, err = _cli(*force)   # --force replaces only an earlier output, not a directory of other files
    assert code == 1 and "holds no dflash2-trt output (engine.json, manifest.json, dflash2_repository.json)" in err, err
    (out_dir / "engine.json").write_text('{"format": "dflash2-trt engine"}')
    code, out, err = _cli(*force)
    assert code == 0, err
    assert sorted(p.name for p in out_dir.iterdir()) == ["engine.json", "keep.txt"]   # a dry run deletes nothing


def test_a_build_started_by_an_mpi_launcher_is_refused_before_any_work(tmp_path, monkeypatch):
    """`mpirun -n 2 dflash2-trt build` ran the whole build in every process, into one --output (a cpu build converted
    and built before its verify gate refused the launch). One line first; a dry run, which only plans, still plans;
    one process, or an unreadable launcher variable, is no such launch."""
    from dflash2_trt.engine.launch import several_processes

    out_dir = tmp_path / "engine"
    args = ("build", "--target", "tiny", "--backend", "cpu", "--output", str(out_dir))
    code, out, err = _cli(*args, env={"OMPI_COMM_WORLD_SIZE": "2"})
    assert code == 1 and err.strip() == ("error: build runs as one process (trtllm-build starts its own workers, and a "
                                         "tp engine's verify gate its own ranks); this is one of 2 processes an MPI "
                                         "launcher started: run it without mpirun"), err
    assert not out_dir.exists() and list(tmp_path.iterdir()) == []
    code, out, err = _cli(*args, "--dry-run", env={"OMPI_COMM_WORLD_SIZE": "2"})
    assert code == 0 and "plan: build tiny" in out, err
    for value, size in (("2", 2), ("1", None), ("x", None)):
        monkeypatch.setenv("PMI_SIZE", value)
        assert several_processes() == size


def test_inspect_names_a_missing_directory(tmp_path):
    code, out, err = _cli("inspect", str(tmp_path / "nope"))
    assert code == 1 and err.strip() == f"error: {tmp_path / 'nope'}: no such directory"
    (tmp_path / "empty").mkdir()
    code, out, err = _cli("inspect", str(tmp_path / "empty"))
    assert code == 1 and "config.json: config file not found" in err


def test_serve_names_the_option_a_bad_port_came_from(tmp_path):
    code, out, err = _cli("serve", "--engine-dir", str(tmp_path), "--port", "70000")
    assert code == 1 and err.strip() == "error: --port (its http port): port 70000 is not in [1, 65535]", err
    code, out, err = _cli("serve", "--engine-dir", str(tmp_path), "--port", "65534")
    assert code == 1 and err.strip() == "error: --port (its metrics port): port 65536 is not in [1, 65535]", err
    code, out, err = _cli("serve", "--engine-dir", str(tmp_path), "--port", "70000", "--http-port", "0")
    assert code == 1 and err.strip() == "error: --http-port: port 0 is not in [1, 65535]", err


def test_a_kept_checkpoint_of_retrained_weights_is_not_reused(tmp_path):
    """A drafter retrained and saved again with the same shapes has the same safetensors headers and sizes, which
    were all a kept checkpoint's identity held: the engine was built from the old weights without a word (a new
    user's review: `run` gave acceptance 3.29, the new drafter's own `generate` 1.21). Its modification time is in
    the identity now: the build says the checkpoint does not match, and --reconvert converts the new weights."""
    import shutil

    from safetensors.torch import load_file, save_file

    pair = trained_pair("qwen3")
    drafter = tmp_path / "drafter"
    shutil.copytree(pair.drafter_dir, drafter)
    args = ["build", "--drafter", str(drafter), "--target-dir", str(pair.target_dir), "--backend", "cpu",
            "--no-verify", "--checkpoint-dir", str(tmp_path / "ck")]
    code, out, err = _cli(*args, "--output", str(tmp_path / "e1"))
    assert code == 0, err
    weights = drafter / "model.safetensors"
    sd = load_file(weights)
    sd["fc.weight"] = sd["fc.weight"] * 0
    st = weights.stat()
    save_file(sd, weights, metadata={"format": "pt"})
    assert weights.stat().st_size == st.st_size      # the same layout: only the data changed
    code, out, err = _cli(*args, "--output", str(tmp_path / "e2"))
    assert code == 1 and "sources.drafter: written from different files" in err and "--reconvert" in err, err
    code, out, err = _cli(*args, "--output", str(tmp_path / "e2"), "--reconvert")
    assert code == 0, err
    old, new = (load_file(tmp_path / e / "checkpoint" / "rank0.safetensors") for e in ("e1", "e2"))
    changed = [k for k in old if not old[k].equal(new[k])]
    assert changed and all("fc" in k for k in changed), changed


def test_a_prompt_over_max_num_tokens_is_taken_in_chunks(tmp_path, monkeypatch):
    """An engine built with max_num_tokens below its max_input_len refused prompts within its own limit (a new user's
    review); the project runtime now takes such a prompt in chunks (tests/engine/test_chunked_context.py), so the build
    has nothing to warn about and `run` decodes it as an engine with room for it whole does."""
    prompt = ",".join(str(5 + i % 50) for i in range(40))
    outs = []
    for name, extra in (("small", ["--max-num-tokens", "32"]), ("whole", [])):
        code, stdout, err = _cli("build", "--target", "tiny", "--backend", "cpu", "--output", str(tmp_path / name),
                                 "--no-verify", *extra)
        assert code == 0, err
        # no note about refused prompts (none are); for the small budget one about batching (a new user measured
        # concurrency 4 running no faster than 1: 32 - 4 x 8 leaves no chunk of 32 beside a full batch)
        assert ("note: max_num_tokens 32 leaves 0 tokens beside a full batch's generation (max_batch_size 4 x "
                "block_size 8), less than one prompt chunk (chunks are cut at multiples of tokens_per_block 32): a "
                "new prompt that does not fit whole then waits until fewer requests generate; --max-num-tokens 64 or "
                "more lets one start beside a full batch\n" == err) == (name == "small"), err
        assert "refused" not in err
        code, stdout, err = _cli("run", "--engine-dir", str(tmp_path / name), "--prompt-ids", prompt,
                                 "--max-new-tokens", "8", "--json")
        assert code == 0, err
        rep = json.loads(stdout)
        outs.append(rep["requests"][0]["output_ids"])
        assert rep["totals"]["chunked_steps"] == (1 if name == "small" else 0)    # 40 tokens: 32, then 8
        assert rep["requests"][0]["context_chunks"] == (2 if name == "small" else 1)
    assert outs[0] == outs[1] and len(outs[0]) == 8
    code, stdout, err = _cli("run", "--engine-dir", str(tmp_path / "small"), "--prompt-ids", prompt)
    assert code == 0 and "engine steps (max batch 4; a prompt cut in chunks in 1), mean acceptance" in stdout, stdout
    assert "[0] prompt 40 tokens in 2 chunks -> 64 new" in stdout, stdout    # the request that was cut says so
    monkeypatch.setenv("DFLASH2_CHUNKED_CONTEXT", "0")       # the switch: every prompt whole
    code, stdout, err = _cli("run", "--engine-dir", str(tmp_path / "small"), "--prompt-ids", prompt)
    assert code == 1 and "prompt of 40 tokens exceeds max_num_tokens 32 (a prompt is taken whole in one step: " \
        "chunked context is off ($DFLASH2_CHUNKED_CONTEXT=0); an engine built with --max-num-tokens 40 or more takes " \
        "it whole)" in err, err
    # a bad value is the command's error before any work (it was found only by the verify gate, after a build)
    monkeypatch.setenv("DFLASH2_CHUNKED_CONTEXT", "yes")
    code, stdout, err = _cli("build", "--target", "tiny", "--backend", "cpu", "--output", str(tmp_path / "never"))
    assert code == 1 and err == "error: DFLASH2_CHUNKED_CONTEXT: must be 0 or 1, got 'yes'\n", err
    assert not (tmp_path / "never").exists()
    assert _cli("targets")[0] == 0            # a command that starts no runtime does not read it


def _copy_with_config(src, dst, **fields):
    """A copy of checkpoint directory ``src`` at ``dst`` whose config.json has ``fields`` set."""
    from dflash2_trt.testing.corrupt import copy_with_json

    return copy_with_json(src, dst, "config.json", **fields)


def test_a_pair_blocker_names_the_pair_not_the_target_file(tmp_path):
    """A drafter config the engine cannot take (its head_dim) was reported as "T/config.json: cannot build an engine
    for this target", a file nobody edited (a new user's review); the error names the pair."""
    pair = trained_pair("qwen3")
    drafter = _copy_with_config(pair.drafter_dir, tmp_path / "drafter", head_dim=8)
    code, out, err = _cli("build", "--drafter", str(drafter), "--target-dir", str(pair.target_dir), "--backend", "cpu",
                          "--output", str(tmp_path / "e"))
    assert code == 1 and err.startswith(f"error: cannot build an engine for this pair (drafter {drafter}, target "
                                        f"{pair.target_dir}): "), err
    assert f"{pair.target_dir}/config.json" not in err and not (tmp_path / "e").exists()


def test_a_checkpoint_kept_by_an_earlier_version_says_why_it_is_not_reused(tmp_path):
    """A manifest written before the identity held modification times cannot show that the weights are unchanged: it
    is not reused, and the error says that, not that the files differ (the session's reviewer: "written from different
    files" for untouched sources)."""
    pair = trained_pair("qwen3")
    args = ["build", "--drafter", str(pair.drafter_dir), "--target-dir", str(pair.target_dir), "--backend", "cpu",
            "--no-verify", "--checkpoint-dir", str(tmp_path / "ck")]
    code, out, err = _cli(*args, "--output", str(tmp_path / "e1"))
    assert code == 0, err
    man_path = tmp_path / "ck" / "manifest.json"
    man = json.loads(man_path.read_text())
    for src in man["sources"].values():
        for f in src["files"]:
            del f["mtime_ns"]           # as an earlier version wrote it
    man_path.write_text(json.dumps(man))
    code, out, err = _cli(*args, "--output", str(tmp_path / "e2"))
    assert code == 1 and "sources.target: recorded by an earlier dflash2-trt without the files' modification " \
                         "times, so it cannot show the weights are unchanged; convert once more (--reconvert)" in err, err


def test_a_target_tokenizer_that_does_not_load_is_said_by_the_build(tmp_path):
    """The engine carries the target's tokenizer files; ones that do not load here used to ship without a word, and
    the engine's first `run --prompt` failed (a fuzzing review). The build now says so in a note (not refused: an
    engine for token ids needs none, and the serving machine may have what they need)."""
    import shutil

    pair = trained_pair("qwen3")
    target = tmp_path / "target"
    shutil.copytree(pair.target_dir, target)
    assert (target / "tokenizer.json").is_file()
    (target / "tokenizer.json").write_text("{bad")
    out = tmp_path / "eng"
    r = CliRunner().invoke(main, ["build", "--drafter", str(pair.drafter_dir), "--target-dir", str(target),
                                  "--output", str(out)])
    assert r.exit_code == 0, r.output
    notes = [ln for ln in r.stderr.splitlines() if ln.startswith("note: ")]
    assert len(notes) == 1 and f"{target}: has tokenizer files that cannot be loaded" in notes[0], r.stderr
    assert "token ids work without" in notes[0] and (out / "tokenizer" / "tokenizer.json").is_file()


def test_limits_derived_from_a_tiny_max_position_embeddings_name_that_field(tmp_path):
    """Without --target, the build's limits come from the target's max_position_embeddings; a value too small for any
    build names that field of the target's config.json, not "<defaults from the checkpoint configs>" (a fuzzing
    review)."""
    from dflash2_trt.testing.cli import cli, one_error_line

    pair = trained_pair("qwen3")
    target = _copy_with_config(pair.target_dir, tmp_path / "target", max_position_embeddings=1)
    line = one_error_line(*cli("build", "--drafter", str(pair.drafter_dir), "--target-dir", str(target),
                               "--output", str(tmp_path / "eng")))
    assert line.startswith(f"error: {target / 'config.json'}: max_position_embeddings: 1 is too small"), line
    assert "give --max-input-len and --max-seq-len" in line and not (tmp_path / "eng").exists()
