"""Layout semantics: a torch forward that reads ONLY the converted checkpoint (TensorRT-LLM names,
fused qkv, TP shards used per rank and reduced) reproduces transformers' target logits and the
reference drafter's logits.

Tolerances (logits of magnitude ~30): the forward runs in float32 in both cases; the sharded
sums are added in a different order than one big matmul, so the float32 comparison is
``atol=1e-3, rtol=1e-4`` (observed max difference ~1e-4). For a bfloat16 / float16 conversion
the reference model gets the same rounded weights (upcast to float32), so the same tolerance
holds: any layout error moves logits by O(1).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dflash2_trt.convert import convert_pair
from dflash2_trt.convert.torch_forward import ConvertedCheckpoint, drafter_forward, target_forward

TOL = {torch.float32: dict(atol=1e-3, rtol=1e-4)}
TOL[torch.bfloat16] = TOL[torch.float16] = TOL[torch.float32]  # same: weights identical, compute fp32


def _hf_model(family: str, target_dir: Path, dtype: torch.dtype = torch.float32):
    import transformers
    from transformers.models.muse_glimmer.modeling_muse_glimmer import MuseGlimmerForConditionalGeneration

    cls = {"qwen3_5": transformers.Qwen3_5ForConditionalGeneration, "muse_glimmer": MuseGlimmerForConditionalGeneration,
           "qwen3": transformers.Qwen3ForCausalLM}[family]
    model = cls.from_pretrained(target_dir, dtype=torch.float32).eval()
    if dtype != torch.float32:  # round the weights like the conversion did, compute in fp32
        with torch.no_grad():
            for name, p in model.named_parameters():
                if not name.endswith(("A_log", "dt_bias")):
                    p.copy_(p.to(dtype).float())
    return model


def _ids(seed: int = 0, b: int = 2, t: int = 13) -> torch.Tensor:
    return torch.randint(0, 256, (b, t), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def hf_outputs(wide_pairs):
    out = {}
    for fam, (_, t) in wide_pairs.items():
        with torch.no_grad():
            out[fam] = _hf_model(fam, t)(input_ids=_ids(), output_hidden_states=True)
    return out


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
@pytest.mark.parametrize("family", ["qwen3", "qwen3_5", "muse_glimmer"])
def test_target_logits_match_transformers(wide_pairs, hf_outputs, family, tp, tmp_path):
    d, t = wide_pairs[family]
    convert_pair(d, t, tmp_path / "ckpt", tp_size=tp)
    ck = ConvertedCheckpoint(tmp_path / "ckpt")
    with torch.no_grad():
        logits, hidden = target_forward(ck, _ids())
    ref = hf_outputs[family]
    torch.testing.assert_close(logits, ref.logits, **TOL[torch.float32])
    # Every layer output (what the drafter taps) matches HF hidden_states[i + 1], not just the logits.
    for i in range(len(hidden) - 1):
        torch.testing.assert_close(hidden[i], ref.hidden_states[i], **TOL[torch.float32])
    assert torch.equal(logits.argmax(-1), ref.logits.argmax(-1))


def _reference_drafter(d: Path, t: Path, family: str, block: torch.Tensor, taps: torch.Tensor):
    from dflash2_trt.reference.drafter import DFlash2Drafter

    tsd = load_file(str(t / "model.safetensors"))
    pre = "model.language_model." if family in ("qwen3_5", "muse_glimmer") else "model."
    emb, head = tsd[pre + "embed_tokens.weight"], tsd["lm_head.weight"]
    ref = DFlash2Drafter.from_pretrained(d, target_hidden_size=emb.shape[1])
    with torch.no_grad():
        hidden = ref(ref.embed_block(block, torch.nn.Embedding.from_pretrained(emb)), taps, taps.shape[1])
        unary = ref.unary_logits(hidden[:, 1:], lambda h: h @ head.T)
        proj = ref.candidate_selector.hidden_projection(hidden[:, 1:])
    return hidden, unary, proj


def _block_and_taps(n_taps: int, hidden: int, ctx: int = 21, block_size: int = 8):
    g = torch.Generator().manual_seed(3)
    taps = torch.randn(2, ctx, n_taps * hidden, generator=g)  # ctx 21 > sliding window 16: the window matters
    block = torch.full((2, block_size), 255)
    block[:, 0] = torch.tensor([5, 77])
    return block, taps


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
@pytest.mark.parametrize("family", ["qwen3", "qwen3_5", "muse_glimmer"])
def test_drafter_logits_match_reference(wide_pairs, family, tp, tmp_path):
    d, t = wide_pairs[family]
    convert_pair(d, t, tmp_path / "ckpt", tp_size=tp)
    ck = ConvertedCheckpoint(tmp_path / "ckpt")
    block, taps = _block_and_taps(3, 64, block_size=ck.config.dflash2["block_size"])
    h_ref, u_ref, p_ref = _reference_drafter(d, t, family, block, taps)
    with torch.no_grad():
        h, u, p = drafter_forward(ck, block, taps)
    torch.testing.assert_close(h, h_ref, **TOL[torch.float32])
    torch.testing.assert_close(u, u_ref, **TOL[torch.float32])
    torch.testing.assert_close(p, p_ref, **TOL[torch.float32])


@pytest.mark.parametrize("dtype,torch_dtype", [("bfloat16", torch.bfloat16), ("float16", torch.float16)])
def test_target_logits_after_dtype_cast(wide_pairs, dtype, torch_dtype, tmp_path):
    d, t = wide_pairs["qwen3_5"]
    convert_pair(d, t, tmp_path / "ckpt", tp_size=4, dtype=dtype)
    ck = ConvertedCheckpoint(tmp_path / "ckpt")
    with torch.no_grad():
        logits, _ = target_forward(ck, _ids(1))
        ref = _hf_model("qwen3_5", t, torch_dtype)(input_ids=_ids(1)).logits
    torch.testing.assert_close(logits, ref, **TOL[torch_dtype])


def test_standard_tiny_pairs(tiny, tmp_path):
    """The project's standard tiny pair too (tp 2), target and drafter."""
    convert_pair(tiny.drafter_dir, tiny.target_dir, tmp_path / "ckpt", tp_size=2)
    ck = ConvertedCheckpoint(tmp_path / "ckpt")
    with torch.no_grad():
        logits, _ = target_forward(ck, _ids(2))
        ref = _hf_model(tiny.family, tiny.target_dir)(input_ids=_ids(2)).logits
    torch.testing.assert_close(logits, ref, **TOL[torch.float32])
    block, taps = _block_and_taps(2, 64)
    _, u_ref, _ = _reference_drafter(tiny.drafter_dir, tiny.target_dir, tiny.family, block, taps)
    with torch.no_grad():
        _, u, _ = drafter_forward(ck, block, taps)
    torch.testing.assert_close(u, u_ref, **TOL[torch.float32])


# ---- negative controls: the comparison above does catch layout mistakes ----------------------

def _tamper(ckpt: Path, fn) -> None:
    tp = ConvertedCheckpoint(ckpt).tp
    for r in range(tp):
        path = ckpt / f"rank{r}.safetensors"
        sd = load_file(str(path))
        fn(sd)
        save_file(sd, str(path), metadata={"format": "pt"})


def _swap(a: str, b: str):
    def fn(sd):
        sd[a], sd[b] = sd[b].clone(), sd[a].clone()
    return fn


def _gate_query_swapped(name: str, d: int):
    def fn(sd):  # exchange query rows and gate rows: what a non-interleaved split of q_proj would do
        qkv, gate = sd[name + "qkv.weight"], sd[name + "output_gate.weight"]
        nq = gate.shape[0]
        q = qkv[:nq].clone()
        qkv[:nq] = gate
        sd[name + "output_gate.weight"] = q
    return fn


@pytest.mark.parametrize("mistake", ["fc_gate_swapped", "qk_norm_swapped", "query_gate_swapped"])
def test_layout_mistakes_are_caught(wide_pairs, hf_outputs, mistake, tmp_path):
    d, t = wide_pairs["qwen3_5"]
    out = tmp_path / "ckpt"
    convert_pair(d, t, out, tp_size=2)
    fn = {
        "fc_gate_swapped": _swap("transformer.layers.1.mlp.fc.weight", "transformer.layers.1.mlp.gate.weight"),
        "qk_norm_swapped": _swap("transformer.layers.1.attention.q_layernorm.weight",
                                 "transformer.layers.1.attention.k_layernorm.weight"),
        "query_gate_swapped": _gate_query_swapped("transformer.layers.3.attention.", 16),
    }[mistake]
    _tamper(out, fn)
    with torch.no_grad():
        logits, _ = target_forward(ConvertedCheckpoint(out), _ids())
    assert (logits - hf_outputs["qwen3_5"].logits).abs().max() > 100 * TOL[torch.float32]["atol"]


# ---- Muse Glimmer: the readings public engines disagree on, and the other silent mistakes ----

def _set_config(ckpt: Path, **fields) -> None:
    import json

    path = ckpt / "config.json"
    cfg = json.loads(path.read_text())
    for k, v in fields.items():
        cfg[k] = v(cfg) if callable(v) else v
    path.write_text(json.dumps(cfg))


# Each rewrites the converted config.json the way a converter (or a network reading it) that made
# that mistake would have; the forward must then miss transformers' logits by far more than the tolerance.
MUSE_MISTAKES = {
    # qk_scale_factor REPLACES 1/sqrt(head_dim) (softmax scale = qk_scale_factor), instead of multiplying it
    "qk_scale_replaces": dict(q_scaling=lambda c: 1 / (3.87 * c["head_size"] ** 0.5)),
    "qk_scale_ignored": dict(q_scaling=1.0),
    "nope_layers_rotated": dict(layer_rotary_base=lambda c: [c["rotary_base"]] * c["num_hidden_layers"]),
    "nope_follows_layer_kind": dict(layer_rotary_base=lambda c: [0.0 if k == "full_attention" else c["rotary_base"]
                                                                 for k in c["layer_types"]]),
    "ln_f_offset": dict(ln_f_weight_offset=1.0),
    "post_norm_eps_is_norm_eps": dict(post_norm_epsilon=lambda c: c["norm_epsilon"]),
    "no_embedding_norm": dict(embedding_norm=False),
    "qwen_norm_order": dict(inter_layernorms=False),
    "no_softcap": dict(final_logit_softcapping=None),
    "no_window": dict(sliding_window=10**6),
}


def test_muse_qk_scale_reading_is_transformers(wide_pairs, hf_outputs, tmp_path):
    """The converted q_scaling is 1/qk_scale_factor (the factor multiplies 1/sqrt(head_dim)) and that
    reproduces transformers; the other reading (the factor replaces 1/sqrt(head_dim)) is caught."""
    d, t = wide_pairs["muse_glimmer"]
    out = tmp_path / "ckpt"
    convert_pair(d, t, out, tp_size=2)
    ref = hf_outputs["muse_glimmer"].logits
    with torch.no_grad():
        good, _ = target_forward(ConvertedCheckpoint(out), _ids())
    torch.testing.assert_close(good, ref, **TOL[torch.float32])
    _set_config(out, **MUSE_MISTAKES["qk_scale_replaces"])
    with torch.no_grad():
        bad, _ = target_forward(ConvertedCheckpoint(out), _ids())
    assert (bad - ref).abs().max() > 100 * TOL[torch.float32]["atol"]


@pytest.mark.parametrize("mistake", sorted(set(MUSE_MISTAKES) - {"qk_scale_replaces"}))
def test_muse_layout_mistakes_are_caught(wide_pairs, hf_outputs, mistake, tmp_path):
    d, t = wide_pairs["muse_glimmer"]
    out = tmp_path / "ckpt"
    convert_pair(d, t, out, tp_size=2)
    _set_config(out, **MUSE_MISTAKES[mistake])
    with torch.no_grad():
        logits, _ = target_forward(ConvertedCheckpoint(out), _ids())
    assert (logits - hf_outputs["muse_glimmer"].logits).abs().max() > 100 * TOL[torch.float32]["atol"]


def test_tied_embeddings_logits(tied_pair, tmp_path):
    """Tied lm_head: the logits match transformers; for Muse Glimmer that means lm_head is the RAW
    embedding table (its embedding norm belongs to the lookup only)."""
    d, t = tied_pair
    family = "muse_glimmer" if "Muse" in (t / "config.json").read_text() else "qwen3"
    convert_pair(d, t, tmp_path / "ckpt", tp_size=2)
    with torch.no_grad():
        logits, _ = target_forward(ConvertedCheckpoint(tmp_path / "ckpt"), _ids(4))
        ref = _hf_model(family, t)(input_ids=_ids(4)).logits
    torch.testing.assert_close(logits, ref, **TOL[torch.float32])


def test_tiny_muse_logits_and_drafter(tmp_path):
    """The shipped trained tiny-muse pair (tp 4: KV heads duplicated): target logits against
    transformers on 40 random ids (past its window of 16), drafter logits against the reference."""
    from dflash2_trt.assets import trained_pair

    p = trained_pair("muse_glimmer")
    convert_pair(p.drafter_dir, p.target_dir, tmp_path / "ckpt", tp_size=4)
    ck = ConvertedCheckpoint(tmp_path / "ckpt")
    ids = _ids(5, t=40)                                   # 40 > sliding window 16
    with torch.no_grad():
        logits, _ = target_forward(ck, ids)
        ref = _hf_model("muse_glimmer", p.target_dir)(input_ids=ids).logits
    torch.testing.assert_close(logits, ref, **TOL[torch.float32])
    block, taps = _block_and_taps(2, 64, block_size=16)
    _, u_ref, _ = _reference_drafter(p.drafter_dir, p.target_dir, "muse_glimmer", block, taps)
    with torch.no_grad():
        _, u, _ = drafter_forward(ck, block, taps)
    torch.testing.assert_close(u, u_ref, **TOL[torch.float32])
