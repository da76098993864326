"""`dflash2-trt targets` and `inspect`: output, JSON, exit codes, clear errors."""

from __future__ import annotations

import json
import shutil

from click.testing import CliRunner

from dflash2_trt.cli import main
from dflash2_trt.targets import TARGETS, get_target
from dflash2_trt.testing.fixtures import MUSE_TARGET, QWEN_DRAFTER

import pytest
from dflash2_trt.errors import DFlash2Error


def run(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_targets_lists_registry():
    r = run("targets", "--json")
    assert r.exit_code == 0
    rows = {x["key"]: x for x in json.loads(r.output)}
    assert set(rows) >= {"qwen3.8-27b", "muse-glimmer-30b", "tiny"}
    assert rows["qwen3.8-27b"]["target"] == "Qwen/Qwen3.8-27B" and rows["qwen3.8-27b"]["block_size"] == 8
    assert rows["muse-glimmer-30b"]["block_size"] == 16
    for e in TARGETS.values():
        assert e.build_config_path.is_file(), e.build_config


def test_registry_support_claims_match_the_converter():
    """`convert` is claimed exactly for the families the converter has a weight map for."""
    from dflash2_trt.convert.driver import FAMILY_MAPS

    for e in TARGETS.values():
        assert ("convert" in e.supported) == (e.family in FAMILY_MAPS), e.key


def test_registry_engine_claims_match_the_network():
    """`build` / `run` (every backend builds the one network) are claimed exactly for the families the engine network
    has a target for."""
    from dflash2_trt.trtllm.backend import load_network

    families = load_network("cpu").TARGET_FAMILIES
    for e in TARGETS.values():
        assert ("build" in e.supported) == ("run" in e.supported), e.key
        if "build" in e.supported:
            assert e.family in families, e.key
        elif e.family in families:   # the family is there but this pair is not: the notes must say why
            assert "fit" in e.notes or "not" in e.notes, e.key


def test_build_configs_load():
    from dflash2_trt.config.build import BuildConfig

    for e in TARGETS.values():
        bc = BuildConfig.load(e.build_config_path)
        assert bc.target == e.key and bc.block_size == e.block_size


def test_exact_keys_only():
    with pytest.raises(DFlash2Error, match="unknown target 'qwen3.8-27B'; known targets: qwen3.8-27b"):
        get_target("qwen3.8-27B")
    r = CliRunner().invoke(main, ["inspect", "--target", "qwen3-27b"])
    assert r.exit_code == 1 and "unknown target" in r.output and "Traceback" not in r.output


def test_inspect_pair_json(tiny):
    r = run("inspect", "--drafter", str(tiny.drafter_dir), "--target-dir", str(tiny.target_dir), "--json")
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output)
    assert rep["ok"] and rep["pairing"]["ok"]
    assert rep["drafter_dir"] == str(tiny.drafter_dir.resolve())
    assert rep["target_dir"] == str(tiny.target_dir.resolve())
    assert rep["drafter"]["inventory"]["missing"] == [] and rep["drafter"]["inventory"]["unexpected"] == []
    assert rep["target"]["family"] == tiny.family
    assert rep["drafter"]["parameters"]["candidate_selector.successor_codebook"] == 256 * 16
    assert rep["drafter"]["config"]["block_size"] == 8


@pytest.mark.parametrize("key", ["tiny", "tiny-hybrid"])
def test_inspect_registered_tiny(key):
    from dflash2_trt.targets import resolve_dirs

    r = run("inspect", "--target", key, "--json")
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output)
    d, t = resolve_dirs(get_target(key))
    assert rep["ok"] and rep["drafter_dir"] == str(d.resolve()) and rep["target_dir"] == str(t.resolve())
    assert rep["target"]["family"] == get_target(key).family


def test_inspect_text_and_values(tiny_dense):
    r = run("inspect", str(tiny_dense.drafter_dir), "--check-values")
    assert r.exit_code == 0 and "contract: OK" in r.output and "layers.*.mlp_conv" in r.output


def test_inspect_config_only_dir_says_no_weights():
    r = run("inspect", str(QWEN_DRAFTER))
    assert r.exit_code == 0
    assert "NOT CHECKED" in r.output and "no tensors were" in r.output
    r = run("inspect", str(MUSE_TARGET), "--json")
    rep = json.loads(r.output)
    assert rep["weights_checked"] is False and rep["family"] == "muse_glimmer"
    assert rep["parameters_source"] == "config" and rep["total_parameters"] > 20e9


def test_inspect_fails_on_broken_drafter(tiny_dense, tmp_path):
    from safetensors.torch import save_file

    from dflash2_trt.checkpoint import SafetensorsCheckpoint

    d = tmp_path / "drafter"
    shutil.copytree(tiny_dense.drafter_dir, d)
    ck = SafetensorsCheckpoint(d)
    t = {k: ck.get(k).clone() for k in ck.keys()}
    ck.close()
    t["fc.weight"] = t["fc.weight"][:, :64].contiguous()
    t["norm.weight"][0] = float("nan")
    save_file(t, str(d / "model.safetensors"))
    r = CliRunner().invoke(main, ["inspect", "--drafter", str(d), "--target-dir", str(tiny_dense.target_dir),
                                  "--check-values", "--json"])
    assert r.exit_code == 1
    rep = json.loads(r.output)
    assert any("fc.weight: shape [64, 64]" in p for p in rep["drafter"]["problems"])
    assert any("norm.weight" in p and "non-finite" in p for p in rep["drafter"]["problems"])
    assert any(p.startswith("fc.weight") for p in rep["pairing"]["problems"])


def test_inspect_missing_checkpoint_is_clear(tmp_path):
    """A published pair not downloaded: inspect reads the configs shipped in the package, says so, and checks the
    contract from them (as build --dry-run plans from them); --check-values needs the weights and says how to get
    them."""
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path), "DFLASH2_TRT_MODELS": str(tmp_path / "none")}
    r = CliRunner().invoke(main, ["inspect", "--target", "qwen3.8-27b", "--json"], env=env)
    assert r.exit_code == 0, r.output
    assert r.output.count("note: ") == 2 and "is not available locally: read from its config shipped" in r.output
    rep = json.loads(r.output[r.output.index("\n{") + 1:])
    assert rep["ok"] is True and rep["drafter"]["weights_checked"] is False
    assert rep["target_dir"].endswith("assets/published/Qwen__Qwen3.8-27B")
    r = CliRunner().invoke(main, ["inspect", "--target", "qwen3.8-27b", "--check-values"], env=env)
    assert r.exit_code == 1
    assert "not available locally" in r.output and "--download" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(main, ["inspect", str(tmp_path)])
    assert r.exit_code == 1 and "config file not found" in r.output


def test_a_tokenizer_with_ids_beyond_the_vocabulary_is_a_warning(tmp_path):
    """A target directory whose tokenizer has an id its embedding has no row for (another model's tokenizer) passed
    inspect silently; `run --prompt` then refused a bad request without naming the tokenizer. inspect now warns
    (the contract still holds: the engine takes ids and builds without a tokenizer); a clean tokenizer gives none."""
    from dflash2_trt.assets import trained_pair

    src = trained_pair("qwen3").target_dir
    r = run("inspect", str(src), "--json")
    assert r.exit_code == 0 and json.loads(r.output)["warnings"] == [], r.output
    t = tmp_path / "target"
    shutil.copytree(src, t)
    tj = t / "tokenizer.json"
    text = tj.read_text(encoding="utf-8")
    assert text.count('linu": 100,') == 1
    tj.write_text(text.replace('linu": 100,', 'linu": 300,'), encoding="utf-8")
    r = run("inspect", str(t))
    assert r.exit_code == 0 and "contract: OK" in r.output, r.output
    assert "WARN tokenizer: 1 token id(s) from 300 to 300 are outside vocab_size 256 (config.json)" in r.output
    r = run("inspect", "--drafter", str(trained_pair("qwen3").drafter_dir), "--target-dir", str(t))
    assert r.exit_code == 0 and "WARN tokenizer: 1 token id(s)" in r.output and "RESULT: OK" in r.output, r.output
    tj.write_text("{not json", encoding="utf-8")
    r = run("inspect", str(t), "--json")
    (w,) = json.loads(r.output)["warnings"]
    assert r.exit_code == 0 and "has tokenizer files that cannot be loaded" in w, w


def test_a_download_that_fails_says_why_and_does_not_suggest_download(tmp_path, monkeypatch):
    """With --download, the download's own failure (no network, 401 / 404, a full disk) is the error, in one line;
    the advice to "add --download" is for runs without it."""
    import huggingface_hub

    def refused(repo_id, local_files_only=False, **kw):
        if local_files_only:
            raise FileNotFoundError("not in the cache")
        raise OSError(f"401 Client Error: Unauthorized for url https://huggingface.co/{repo_id}\nmore detail")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", refused)
    monkeypatch.delenv("DFLASH2_TRT_MODELS", raising=False)
    r = CliRunner().invoke(main, ["inspect", "--target", "qwen3.8-27b", "--download"])
    assert r.exit_code == 1 and r.output.strip().splitlines() == [r.output.strip()], r.output
    assert r.output.startswith("error: --download: drafter z-lab/Qwen3.8-27B-DFlash2") and "401" in r.output
    assert "add --download" not in r.output and "more detail" not in r.output
    r = CliRunner().invoke(main, ["inspect", "--target", "qwen3.8-27b"])     # the shipped configs, and how to get more
    assert r.exit_code == 0 and "no weights; --download fetches them)" in r.output, r.output
    r = CliRunner().invoke(main, ["inspect", "--target", "qwen3.8-27b", "--check-values"])
    assert r.exit_code == 1 and "add --download" in r.output
    r = CliRunner().invoke(main, ["build", "--target", "qwen3.8-27b", "--dry-run", "--download"])
    assert r.exit_code == 0 and "(--download failed: OSError: 401 Client Error" in r.output


def test_inspect_names_an_engine_directory_and_a_converted_checkpoint(tmp_path):
    """`inspect ENGINE_DIR` said "config.json: architectures: cannot tell the architecture" (the engine's config.json
    is TensorRT-LLM's); an engine directory and a converted checkpoint are now named for what they are, in one line."""
    out = tmp_path / "eng"
    r = CliRunner().invoke(main, ["build", "--target", "tiny", "--backend", "cpu", "--output", str(out), "--no-verify"])
    assert r.exit_code == 0, r.output
    for path, needle in ((out, "an engine directory (engine.json), not a Hugging Face checkpoint"),
                         (out / "checkpoint", "a TensorRT-LLM checkpoint written by `dflash2-trt convert`")):
        r = CliRunner().invoke(main, ["inspect", str(path)])
        lines = r.output.strip().splitlines()
        assert r.exit_code == 1 and len(lines) == 1 and lines[0].startswith(f"error: {path}: {needle}"), r.output
