"""Helpers of the ONNX export tests (imported by conftest.py and the test modules): the PyTorch
reference harness, small single-plugin graphs, where TensorRT headers are.

The reference is the project's PyTorch drafter (``dflash2_trt.reference``) driven as the lossless
loop drives it (the target's embedding and LM head through transformers' own modules, the
selector's walk per row), never the exported graph or anything derived from it.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from dflash2_trt.reference.drafter import DFlash2Drafter, extract_taps

REPO = Path(__file__).resolve().parents[2]
Q_TOL = 1e-5      # fp32: |q_onnx - q_reference|
KV_TOL = 1e-5     # fp32: present K/V against the reference drafter's cache
SCHEDULE = (13, 5, 9, 1, 20)   # new context per block: 48 positions, past the drafter's sliding window (16)


def _muse_pair(root: Path) -> tuple[Path, Path]:
    """A tiny random Muse Glimmer target (as tests/reference/test_loop_muse_glimmer.py builds it) and a
    random drafter with output_multiplier + final_logit_softcapping, saved in the published formats."""
    from transformers.models.muse_glimmer import configuration_muse_glimmer as mg
    from transformers.models.muse_glimmer import modeling_muse_glimmer as mm
    from transformers.utils import logging

    from dflash2_trt.testing.tiny import build_tiny_drafter

    logging.set_verbosity_error()
    warnings.filterwarnings("ignore")
    text = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=8,
                max_position_embeddings=512, rope_parameters={"rope_theta": 10000.0, "rope_type": "default"},
                eos_token_id=2, pad_token_id=0, bos_token_id=1)
    vision = dict(patch_size=4, pos_emb_height=4, pos_emb_width=4, num_attention_heads=2,
                  num_hidden_layers=1, hidden_size=32, intermediate_size=64)
    torch.manual_seed(0)
    model = mm.MuseGlimmerForConditionalGeneration(
        mg.MuseGlimmerConfig(text_config=text, vision_config=vision, tie_word_embeddings=False))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "visual" not in n and "vision" not in n and p.dim() == 2:
                p.normal_(0.0, (1.0 if n.endswith(("embed_tokens.weight", "lm_head.weight")) else p.shape[1] ** -0.5))
    target = root / "target"
    model.save_pretrained(target)
    drafter = build_tiny_drafter("qwen3", root / "drafter", seed=5)
    cfg = json.loads((drafter / "config.json").read_text())
    cfg["dflash_config"].update(output_multiplier=0.2, final_logit_softcapping=20.0)
    (drafter / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return drafter, target


@dataclass
class Reference:
    target: torch.nn.Module
    drafter: DFlash2Drafter

    @property
    def cfg(self):
        return self.drafter.cfg


def reference_select(ref: Reference, hidden, unary, anchor, temps, uniforms, selector: str):
    """The reference selector per row: viterbi, or greedy at T <= 0 / sample at T > 0 (the published walk)."""
    ids, q, cand = [], [], []
    for b in range(hidden.shape[0]):
        mode = "viterbi" if selector == "viterbi" else ("greedy" if temps[b] <= 0 else "sample")
        s = ref.drafter.candidate_selector(hidden[b:b + 1], unary[b:b + 1], anchor[b:b + 1], mode,
                                           temperature=temps[b:b + 1] if mode == "sample" else None,
                                           uniforms=uniforms[b:b + 1] if mode == "sample" else None)
        ids.append(s.tokens)
        q.append(s.q)
        cand.append(s.cand_ids)
    return torch.cat(ids), torch.cat(q), torch.cat(cand)


def compare_blocks(sess, ref: Reference, *, batch: int, selector: str, temps, seed: int = 0,
                   schedule=SCHEDULE) -> list[dict]:
    """Run consecutive draft blocks through ``sess`` (present K/V fed back as past) and through the
    reference drafter (its own cache); return per-block differences (asserts nothing itself)."""
    cfg = ref.cfg
    T, L = cfg.block_size, cfg.block_size - 1
    g = torch.Generator().manual_seed(seed)
    n = sum(schedule) + 1
    prompt = torch.randint(0, cfg.vocab_size - 1, (batch, n), generator=g)
    with torch.no_grad():
        hs = ref.target(prompt, output_hidden_states=True).hidden_states
    taps = extract_taps(hs, cfg.target_layer_ids).float()
    temps = torch.as_tensor(temps, dtype=torch.float32)
    cache = ref.drafter.new_cache()
    past = {f"present_{k}_{i}": np.zeros((batch, cfg.num_key_value_heads, 0, cfg.head_dim), np.float32)
            for i in range(cfg.num_hidden_layers) for k in ("key", "value")}
    out, p = [], 0
    for c in schedule:
        start = p + c
        block = torch.full((batch, T), cfg.mask_token_id)
        block[:, 0] = prompt[:, start]
        u = torch.rand(batch, L, generator=g)
        with torch.no_grad():
            emb = ref.drafter.embed_block(block, ref.target.get_input_embeddings())
            hid = ref.drafter(emb, taps[:, p:start], start, cache)[:, 1:]
            unary = ref.drafter.unary_logits(hid, ref.target.get_output_embeddings())
            r_ids, r_q, r_cand = reference_select(ref, hid, unary, block[:, 0], temps, u, selector)
        feeds = {"block_ids": block.to(torch.int32).numpy(), "context_taps": taps[:, p:start].numpy(),
                 "temperature": temps.numpy(), "uniforms": u.numpy()}
        for i in range(cfg.num_hidden_layers):
            for k in ("key", "value"):
                feeds[f"past_{k}_{i}"] = past[f"present_{k}_{i}"]
        res = sess.run_dict(feeds)
        kv = max(float(np.abs(res[f"present_{k}_{i}"] - getattr(cache, k[0])[i].numpy()).max())
                 for i in range(cfg.num_hidden_layers) for k in ("key", "value"))
        out.append({"past": p, "context": c, "ids_equal": np.array_equal(res["draft_ids"], r_ids.numpy()),
                    "cand_equal": np.array_equal(res["cand_ids"], r_cand.numpy()),
                    "dtypes": (res["draft_ids"].dtype, res["q"].dtype),
                    "q_diff": float(np.abs(res["q"] - r_q.numpy()).max()), "kv_diff": kv,
                    "present_len": res["present_key_0"].shape[2], "start": start,
                    "sampled_rows_nonone_hot": int(((res["q"] > 0).sum(-1) > 1).any(-1).sum())})
        past, p = res, start
    return out


# ------------------------------------------------------------------ the plugin library (glue)
def trt_include() -> Path | None:
    d = os.environ.get("DFLASH2_TRT_INCLUDE")
    return Path(d) if d and (Path(d) / "NvInferRuntime.h").is_file() else None




# ------------------------------------------------------------------ single-plugin graphs
def conv_graph(path, tokens, block, *, plugins=True):
    """One DFlash2DynamicConv (x [tokens, 64], delta [tokens, 2, 4], K=2, G=16, block ``block``)."""
    import onnx

    from dflash2_trt.onnx.graph import GraphBuilder
    from dflash2_trt.onnx.ops import dynamic_conv

    g = GraphBuilder(18)
    x = g.input("x", "float32", [tokens, 64])
    d = g.input("delta", "float32", [tokens, 2, 4])
    y = dynamic_conv(g, x, d, g.weight("base", torch.ones(2, 64)), hidden=64, block_size=block, kernel_size=2,
                     group_size=16, dtype="float32", use_plugins=plugins)
    g.op("Identity", y, outputs=["y"])
    g.output("y", "float32", [tokens, 64])
    onnx.save(g.model("conv"), str(path))
    return path


def scan_graph(path, k, *, plugins=True, mode="sample", batch: int | str = 2, length=7, rank=16, vocab=64, seed=1):
    """One DFlash2PairwiseScan over K=``k`` candidates (random codebooks)."""
    import onnx

    from dflash2_trt.onnx.graph import GraphBuilder
    from dflash2_trt.onnx.ops import pairwise_scan

    g = GraphBuilder(18)
    b = batch
    ins = [g.input("unary", "float32", [b, length, k]), g.input("cand", "int32", [b, length, k]),
           g.input("proj", "float32", [b, length, rank]), g.input("anchor", "int32", [b])]
    gen = torch.Generator().manual_seed(seed)
    pa = g.weight("pred", torch.randn(vocab, rank, generator=gen))
    sc = g.weight("succ", torch.randn(vocab, rank, generator=gen))
    t, u = g.input("temperature", "float32", [b]), g.input("uniforms", "float32", [b, length])
    pairwise_scan(g, *ins, pa, sc, t, u, mode=mode, length=length, top_k=k, dtype="float32", use_plugins=plugins,
                  outputs=("ids", "q"))
    g.output("ids", "int32", [b, length])
    g.output("q", "float32", [b, length, k])
    onnx.save(g.model("scan"), str(path))
    return path
