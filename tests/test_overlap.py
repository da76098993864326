"""The overlap rule for every writing command (issue 21, items 1 and 2): an output that is, contains or lies
inside an input is refused with one line naming the option and the input, exit 1, and nothing is written or
deleted, ``--force`` or not, symbolic links resolved."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from dflash2_trt.assets import ASSET_ROOT
from dflash2_trt.cli import main
from dflash2_trt.errors import ConfigError
from dflash2_trt.overlap import overlap, refuse_overlap


def _cli(*args):
    r = CliRunner().invoke(main, [str(a) for a in args])
    return r.exit_code, r.output


def _one_error(code, text, *needles):
    assert code == 1, text
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), text
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def _snapshot(root: Path) -> dict:
    """Every file under ``root`` (relative path -> sha256), symlinks not followed."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()}


@pytest.fixture()
def pair(tmp_path):
    """Copies of the shipped trained tiny drafter (D) and target (T) under tmp_path/src."""
    src = tmp_path / "src"
    d, t = src / "D", src / "T"
    shutil.copytree(ASSET_ROOT / "qwen3" / "drafter", d)
    shutil.copytree(ASSET_ROOT / "qwen3" / "target", t)
    return d, t


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    out = tmp_path_factory.mktemp("overlap") / "E"
    code, text = _cli("build", "--target", "tiny", "--backend", "cpu", "--output", out, "--no-verify")
    assert code == 0, text
    return out


# ---- the rule itself ---------------------------------------------------------------------------------
def test_relations_resolve_symlinks_and_hard_links(tmp_path):
    a = tmp_path / "a"
    (a / "sub").mkdir(parents=True)
    (a / "f").write_text("x")
    link = tmp_path / "link"
    link.symlink_to(a)
    assert overlap(a, [("in", a)])[0] == "is"
    assert overlap(link, [("in", a)])[0] == "is"                     # a symlink to the input
    assert overlap(tmp_path / "x" / ".." / "a", [("in", a)])[0] == "is"
    assert overlap(tmp_path, [("in", a)])[0] == "contains"
    assert overlap(link / "sub" / "new", [("in", a)])[0] == "lies inside"
    os.link(a / "f", tmp_path / "hard")
    assert overlap(tmp_path / "hard", [("in", a / "f")])[0] == "is"  # same file, another name
    assert overlap(tmp_path / "b", [("in", a), ("none", None)]) is None
    assert overlap(tmp_path / "ab", [("in", a)]) is None            # a shared name prefix is not containment
    with pytest.raises(ConfigError, match=r"^--output: .* lies inside the target directory"):
        refuse_overlap(a / "sub", "--output", [("target directory", a)])


# ---- build (item 1) ----------------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["T", "D", "parent", "inside T", "symlink to T"])
def test_build_output_overlapping_a_source_is_refused(pair, tmp_path, where):
    d, t = pair
    before = _snapshot(tmp_path / "src")
    out = {"T": t, "D": d, "parent": t.parent, "inside T": t / "engine", "symlink to T": tmp_path / "lnk"}[where]
    if where == "symlink to T":
        out.symlink_to(t)
    code, text = _cli("build", "--drafter", d, "--target-dir", t, "--backend", "cpu", "--output", out, "--force",
                      "--no-verify")
    _one_error(code, text, "--output", "nothing was written")
    assert _snapshot(tmp_path / "src") == before
    assert not (t / "engine").exists()
    assert not [p for p in (tmp_path / "src").iterdir() if p.name.startswith(".")]   # no .T.tmp-* / .T.old-*


@pytest.mark.parametrize("where", ["T", "inside D", "the output", "inside the output", "contains the output"])
def test_build_checkpoint_dir_overlapping_is_refused(pair, tmp_path, where):
    d, t = pair
    before = _snapshot(tmp_path / "src")
    out = tmp_path / "out" / "E"
    ck = {"T": t, "inside D": d / "ck", "the output": out, "inside the output": out / "ck",
          "contains the output": tmp_path / "out"}[where]
    code, text = _cli("build", "--drafter", d, "--target-dir", t, "--backend", "cpu", "--output", out, "--force",
                      "--no-verify", "--checkpoint-dir", ck)
    _one_error(code, text, "--checkpoint-dir")
    assert _snapshot(tmp_path / "src") == before
    assert not out.exists() and not (d / "ck").exists()


def test_build_trtllm_default_checkpoint_dir_is_checked(pair, tmp_path):
    """The TensorRT-LLM backend's default OUTPUT.checkpoint beside the output must not be a source either."""
    from dflash2_trt.engine.build import check_build_outputs

    d, t = pair
    t2 = t.with_name("E.checkpoint")
    t.rename(t2)
    with pytest.raises(ConfigError, match=r"--checkpoint-dir \(default: OUTPUT.checkpoint\).* is the target"):
        check_build_outputs(d, t2, t.parent / "E", default_checkpoint=True)
    check_build_outputs(d, t2, t.parent / "E", default_checkpoint=False)


def test_build_beside_the_sources_still_works(pair, tmp_path):
    d, t = pair
    code, text = _cli("build", "--drafter", d, "--target-dir", t, "--backend", "cpu", "--output",
                      tmp_path / "src" / "E", "--no-verify")
    assert code == 0, text


# ---- deploy triton (item 2) --------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["E", "parent", "inside E", "inside the tokenizer"])
def test_deploy_output_overlapping_the_engine_is_refused(engine, tmp_path, where):
    e = tmp_path / "E"
    shutil.copytree(engine, e)
    tok = tmp_path / "tok"
    shutil.copytree(engine / "tokenizer", tok)
    before = _snapshot(tmp_path)
    out = {"E": e, "parent": tmp_path, "inside E": e / "repo", "inside the tokenizer": tok / "repo"}[where]
    code, text = _cli("deploy", "triton", "--engine-dir", e, "--output", out, "--force", "--tokenizer", tok)
    _one_error(code, text, "--output")
    assert _snapshot(tmp_path) == before
    assert not (e / "repo").exists()


def test_deploy_output_in_the_engines_own_tokenizer_is_refused(engine, tmp_path):
    e = tmp_path / "E"
    shutil.copytree(engine, e)
    before = _snapshot(e)
    code, text = _cli("deploy", "triton", "--engine-dir", e, "--output", e / "tokenizer", "--force")
    _one_error(code, text, "--output", "engine directory")
    assert _snapshot(e) == before


# ---- export-onnx / convert ---------------------------------------------------------------------------
@pytest.mark.parametrize("cmd", ["convert", "export-onnx"])
def test_convert_and_export_output_inside_a_source_is_refused(pair, tmp_path, cmd):
    d, t = pair
    before = _snapshot(tmp_path / "src")
    code, text = _cli(cmd, "--drafter", d, "--target-dir", t, "--output", t / "out", "--force")
    _one_error(code, text, "--output", "lies inside the target directory")
    assert _snapshot(tmp_path / "src") == before and not (t / "out").exists()


def _hf_cache(pair, root: Path) -> tuple[Path, Path]:
    """The pair laid out as the Hugging Face cache does: ``snapshots/REV/FILE`` links into ``blobs/SHA``."""
    dirs = []
    for src in pair:
        repo = root / f"models--org--{src.name}"
        (repo / "blobs").mkdir(parents=True)
        snap = repo / "snapshots" / "rev"
        snap.mkdir(parents=True)
        for f in sorted(src.iterdir()):
            blob = repo / "blobs" / hashlib.sha256(f.read_bytes()).hexdigest()
            shutil.copyfile(f, blob)
            (snap / f.name).symlink_to(Path("..", "..", "blobs", blob.name))
        dirs.append(snap)
    return dirs[0], dirs[1]


@pytest.mark.parametrize("cmd", ["convert", "build"])
def test_output_onto_the_hf_cache_blobs_of_an_input_is_refused(pair, tmp_path, cmd):
    """--force onto the blobs/ directory that a snapshot's files link into would delete the real weights."""
    d, t = _hf_cache(pair, tmp_path / "hub")
    blobs = t.parent.parent / "blobs"
    before = _snapshot(tmp_path / "hub")
    code, text = _cli(cmd, "--drafter", d, "--target-dir", t, "--output", blobs, "--force", "--no-verify"
                      if cmd == "build" else "--force")
    _one_error(code, text, "--output", "contains the target directory's", "a symbolic link to")
    assert _snapshot(tmp_path / "hub") == before
    assert overlap(blobs / "new", [("target directory", t)]) is None        # beside the blobs is fine


# ---- bench -------------------------------------------------------------------------------------------
def test_prepare_dataset_output_is_an_input(pair, tmp_path):
    d, t = pair
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps(["hello there", "a b c"]))
    before = prompts.read_bytes()
    code, text = _cli("bench", "prepare-dataset", "--prompts", prompts, "--target-dir", t, "--output", prompts)
    _one_error(code, text, "--output", "--prompts file")
    assert prompts.read_bytes() == before
    code, text = _cli("bench", "prepare-dataset", "--synthetic", "token-unif-dist", "--target-dir", t,
                      "--num-requests", 2, "--input-min", 1, "--input-max", 4, "--output-min", 1, "--output-max", 4,
                      "--output", t / "data.jsonl")
    _one_error(code, text, "--output", "target directory")
    assert not (t / "data.jsonl").exists()


def test_bench_run_report_files_must_not_be_inputs(engine, tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text('{"task_id": 0, "input_ids": [5, 6, 7], "output_tokens": 4}\n')
    before = data.read_bytes()
    e_before = _snapshot(engine)
    for args, needle in ((("--json", data), "--json"), (("--json", engine / "report.json"), "engine directory"),
                         (("--plot", data), "--plot"),
                         (("--json", tmp_path / "r.json", "--plot", tmp_path / "r.json"), "--json report")):
        code, text = _cli("bench", "run", "--engine-dir", engine, "--dataset", data, "--concurrency", 1,
                          "--no-baseline", "--no-progress", *args)
        _one_error(code, text, needle)
    assert data.read_bytes() == before and _snapshot(engine) == e_before
    assert not (tmp_path / "r.json").exists()


def test_bench_project_json_must_not_be_its_report(tmp_path):
    rep = tmp_path / "rep.json"
    rep.write_text('{"not": "a report"}')
    code, text = _cli("bench", "project", "--acceptance-from", rep, "--json", rep)
    _one_error(code, text, "--json", "--acceptance-from report")
    assert rep.read_text() == '{"not": "a report"}'


def test_serve_log_must_not_overwrite_the_engine(engine, tmp_path):
    e = tmp_path / "E"
    shutil.copytree(engine, e)
    before = _snapshot(e)
    code, text = _cli("serve", "--engine-dir", e, "--log", e / "config.json", "--port", 1)
    _one_error(code, text, "--log", "engine directory")
    code, text = _cli("serve", "--engine-dir", e, "--log", tmp_path, "--port", 1)
    _one_error(code, text, "--log")
    assert _snapshot(e) == before


def test_build_dry_run_refuses_what_the_build_would(pair):
    d, t = pair
    code, text = _cli("build", "--drafter", d, "--target-dir", t, "--dry-run", "--output", t / "E")
    _one_error(code, text, "--output", "lies inside the target directory")
    code, text = _cli("build", "--drafter", d, "--target-dir", t, "--dry-run", "--output", t.parent / "E")
    assert code == 0, text


def test_target_layer_ids_out_of_order_is_warned(pair, tmp_path):
    """Issue 21 (older commands): target_layer_ids in another order than ascending were accepted silently; now
    inspect shows a WARN line and the commands that load the pair say it once on stderr (still accepted)."""
    d, t = pair
    cfg = json.loads((d / "config.json").read_text())
    cfg["dflash_config"]["target_layer_ids"] = [2, 0]
    (d / "config.json").write_text(json.dumps(cfg))
    code, text = _cli("inspect", "--drafter", d, "--target-dir", t)
    assert code == 0, text
    assert "WARN dflash_config.target_layer_ids [2, 0] are not in ascending order ([0, 2])" in text
    code, text = _cli("convert", "--drafter", d, "--target-dir", t, "--output", tmp_path / "ck")
    assert code == 0, text
    assert text.count("warning: dflash_config.target_layer_ids [2, 0] are not in ascending order") == 1, text
    cfg["dflash_config"]["target_layer_ids"] = [0, 2]
    (d / "config.json").write_text(json.dumps(cfg))
    code, text = _cli("convert", "--drafter", d, "--target-dir", t, "--output", tmp_path / "ck2")
    assert code == 0 and "warning" not in text, text


def test_a_symbolic_link_loop_is_one_error_line(tmp_path, tiny_dense):
    """Python 3.11's Path.resolve raises RuntimeError on a link loop: that was a traceback."""
    from click.testing import CliRunner

    from dflash2_trt.cli import main

    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    for out in (tmp_path / "a", tmp_path / "a" / "x"):
        r = CliRunner().invoke(main, ["convert", "--drafter", str(tiny_dense.drafter_dir), "--target-dir",
                                      str(tiny_dense.target_dir), "--output", str(out), "--force"])
        lines = [ln for ln in r.output.splitlines() if ln.strip()]
        assert r.exit_code == 1 and len(lines) == 1 and "symbolic link loop" in lines[0], r.output
