"""Bad inputs: each is one clear error, and no output directory (nor temporary one) is left."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from dflash2_trt.checkpoint import writer as writer_mod
from dflash2_trt.convert import driver as driver_mod
from dflash2_trt.cli import main
from dflash2_trt.convert import convert_pair
from dflash2_trt.errors import CheckpointError, ConfigError, DFlash2Error


def _copy_pair(pair, root: Path) -> tuple[Path, Path]:
    d, t = root / "drafter", root / "target"
    shutil.copytree(pair.drafter_dir, d)
    shutil.copytree(pair.target_dir, t)
    return d, t


def _edit(directory: Path, fn) -> None:
    path = directory / "model.safetensors"
    sd = load_file(str(path))
    fn(sd)
    save_file(sd, str(path), metadata={"format": "pt"})


def _only(root: Path, *names: str) -> None:
    """The directory holds exactly ``names``: no output, no temporary directory."""
    assert sorted(p.name for p in root.iterdir()) == sorted(names)


@pytest.fixture
def work(tiny_hybrid, tmp_path):
    d, t = _copy_pair(tiny_hybrid, tmp_path / "src")
    out_root = tmp_path / "out"
    out_root.mkdir()
    return d, t, out_root


CASES = {
    "missing target tensor": ("target", lambda sd: sd.pop("model.language_model.layers.1.mlp.up_proj.weight"),
                              "model.language_model.layers.1.mlp.up_proj.weight"),
    "missing drafter tensor": ("drafter", lambda sd: sd.pop("layers.0.mlp_conv.base_kernel"),
                               "layers.0.mlp_conv.base_kernel"),
    "wrong shape": ("target", lambda sd: sd.update({"model.language_model.layers.1.self_attn.k_proj.weight":
                                                    torch.zeros(16, 64)}), "shape [16, 64], expected [32, 64]"),
    "unmapped extra tensor": ("target", lambda sd: sd.update({"model.language_model.layers.0.extra.weight":
                                                              torch.zeros(4)}), "unmapped"),
    "unmapped drafter tensor": ("drafter", lambda sd: sd.update({"layers.0.extra_conv.weight": torch.zeros(4)}),
                                "layers.0.extra_conv.weight"),
    "wrong dtype": ("target", lambda sd: sd.update({"model.language_model.norm.weight": torch.zeros(64,
                                                    dtype=torch.float16)}), "dtype F16, expected F32"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_checkpoint_is_a_clear_error(work, case):
    d, t, out_root = work
    which, fn, needle = CASES[case]
    _edit(t if which == "target" else d, fn)
    with pytest.raises(CheckpointError) as exc:
        convert_pair(d, t, out_root / "ckpt", tp_size=2)
    assert needle in str(exc.value)
    assert str(t if which == "target" else d) in str(exc.value)  # names the checkpoint
    _only(out_root)


def test_non_finite_tensor_fails_while_streaming_and_cleans_up(work):
    d, t, out_root = work

    def poison(sd):
        sd["model.language_model.layers.3.mlp.down_proj.weight"][5, 7] = float("nan")
    _edit(t, poison)
    with pytest.raises(CheckpointError, match="non-finite.*down_proj|down_proj.*non-finite"):
        convert_pair(d, t, out_root / "ckpt", tp_size=2)
    _only(out_root)


def test_dtype_cast_overflow_is_an_error_and_cleans_up(work):
    """A finite float32 weight beyond float16's range would become inf with --dtype float16."""
    d, t, out_root = work

    def big(sd):
        sd["model.language_model.layers.1.mlp.up_proj.weight"][3, 5] = 1.0e5  # float16 max: 65504
    _edit(t, big)
    with pytest.raises(CheckpointError, match="overflow F16") as exc:
        convert_pair(d, t, out_root / "ckpt", tp_size=2, dtype="float16")
    assert "layers.1.mlp.up_proj.weight" in str(exc.value)
    _only(out_root)
    convert_pair(d, t, out_root / "ckpt", tp_size=2, dtype="bfloat16")  # in range for bfloat16: fine


@pytest.mark.parametrize("family_fixture,field", [("tiny_dense", "num_attention_heads"),
                                                  ("tiny_hybrid", "text_config.linear_num_value_heads")])
def test_tp_not_dividing_heads(request, family_fixture, field, tmp_path):
    pair = request.getfixturevalue(family_fixture)
    with pytest.raises(ConfigError) as exc:
        convert_pair(pair.drafter_dir, pair.target_dir, tmp_path / "ckpt", tp_size=8)
    assert exc.value.field == field and "--tp-size 8" in str(exc.value)
    _only(tmp_path)


def test_tp_size_must_be_supported(tiny_dense, tmp_path):
    with pytest.raises(ConfigError, match="--tp-size"):
        convert_pair(tiny_dense.drafter_dir, tiny_dense.target_dir, tmp_path / "ckpt", tp_size=3)
    _only(tmp_path)


def test_non_empty_output_needs_force(tiny_dense, tmp_path):
    out = tmp_path / "ckpt"
    out.mkdir()
    (out / "keep.txt").write_text("user data")
    with pytest.raises(DFlash2Error, match="not empty.*--force"):
        convert_pair(tiny_dense.drafter_dir, tiny_dense.target_dir, out)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    _only(tmp_path, "ckpt")
    # --force replaces only an earlier output: a directory of other files is kept (a mistyped --output)
    with pytest.raises(DFlash2Error, match="holds no dflash2-trt output .*remove it yourself"):
        convert_pair(tiny_dense.drafter_dir, tiny_dense.target_dir, out, force=True)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    (out / "keep.txt").unlink()
    convert_pair(tiny_dense.drafter_dir, tiny_dense.target_dir, out)
    (out / "extra.txt").write_text("left by hand in an earlier output")
    convert_pair(tiny_dense.drafter_dir, tiny_dense.target_dir, out, force=True)
    assert "extra.txt" not in {p.name for p in out.iterdir()} and (out / "rank0.safetensors").is_file()
    _only(tmp_path, "ckpt")
    # a damaged marker does not count: manifest.json that is not one of ours
    (out / "manifest.json").write_text('{"format": "something else"}')
    with pytest.raises(DFlash2Error, match="holds no dflash2-trt output"):
        convert_pair(tiny_dense.drafter_dir, tiny_dense.target_dir, out, force=True)


def test_empty_output_dir_is_used(tiny_dense, tmp_path):
    (tmp_path / "ckpt").mkdir()
    convert_pair(tiny_dense.drafter_dir, tiny_dense.target_dir, tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "manifest.json").is_file()


def test_output_is_a_file(tiny_dense, tmp_path):
    (tmp_path / "ckpt").write_text("x")
    with pytest.raises(DFlash2Error, match="not a directory"):
        convert_pair(tiny_dense.drafter_dir, tiny_dense.target_dir, tmp_path / "ckpt", force=True)


def test_missing_parents_are_created_and_removed_on_failure(work):
    d, t, out_root = work
    _edit(t, lambda sd: sd["model.language_model.norm.weight"].fill_(float("inf")))
    with pytest.raises(CheckpointError):
        convert_pair(d, t, out_root / "a" / "b" / "ckpt")
    _only(out_root)


def _interrupt_after(monkeypatch, n: int):
    real = writer_mod.StreamingSafetensorsWriter.write
    calls = {"n": 0}

    def write(self, *a, **kw):
        calls["n"] += 1
        if calls["n"] > n:
            raise KeyboardInterrupt
        return real(self, *a, **kw)
    monkeypatch.setattr(writer_mod.StreamingSafetensorsWriter, "write", write)


def test_ctrl_c_leaves_nothing(tiny_hybrid, tmp_path, monkeypatch):
    _interrupt_after(monkeypatch, 20)
    with pytest.raises(KeyboardInterrupt):
        convert_pair(tiny_hybrid.drafter_dir, tiny_hybrid.target_dir, tmp_path / "ckpt", tp_size=4)
    _only(tmp_path)


def test_ctrl_c_with_force_keeps_the_old_output(tiny_hybrid, tmp_path, monkeypatch):
    out = tmp_path / "ckpt"
    convert_pair(tiny_hybrid.drafter_dir, tiny_hybrid.target_dir, out, tp_size=1)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    _interrupt_after(monkeypatch, 20)
    with pytest.raises(KeyboardInterrupt):
        convert_pair(tiny_hybrid.drafter_dir, tiny_hybrid.target_dir, out, tp_size=2, force=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    _only(tmp_path, "ckpt")


_SLOW_CONVERT = textwrap.dedent("""
    import sys, time
    from dflash2_trt.checkpoint import writer
    real = writer.StreamingSafetensorsWriter.write
    def slow(self, *a, **kw):
        time.sleep(0.01)
        return real(self, *a, **kw)
    writer.StreamingSafetensorsWriter.write = slow
    from dflash2_trt.convert import convert_pair
    convert_pair(sys.argv[1], sys.argv[2], sys.argv[3], tp_size=4)
""")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_real_signal_leaves_nothing(tiny_hybrid, tmp_path, sig):
    proc = subprocess.Popen([sys.executable, "-c", _SLOW_CONVERT, str(tiny_hybrid.drafter_dir),
                             str(tiny_hybrid.target_dir), str(tmp_path / "ckpt")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 60
    while time.time() < deadline and not any(p.name.startswith(".ckpt.tmp-") for p in tmp_path.iterdir()):
        time.sleep(0.02)
    assert proc.poll() is None, proc.communicate()
    time.sleep(0.2)  # well inside the (slowed) stream
    proc.send_signal(sig)
    proc.wait(timeout=60)
    assert proc.returncode != 0
    _only(tmp_path)


_LOST_CTRL_C = textwrap.dedent("""
    import signal, sys
    from dflash2_trt.checkpoint import writer
    from dflash2_trt.testing.stops import lose_a_signal
    real = writer.StreamingSafetensorsWriter.write
    calls = []

    def write(self, *a, **kw):
        calls.append(1)
        if len(calls) == 5:   # in importlib's weakref callback, just after it took the import lock
            lose_a_signal(signal.SIGINT, hold_import_lock=True)
            print("lost a Ctrl-C", file=sys.stderr, flush=True)
        return real(self, *a, **kw)
    writer.StreamingSafetensorsWriter.write = write
    from dflash2_trt.convert import convert_pair
    convert_pair(sys.argv[1], sys.argv[2], sys.argv[3], tp_size=4)
""")


def test_a_lost_ctrl_c_still_stops_the_convert(tiny_hybrid, tmp_path):
    """The hang seen once in CI: Python lost a Ctrl-C's exception and left the import lock held, so the target
    inventory's thread (still importing torch) never ended and the convert waited on it forever."""
    proc = subprocess.run([sys.executable, "-c", _LOST_CTRL_C, str(tiny_hybrid.drafter_dir),
                           str(tiny_hybrid.target_dir), str(tmp_path / "ckpt")], capture_output=True, text=True,
                          timeout=60)
    assert "lost a Ctrl-C" in proc.stderr, proc.stderr
    assert proc.returncode != 0 and "KeyboardInterrupt" in proc.stderr, proc.stderr
    _only(tmp_path)


def test_the_inventory_wait_ends_on_a_recorded_stop(tiny_hybrid, monkeypatch):
    """A stop recorded while the target inventory's thread cannot finish ends the wait for it."""
    from dflash2_trt.checkpoint.reader import SafetensorsCheckpoint
    from dflash2_trt.config import TargetConfig
    from dflash2_trt.testing.stops import stop_recorded_after

    release = threading.Event()
    monkeypatch.setattr(driver_mod, "expected_target_tensors", lambda t: (release.wait(60), {})[1])
    t = TargetConfig.from_hugging_face(tiny_hybrid.target_dir)
    inventory = driver_mod._TargetInventory(t, SafetensorsCheckpoint(tiny_hybrid.target_dir), [])
    try:
        t0 = time.monotonic()
        with stop_recorded_after(0.3), pytest.raises(KeyboardInterrupt):
            inventory.check()
        assert time.monotonic() - t0 < 10
    finally:
        release.set()


def test_cli_convert_and_errors(tiny_dense, tmp_path):
    runner = CliRunner()
    out = tmp_path / "ckpt"
    args = ["convert", "--drafter", str(tiny_dense.drafter_dir), "--target-dir", str(tiny_dense.target_dir),
            "--output", str(out), "--tp-size", "2"]
    res = runner.invoke(main, args)
    assert res.exit_code == 0, res.output
    assert "wrote" in res.output and (out / "rank1.safetensors").is_file()
    res = runner.invoke(main, args)  # output now not empty
    assert res.exit_code == 1 and "--force" in res.output and "Traceback" not in res.output
    res = runner.invoke(main, args[:-2] + ["--tp-size", "8", "--force"])
    assert res.exit_code == 1 and "num_attention_heads" in res.output
    assert (out / "rank1.safetensors").is_file()  # a failed --force run leaves the old output alone
    res = runner.invoke(main, args + ["--force", "--dtype", "bfloat16"])
    assert res.exit_code == 0, res.output
    assert load_file(str(out / "rank0.safetensors"))["lm_head.weight"].dtype == torch.bfloat16


def test_cli_convert_registered_target(tiny_hybrid, tmp_path, monkeypatch):
    """``--target NAME`` goes through the registry's resolution (stubbed here to the tiny pair)."""
    import dflash2_trt.targets as targets

    seen = {}

    def resolve(entry, **kw):
        seen["key"] = entry.key
        return tiny_hybrid.drafter_dir, tiny_hybrid.target_dir
    monkeypatch.setattr(targets, "resolve_dirs", resolve)
    res = CliRunner().invoke(main, ["convert", "--target", "tiny-hybrid", "--output", str(tmp_path / "ckpt"),
                                    "--tp-size", "4"])
    assert res.exit_code == 0, res.output
    assert seen["key"] == "tiny-hybrid"
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir())[:2] == ["config.json", "manifest.json"]
    res = CliRunner().invoke(main, ["convert", "--target", "no-such-model", "--output", str(tmp_path / "x")])
    assert res.exit_code == 1 and "unknown target" in res.output


def test_muse_per_layer_rope_theta_is_refused(tmp_path):
    """transformers rotates every layer whose layer_rope_theta is non-zero with the GLOBAL rope_theta
    (it ignores the value), so a layer theta that is neither 0 nor rope_theta has no one meaning:
    one clear line naming the field, nothing written. 0 and rope_theta convert."""
    import json
    import shutil

    from dflash2_trt.testing.tiny import build_tiny_drafter, build_tiny_target

    d = build_tiny_drafter("muse_glimmer", tmp_path / "drafter")
    t = build_tiny_target("muse_glimmer", tmp_path / "target")
    cfg = json.loads((t / "config.json").read_text())
    cfg["text_config"]["layer_rope_theta"] = [10000.0, 500.0, 10000.0, 0.0]
    (t / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="layer 1 has RoPE theta 500") as exc:
        convert_pair(d, t, tmp_path / "ckpt")
    assert exc.value.field == "text_config.layer_rope_theta"
    assert not (tmp_path / "ckpt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["drafter", "target"]
    cfg["text_config"]["layer_rope_theta"] = [10000.0, 0.0, 10000.0, 0.0]
    (t / "config.json").write_text(json.dumps(cfg))
    convert_pair(d, t, tmp_path / "ckpt")
    shutil.rmtree(tmp_path / "ckpt")


def test_unsupported_family_is_a_clear_error(tiny_dense, tmp_path, monkeypatch):
    """A family the project reads but has no weight map for: say so, touch nothing. (Every family of
    config.target.FAMILIES converts today, so the guard is exercised with one map removed.)"""
    from dflash2_trt.convert import driver

    monkeypatch.setattr(driver, "FAMILY_MAPS", {k: v for k, v in driver.FAMILY_MAPS.items() if k != "qwen3"})
    with pytest.raises(ConfigError, match="qwen3.*cannot be converted"):
        convert_pair(tiny_dense.drafter_dir, tiny_dense.target_dir, tmp_path / "ckpt")
    assert not (tmp_path / "ckpt").exists()


def test_checkpoint_config_schema_version_is_checked(tiny_dense, tmp_path):
    import json

    from dflash2_trt.convert import CheckpointConfig

    out = tmp_path / "ckpt"
    convert_pair(tiny_dense.drafter_dir, tiny_dense.target_dir, out)
    cfg = json.loads((out / "config.json").read_text())
    cfg["dflash2_trt"]["schema_version"] = 99
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="schema version 99"):
        CheckpointConfig.load(out)
    cfg["dflash2_trt"]["schema_version"] = 1
    cfg["surprise"] = 1
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="unknown field"):
        CheckpointConfig.load(out)


def test_checkpoint_config_family_keys_are_strict(tiny_dense, tmp_path):
    """The muse_glimmer keys are required in a muse_glimmer checkpoint and unknown in any other, so
    a Qwen checkpoint written before them (schema 1) still reads, and none can be half of each."""
    import json

    from dflash2_trt.convert import CheckpointConfig
    from dflash2_trt.convert.schema import FAMILY_KEYS
    from dflash2_trt.testing.tiny import build_tiny_drafter, build_tiny_target

    qwen, muse = tmp_path / "qwen", tmp_path / "muse"
    convert_pair(tiny_dense.drafter_dir, tiny_dense.target_dir, qwen)
    convert_pair(build_tiny_drafter("muse_glimmer", tmp_path / "d"), build_tiny_target("muse_glimmer", tmp_path / "t"),
                 muse)
    q, m = (json.loads((d / "config.json").read_text()) for d in (qwen, muse))
    assert set(m) - set(q) == set(FAMILY_KEYS["muse_glimmer"])
    assert CheckpointConfig.load(muse).family == "muse_glimmer"
    for key in FAMILY_KEYS["muse_glimmer"]:
        (qwen / "config.json").write_text(json.dumps({**q, key: m[key]}))
        with pytest.raises(ConfigError, match="unknown field") as ei:
            CheckpointConfig.load(qwen)
        assert ei.value.field == key
        (muse / "config.json").write_text(json.dumps({k: v for k, v in m.items() if k != key}))
        with pytest.raises(ConfigError, match="missing for qwen_type muse_glimmer") as ei:
            CheckpointConfig.load(muse)
        assert ei.value.field == key
    (muse / "config.json").write_text(json.dumps({**m, "qwen_type": "gemma"}))
    with pytest.raises(ConfigError, match="unsupported qwen_type 'gemma'"):
        CheckpointConfig.load(muse)


@pytest.mark.parametrize("edit, field", [
    (lambda c: c["mapping"].update(tp_size=True, world_size=True), "mapping"),
    (lambda c: c["mapping"].update(tp_size=2.0, world_size=2.0), "mapping"),
    (lambda c: c["dflash2"].pop("target_layer_ids"), "dflash2.target_layer_ids"),
    (lambda c: c.update(max_draft_len=3), "max_draft_len"),
])
def test_checkpoint_config_fields_are_checked(tiny_dense, tmp_path, edit, field):
    import json

    from dflash2_trt.convert import CheckpointConfig

    out = tmp_path / "ckpt"
    convert_pair(tiny_dense.drafter_dir, tiny_dense.target_dir, out)
    assert CheckpointConfig.load(out).tp_size == 1
    cfg = json.loads((out / "config.json").read_text())
    edit(cfg)
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError) as ei:
        CheckpointConfig.load(out)
    assert ei.value.field == field


def test_progress_bar_reports_bytes_per_second(tiny_dense, tmp_path, capsys):
    convert_pair(tiny_dense.drafter_dir, tiny_dense.target_dir, tmp_path / "ckpt", progress=True)
    err = capsys.readouterr().err
    assert "convert" in err and "B/s" in err and "100%" in err
    convert_pair(tiny_dense.drafter_dir, tiny_dense.target_dir, tmp_path / "ckpt2")  # not a terminal: silent
    assert capsys.readouterr().err == ""


def test_output_must_not_replace_a_source(work):
    d, t, out_root = work
    for out in (t, t.parent):
        with pytest.raises(ConfigError, match="--force would delete it"):
            convert_pair(d, t, out, force=True)
    with pytest.raises(ConfigError, match="lies inside the target directory"):   # writing into a source
        convert_pair(d, t, t / "ckpt", force=True)
    assert not (t / "ckpt").exists()
    assert (t / "model.safetensors").is_file() and (d / "model.safetensors").is_file()


def test_a_library_callers_next_convert_is_not_stopped_by_an_earlier_ctrl_c(tiny_hybrid, tmp_path, monkeypatch):
    """convert_pair records a Ctrl-C (so that a lost one still stops it); for a caller outside the CLI (a notebook,
    a script) the record must not outlive the call: the next convert in the process ran into it at once."""
    import os

    from dflash2_trt.errors import pending_stop

    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("needs Python's own Ctrl-C handler in this process")
    real = writer_mod.StreamingSafetensorsWriter.write
    calls = []

    def write(self, *a, **kw):
        calls.append(1)
        if len(calls) == 5:
            os.kill(os.getpid(), signal.SIGINT)   # a real Ctrl-C, through convert's own handler
            time.sleep(1)
        return real(self, *a, **kw)

    monkeypatch.setattr(writer_mod.StreamingSafetensorsWriter, "write", write)
    with pytest.raises(KeyboardInterrupt):
        convert_pair(tiny_hybrid.drafter_dir, tiny_hybrid.target_dir, tmp_path / "a", tp_size=1)
    assert pending_stop() is None and not (tmp_path / "a").exists()
    monkeypatch.setattr(writer_mod.StreamingSafetensorsWriter, "write", real)
    convert_pair(tiny_hybrid.drafter_dir, tiny_hybrid.target_dir, tmp_path / "b", tp_size=1)
    assert (tmp_path / "b" / "manifest.json").is_file()
