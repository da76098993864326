"""Exact round trip: the rank shards reassemble into the original HF tensors, bit for bit.

The reassembly (cv_reassemble.py) is written independently of the converter's weight maps.
"""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from safetensors.torch import load_file

from cv_reassemble import reassemble
from dflash2_trt.convert import CheckpointConfig, convert_pair

# The text-only engine drops the vision towers (Qwen3.5's ``visual``; Muse Glimmer's tower, adapter, projection).
VISION_PREFIXES = ("model.visual.", "model.vision_tower.", "model.vision_adapter.", "model.vision_projection.")


def _hf_tensors(drafter_dir, target_dir) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(target_dir.glob("*.safetensors")):
        out.update(load_file(str(f)))
    for f in sorted(drafter_dir.glob("*.safetensors")):
        out.update({"drafter/" + k: v for k, v in load_file(str(f)).items()})
    return out


def _check_roundtrip(drafter_dir, target_dir, out_dir, *, dtype=None):
    hf = _hf_tensors(drafter_dir, target_dir)
    got = reassemble(out_dir)
    dropped = {k for k in hf if k.startswith(VISION_PREFIXES)}
    assert set(got) == set(hf) - dropped, (sorted(set(hf) - dropped - set(got))[:5], sorted(set(got) - set(hf))[:5])
    manifest = json.loads((out_dir / "manifest.json").read_text())
    assert sum(manifest["dropped"].values()) == len(dropped)
    for name, t in got.items():
        want = hf[name]
        if dtype is not None and not (name.endswith(("A_log", "dt_bias")) and want.dtype == torch.float32):
            want = want.to(dtype)
        assert t.dtype == want.dtype, name
        assert t.shape == want.shape, (name, t.shape, want.shape)
        assert torch.equal(t, want), name


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
@pytest.mark.parametrize("family", ["qwen3", "qwen3_5", "muse_glimmer"])
def test_roundtrip_wide_every_tp(wide_pairs, family, tp, tmp_path):
    d, t = wide_pairs[family]
    out = tmp_path / "ckpt"
    res = convert_pair(d, t, out, tp_size=tp)
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["config.json", "manifest.json"] + [f"rank{r}.safetensors" for r in range(tp)])
    assert CheckpointConfig.load(out).tp_size == tp
    _check_roundtrip(d, t, out)
    # Nothing else is left beside the output (the temporary directory was renamed).
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    assert res.bytes_read > 0


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_roundtrip_standard_tiny(tiny, tp, tmp_path):
    out = tmp_path / "ckpt"
    convert_pair(tiny.drafter_dir, tiny.target_dir, out, tp_size=tp)
    _check_roundtrip(tiny.drafter_dir, tiny.target_dir, out)


@pytest.mark.parametrize("dtype,torch_dtype", [("bfloat16", torch.bfloat16), ("float16", torch.float16)])
def test_roundtrip_with_dtype_cast(tiny_hybrid, dtype, torch_dtype, tmp_path):
    out = tmp_path / "ckpt"
    convert_pair(tiny_hybrid.drafter_dir, tiny_hybrid.target_dir, out, tp_size=2, dtype=dtype)
    _check_roundtrip(tiny_hybrid.drafter_dir, tiny_hybrid.target_dir, out, dtype=torch_dtype)
    cfg = CheckpointConfig.load(out)
    assert cfg["dtype"] == dtype and cfg.dflash2["dtype"] == dtype
    # The Gated DeltaNet decay parameters stay float32 (stored float32 in the source).
    shard = load_file(str(out / "rank0.safetensors"))
    assert shard["transformer.layers.0.linear_attention.A_log"].dtype == torch.float32
    assert shard["transformer.layers.0.linear_attention.qkv.weight"].dtype == torch_dtype


def test_tied_embeddings(tied_pair, tmp_path):
    d, t = tied_pair
    from safetensors import safe_open

    with safe_open(str(t / "model.safetensors"), "pt") as f:
        assert "lm_head.weight" not in f.keys()  # transformers does not save the tied copy
    out = tmp_path / "ckpt"
    convert_pair(d, t, out, tp_size=2)
    cfg = CheckpointConfig.load(out)
    assert cfg["tie_word_embeddings"] is True
    _check_roundtrip(d, t, out)  # checks lm_head shards == embedding


def test_manifest_lists_every_file_with_size_and_sha256(wide_pairs, tmp_path):
    d, t = wide_pairs["qwen3_5"]
    out = tmp_path / "ckpt"
    convert_pair(d, t, out, tp_size=4)
    manifest = json.loads((out / "manifest.json").read_text())
    listed = {f["name"]: f for f in manifest["files"]}
    assert set(listed) == {p.name for p in out.iterdir()} - {"manifest.json"}
    for name, f in listed.items():
        data = (out / name).read_bytes()
        assert f["size"] == len(data)
        assert f["sha256"] == hashlib.sha256(data).hexdigest(), name
    for kind, src in (("target", t), ("drafter", d)):
        ident = manifest["sources"][kind]
        assert ident["path"] == str(src.resolve())
        assert ident["config_sha256"] == hashlib.sha256((src / "config.json").read_bytes()).hexdigest()
        assert [f["name"] for f in ident["files"]] == ["model.safetensors"]
    assert manifest["tp_size"] == 4 and manifest["schema_version"] == 1


def test_config_fields(wide_pairs, tmp_path):
    d, t = wide_pairs["qwen3_5"]
    out = tmp_path / "ckpt"
    convert_pair(d, t, out, tp_size=2)
    cfg = CheckpointConfig.load(out)
    assert cfg["architecture"] == "DFlash2Qwen3_5ForCausalLM"
    assert cfg["max_draft_len"] == cfg.dflash2["block_size"] - 1 == 7
    assert cfg["mapping"] == {"world_size": 2, "tp_size": 2, "pp_size": 1}
    assert cfg["rotary_dim"] == 4 and cfg["layernorm_weight_offset"] == 1.0
    assert cfg["linear_attention"]["num_value_heads"] == 8
    assert cfg.dflash2["target_layer_ids"] == [0, 2, 3]
    assert cfg.dflash2["target_hidden_size"] == 64


@pytest.mark.parametrize("kernel_copy", [True, False])
def test_roundtrip_across_many_small_chunks(wide_pairs, kernel_copy, tmp_path, monkeypatch):
    """Every tiny tensor fits one 64 MiB chunk, so the chunk-boundary arithmetic (row windows,
    piece clipping, out-of-order hashing, the two rotating maps) is only exercised with small
    chunks: 700 bytes is not a multiple of any row size here, and cuts pieces mid-way."""
    from dflash2_trt.convert import driver

    monkeypatch.setattr(driver, "CHUNK_BYTES", 700)
    monkeypatch.setattr(driver, "KERNEL_COPY", kernel_copy)
    d, t = wide_pairs["qwen3_5"]
    out = tmp_path / "ckpt"
    convert_pair(d, t, out, tp_size=4)
    _check_roundtrip(d, t, out)
    for f in json.loads((out / "manifest.json").read_text())["files"]:
        assert f["sha256"] == hashlib.sha256((out / f["name"]).read_bytes()).hexdigest(), f["name"]
    cast = tmp_path / "cast"
    convert_pair(d, t, cast, tp_size=8, dtype="bfloat16")  # column slices + casts, chunk by chunk
    _check_roundtrip(d, t, cast, dtype=torch.bfloat16)


def test_muse_glimmer_config_fields(wide_pairs, tmp_path):
    """The muse_glimmer keys say what transformers computes (the wide pair decouples NoPE from
    the layer kind: layers 1 and 2 are NoPE, 1 and 3 full attention)."""
    d, t = wide_pairs["muse_glimmer"]
    out = tmp_path / "ckpt"
    convert_pair(d, t, out, tp_size=2)
    cfg = CheckpointConfig.load(out)
    assert cfg["architecture"] == "DFlash2MuseGlimmerForCausalLM" and cfg.family == "muse_glimmer"
    assert cfg["q_scaling"] == pytest.approx(1 / 3.87)
    assert cfg["layer_rotary_base"] == [10000.0, 0.0, 0.0, 10000.0]
    assert cfg["layer_types"] == ["sliding_attention", "full_attention"] * 2 and cfg["sliding_window"] == 5
    assert (cfg["norm_epsilon"], cfg["post_norm_epsilon"]) == (1e-2, 1e-6)
    assert cfg["layernorm_weight_offset"] == 1.0 and cfg["ln_f_weight_offset"] == 0.0
    assert cfg["qk_layernorm_weight"] is False and cfg["attn_output_gate"] is True and cfg["inter_layernorms"]
    assert cfg["embedding_norm"] is True
    assert (cfg["output_multiplier"], cfg["final_logit_softcapping"]) == (2.0, 20.0)
    assert cfg["max_draft_len"] == 15 and cfg.dflash2["output_multiplier"] == 0.5   # the drafter's own
    manifest = json.loads((out / "manifest.json").read_text())
    assert set(manifest["dropped"]) == {"vision tower, adapter and projection: the engine is text only"}


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_roundtrip_tiny_muse_every_tp(tp, tmp_path):
    """`convert --target tiny-muse` (the shipped trained pair: 8 query / 2 KV heads, so every tp splits)."""
    from click.testing import CliRunner

    from dflash2_trt.assets import trained_pair
    from dflash2_trt.cli import main

    p = trained_pair("muse_glimmer")
    out = tmp_path / "ckpt"
    res = CliRunner().invoke(main, ["convert", "--target", "tiny-muse", "--output", str(out), "--tp-size", str(tp)])
    assert res.exit_code == 0, res.output
    assert CheckpointConfig.load(out).tp_size == tp
    _check_roundtrip(p.drafter_dir, p.target_dir, out)
