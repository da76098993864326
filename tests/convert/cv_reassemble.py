"""Rebuild the HF tensors from a converted checkpoint — written independently of the converter.

This knows the TensorRT-LLM conventions (fused qkv per rank = [q heads; kv heads; kv heads],
KV / key heads duplicated on consecutive ranks when fewer than tp, row-parallel = dim 1,
column-parallel (and the vocab-parallel embedding) = dim 0, Qwen3.5's q_proj = per head [query; gate],
Muse Glimmer's separate gate_proj = output_gate with the query heads, its weight-less q/k norm and its
sandwich norms under TensorRT-LLM's Gemma-2 names) and inverts them with plain torch.cat, asserting
that duplicated copies are identical. It does not import dflash2_trt.convert
beyond reading config.json.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file


def _dedup(parts: list[torch.Tensor], n_groups: int, tp: int) -> list[torch.Tensor]:
    """Per-rank group slices -> one slice per distinct group (checking duplicates are identical)."""
    if n_groups >= tp:
        return parts
    per = tp // n_groups
    out = []
    for g in range(n_groups):
        copies = parts[g * per:(g + 1) * per]
        for c in copies[1:]:
            assert torch.equal(c, copies[0]), "duplicated head group differs between ranks"
        out.append(copies[0])
    return out


def reassemble(directory: str | Path) -> dict[str, torch.Tensor]:
    directory = Path(directory)
    cfg = json.loads((directory / "config.json").read_text())
    tp = cfg["mapping"]["tp_size"]
    ranks = [load_file(str(directory / f"rank{r}.safetensors")) for r in range(tp)]
    names = set(ranks[0])
    for r in ranks[1:]:
        assert set(r) == names, "ranks hold different tensor names"
    used: set[str] = set()

    def get(name):
        used.add(name)
        return [r[name] for r in ranks]

    def same(name):
        parts = get(name)
        for p in parts[1:]:
            assert torch.equal(p, parts[0]), f"replicated tensor {name} differs between ranks"
        return parts[0]

    def cat0(name):
        return torch.cat(get(name), 0)

    def cat1(name):
        return torch.cat(get(name), 1)

    def attention(pre_out, pre_in, heads, kv_heads, d, gated, muse=False):
        nq, nkv = heads // tp, (kv_heads // tp if kv_heads >= tp else 1)
        qs, ks, vs = [], [], []
        for w in get(pre_out + "qkv.weight"):
            q, k, v = w.split([nq * d, nkv * d, nkv * d], 0)
            qs.append(q), ks.append(k), vs.append(v)
        q = torch.cat(qs, 0)
        res = {
            pre_in + "k_proj.weight": torch.cat(_dedup(ks, kv_heads, tp), 0),
            pre_in + "v_proj.weight": torch.cat(_dedup(vs, kv_heads, tp), 0),
            pre_in + "o_proj.weight": cat1(pre_out + "dense.weight"),
        }
        if muse:  # no q/k norm weights; the gate is its own matrix, rows per query head
            res[pre_in + "gate_proj.weight"] = cat0(pre_out + "output_gate.weight")
            res[pre_in + "q_proj.weight"] = q
            return res
        res[pre_in + "q_norm.weight"] = same(pre_out + "q_layernorm.weight")
        res[pre_in + "k_norm.weight"] = same(pre_out + "k_layernorm.weight")
        if gated:
            gate = cat0(pre_out + "output_gate.weight")
            h = q.shape[1]
            q = torch.stack([q.view(heads, d, h), gate.view(heads, d, h)], 1).reshape(heads * 2 * d, h)
        res[pre_in + "q_proj.weight"] = q
        return res

    def mlp(pre_out, pre_in):
        return {pre_in + "gate_proj.weight": cat0(pre_out + "fc.weight"),
                pre_in + "up_proj.weight": cat0(pre_out + "gate.weight"),
                pre_in + "down_proj.weight": cat1(pre_out + "proj.weight")}

    out: dict[str, torch.Tensor] = {}
    wrapper = cfg["hf_architecture"].endswith("ForConditionalGeneration")
    p = "model.language_model." if wrapper else "model."
    out[p + "embed_tokens.weight"] = cat0("transformer.vocab_embedding.weight")
    out[p + "norm.weight"] = same("transformer.ln_f.weight")
    lm_head = cat0("lm_head.weight")
    if cfg["tie_word_embeddings"]:
        assert torch.equal(lm_head, out[p + "embed_tokens.weight"]), "tied lm_head differs from the embedding"
    else:
        out["lm_head.weight"] = lm_head
    muse = cfg["qwen_type"] == "muse_glimmer"
    for i, kind in enumerate(cfg["layer_types"]):
        o, s = f"transformer.layers.{i}.", f"{p}layers.{i}."
        out[s + "input_layernorm.weight"] = same(o + "input_layernorm.weight")
        out[s + "post_attention_layernorm.weight"] = same(o + "post_layernorm.weight")
        out.update(mlp(o + "mlp.", s + "mlp."))
        if muse:
            out[s + "pre_feedforward_layernorm.weight"] = same(o + "pre_feedforward_layernorm.weight")
            out[s + "post_feedforward_layernorm.weight"] = same(o + "post_feedforward_layernorm.weight")
        if kind in ("full_attention", "sliding_attention"):
            out.update(attention(o + "attention.", s + "self_attn.", cfg["num_attention_heads"],
                                 cfg["num_key_value_heads"], cfg["head_size"], cfg["attn_output_gate"], muse))
            continue
        la = cfg["linear_attention"]
        nk, nv, dk, dv = la["num_key_heads"], la["num_value_heads"], la["key_head_dim"], la["value_head_dim"]
        nk_r, nv_r = (nk // tp if nk >= tp else 1), nv // tp
        lo, ls = o + "linear_attention.", s + "linear_attn."
        for src_name, dst_name in (("qkv.weight", "in_proj_qkv.weight"), ("conv1d.weight", "conv1d.weight")):
            qs, ks, vs = [], [], []
            for w in get(lo + src_name):
                q, k, v = w.split([nk_r * dk, nk_r * dk, nv_r * dv], 0)
                qs.append(q), ks.append(k), vs.append(v)
            out[ls + dst_name] = torch.cat(_dedup(qs, nk, tp) + _dedup(ks, nk, tp) + vs, 0)
        out[ls + "in_proj_z.weight"] = cat0(lo + "z.weight")
        out[ls + "in_proj_b.weight"] = cat0(lo + "b.weight")
        out[ls + "in_proj_a.weight"] = cat0(lo + "a.weight")
        out[ls + "dt_bias"] = cat0(lo + "dt_bias")
        out[ls + "A_log"] = cat0(lo + "A_log")
        out[ls + "norm.weight"] = same(lo + "norm.weight")
        out[ls + "out_proj.weight"] = cat1(lo + "dense.weight")

    dc = cfg["dflash2"]
    dp = dc["tensor_prefix"]
    out["drafter/fc.weight"] = cat0(dp + "fc.weight")
    for name in ("hidden_norm.weight", "norm.weight"):
        out["drafter/" + name] = same(dp + name)
    for name in ("predecessor_codebook", "successor_codebook", "hidden_projection.weight"):
        out["drafter/candidate_selector." + name] = same(dp + "selector." + name)
    for i in range(dc["num_hidden_layers"]):
        o, s = f"{dp}layers.{i}.", f"drafter/layers.{i}."
        out[s + "input_layernorm.weight"] = same(o + "input_layernorm.weight")
        out[s + "post_attention_layernorm.weight"] = same(o + "post_layernorm.weight")
        out.update(attention(o + "attention.", s + "self_attn.", dc["num_attention_heads"],
                             dc["num_key_value_heads"], dc["head_dim"], False))
        out.update(mlp(o + "mlp.", s + "mlp."))
        for conv in ("attention_conv", "mlp_conv"):
            out[f"{s}{conv}.base_kernel"] = same(f"{o}{conv}.base_kernel")
            out[f"{s}{conv}.kernel_projection.weight"] = same(f"{o}{conv}.kernel_projection.weight")
    left = names - used
    assert not left, f"rank files hold tensors the reassembly does not know: {sorted(left)[:5]}"
    return out
