"""``dflash2-trt export-onnx``: the drafter's draft pass as one ONNX graph.

Graph I/O (``T`` = block size, ``L = T - 1`` draft positions, ``K`` = selector top-k, ``dt`` = the
export dtype; ``batch``, ``context_length`` and ``past_length`` are dynamic)::

    inputs   block_ids        int32 [batch, T]          [anchor, MASK, ..., MASK] (the anchor = last
                                                        verified token; ids index the TARGET embedding)
             context_taps     dt    [batch, context_length, n_taps * H_target]
                                                        tapped target hidden states (HF hidden_states[id + 1],
                                                        concatenated in target_layer_ids order) of the
                                                        committed positions not yet in the drafter's cache
             past_key_{i}     dt    [batch, kv_heads, past_length, head_dim]   per drafter layer: the cached
             past_value_{i}                                                    context K (post k_norm, post RoPE) / V
             temperature      fp32  [batch]             <= 0: greedy walk (one-hot q); > 0: sampling walk
             uniforms         fp32  [batch, L]          u in [0, 1) per draft position (read when T > 0)
    outputs  draft_ids        int32 [batch, L]          the selected path's tokens
             q                fp32  [batch, L, K]       the proposal over the candidates (rejection sampling)
             cand_ids         int32 [batch, L, K]       the candidates (top-K of the unary logits, descending,
                                                        ties to the lower id)
             present_key_{i}  dt    [batch, kv_heads, past_length + context_length, head_dim]
             present_value_{i}                          past + the new context's K/V: the next call's past

Positions come from the shapes, exactly as in the reference (``reference/drafter.py``): context
position ``past_length + c``, anchor at ``start = past_length + context_length``, block position
``start + j``; every row of a batch shares the lengths. The math is the reference drafter's: embed
(the target's table) -> layers (DFlash2DynamicConv around attention and MLP, the post conv fused
with the residual add in fp32 as the engine network does) -> norm -> the target's LM head on
positions 1..L -> output transform -> TopK -> DFlash2PairwiseScan. The selector ``greedy`` is the
scan's ``sample`` mode (greedy where T <= 0, sampling where T > 0: the published behaviour, as in
``trtllm/network/selector.py``), ``viterbi`` its ``viterbi`` mode.

Output directory (written atomically: complete with its manifest, or absent)::

    OUT/drafter.onnx        the graph (weights referenced, not inline)
    OUT/drafter.onnx.data   every weight, 64-byte aligned (ONNX external data)
    OUT/manifest.json       format, sources, dtype, opset, plugins and their attributes, I/O with
                            shapes, the optimization profile, the trtexec shapes, sizes and sha256

Refused (one-line errors, nothing written): a target of another family (the config loader refuses
its architecture), ``--tp-size`` > 1 (an ONNX graph is one device's), a drafter the
plugins cannot take (K > 16, L > 15, R not a multiple of 8 in [8, 512], H % 8 != 0) unless
``--no-plugins``, an opset outside 17..23, ``--max-batch-size`` outside 1..512 (as ``build``), ``--max-seq-len``
outside [block size + 1, the target's max_position_embeddings].
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .. import __version__
from ..config.build import MAX_EAGLE_BATCH
from ..errors import ConfigError, DFlash2Error
from ..overlap import refuse_overlap
from .graph import ONNX_DTYPES

__all__ = ["FORMAT", "SCHEMA_VERSION", "GRAPH_FILE", "DATA_FILE", "SELECTORS", "SUPPORTED_FAMILIES", "DTYPES",
           "DEFAULT_OPSET", "ExportResult", "export_onnx", "trtexec_command", "profile_shapes"]

FORMAT = "dflash2-trt onnx drafter"
SCHEMA_VERSION = 1
GRAPH_FILE = "drafter.onnx"
DATA_FILE = "drafter.onnx.data"
DEFAULT_OPSET = 18
DTYPES = ("float32", "float16", "bfloat16")
SELECTORS = {"greedy": "sample", "viterbi": "viterbi"}
"""Export selector -> DFlash2PairwiseScan mode (the same mapping as ``trtllm/network/selector.py``'s
SELECTOR_PLUGIN_MODE; tests/onnx checks that they agree)."""
SUPPORTED_FAMILIES = ("qwen3", "qwen3_5", "muse_glimmer")
"""Target families whose embedding table and LM head the export reads (tests/onnx checks each
against the reference). The drafter reads the RAW embedding table (Muse Glimmer's ``embed_norm``
is bypassed, as in ``reference/drafter.py``); the target's own output transform is not applied,
the drafter's ``output_multiplier`` / ``final_logit_softcapping`` are."""

_TORCH = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass
class ExportResult:
    output: Path
    manifest: dict
    seconds: float


# ------------------------------------------------------------------------------------ checks
def _check_plugin_limits(cfg, source) -> None:
    """What the plugins' validation would refuse at build time, refused before writing anything."""
    L, K, R, H = cfg.block_size - 1, cfg.selector_top_k, cfg.selector_rank, cfg.hidden_size
    where = "dflash_config."
    problems = []
    if not 1 <= K <= 16:
        problems.append((where + "selector_top_k", f"K={K} outside [1, 16], DFlash2PairwiseScan's limit"))
    if not 1 <= L <= 15:
        problems.append((where + "block_size", f"block_size={cfg.block_size} gives L={L} draft positions, "
                                               f"outside DFlash2PairwiseScan's [1, 15]"))
    if not (8 <= R <= 512 and R % 8 == 0):
        problems.append((where + "selector_rank", f"R={R}: DFlash2PairwiseScan needs 8 <= R <= 512, R % 8 == 0"))
    if H % 8:
        problems.append(("hidden_size", f"H={H}: DFlash2DynamicConv needs H % 8 == 0"))
    if problems:
        field, msg = problems[0]
        raise ConfigError(f"{msg}; export with --no-plugins for a plugin-free graph", source=source, field=field)


def _profile(max_batch_size: int, T: int, past_max: int) -> dict[str, list[int]]:
    """[min, opt, max] of each dynamic dimension; min <= opt <= max in every one (TensorRT refuses a profile
    otherwise). ``context_length`` is optimised for one accepted block (T new context positions), or for all
    the positions there are when the profile has fewer (``--max-seq-len`` below 2 x block size)."""
    return {"batch": [1, max(1, max_batch_size // 2), max_batch_size],
            "past_length": [0, past_max // 2, past_max],
            "context_length": [1, min(T, past_max), past_max]}


def profile_shapes(manifest: dict) -> dict[str, tuple[list[int], list[int], list[int]]]:
    """(min, opt, max) shape of every input, from the manifest's symbolic shapes and profile."""
    prof = manifest["profile"]
    out = {}
    for inp in manifest["inputs"]:
        dims = [[d] * 3 if isinstance(d, int) else prof[d] for d in inp["shape"]]
        out[inp["name"]] = tuple([dd[k] for dd in dims] for k in range(3))
    return out


def _trtexec_shapes(manifest: dict) -> dict[str, str]:
    shapes = profile_shapes(manifest)
    return {kind: ",".join(f"{n}:{'x'.join(map(str, s[k]))}" for n, s in shapes.items())
            for k, kind in enumerate(("min", "opt", "max"))}


def trtexec_command(manifest: dict, *, onnx_path: str | None = None, plugin_library: str | None = None,
                    engine: str = "drafter.plan") -> str:
    """The trtexec line that builds this export with TensorRT 10.13 (``--stronglyTyped``: the graph's
    dtypes are the engine's). Plugin graphs load ``libdflash2_plugins_dynamic.so`` with
    ``--dynamicPlugins`` and embed it in the plan."""
    sh = manifest["trtexec"]
    parts = ["trtexec", f"--onnx={onnx_path or manifest['graph']}", "--stronglyTyped",
             f"--minShapes={sh['min']}", f"--optShapes={sh['opt']}", f"--maxShapes={sh['max']}",
             f"--saveEngine={engine}"]
    if manifest["plugins"]:
        lib = plugin_library or "plugins/build/libdflash2_plugins_dynamic.so"
        parts[2:2] = [f"--dynamicPlugins={lib}", f"--setPluginsToSerialize={lib}"]
    return " ".join(parts)


# ------------------------------------------------------------------------------------ the graph
class _Drafter:
    """Emits the drafter's draft pass into a GraphBuilder (names: the published tensor names)."""

    def __init__(self, g, cfg, target_hidden: int, weight, embed, lm_head, *, dtype: str, use_plugins: bool,
                 scan_mode: str):
        self.g, self.cfg, self.dt = g, cfg, dtype
        self.weight_src, self.embed_src, self.head_src = weight, embed, lm_head
        self.target_hidden = target_hidden
        self.use_plugins, self.scan_mode = use_plugins, scan_mode
        self.tdt = _TORCH[dtype]
        self._weights: dict[str, str] = {}
        self._base: dict[str, str] = {}

    # -- weights
    def w(self, name: str, transpose: bool = False) -> str:
        """The initializer of checkpoint tensor ``name`` (``.T``: transposed for MatMul), added once."""
        key = name + (".T" if transpose else "")
        if key not in self._weights:
            t = self.weight_src(name).to(self.tdt)
            self._weights[key] = self.g.weight(key, t.t().contiguous() if transpose else t)
        return self._weights[key]

    def linear(self, x: str, name: str) -> str:
        return self.g.op("MatMul", x, self.w(name + ".weight", transpose=True))

    def rms(self, x: str, name: str) -> str:
        """Qwen3 RMSNorm: normalise in fp32, cast back, then scale by the weight."""
        g = self.g
        xf = g.cast(x, "float32", self.dt)
        ms = g.reduce("ReduceMean", g.op("Mul", xf, xf), [-1])
        r = g.op("Reciprocal", g.op("Sqrt", g.op("Add", ms, g.const(np.float32(self.cfg.rms_norm_eps), name="eps"))))
        return g.op("Mul", self.w(name + ".weight"), g.cast(g.op("Mul", xf, r), self.dt, "float32"))

    # -- RoPE
    def rope_tables(self, pos: str) -> tuple[str, str]:
        g, d = self.g, self.cfg.head_dim
        inv = 1.0 / (self.cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))  # as the reference
        freqs = g.op("Mul", g.unsqueeze(g.cast(pos, "float32"), [1]), g.const(inv.numpy(), name="inv_freq"))
        emb = g.op("Concat", freqs, freqs, axis=1)
        return g.cast(g.op("Cos", emb), self.dt, "float32"), g.cast(g.op("Sin", emb), self.dt, "float32")

    def rope(self, x: str, cos: str, sin: str) -> str:
        g, h = self.g, self.cfg.head_dim // 2
        rot = g.op("Concat", g.op("Neg", g.slice(x, [h], [2 * h], [3])), g.slice(x, [0], [h], [3]), axis=3)
        return g.op("Add", g.op("Mul", x, cos), g.op("Mul", rot, sin))

    # -- conv
    def conv_prepare(self, prefix: str, normed: str) -> tuple[str, str]:
        g, c = self.g, self.cfg
        k, hg, h = c.conv_kernel_size, c.conv_num_groups, c.hidden_size
        kp = g.reshape(self.linear(normed, prefix + ".kernel_projection"), [-1, 2, k, hg])   # [side, tap, group]
        pre, post = g.gather(kp, 0, 1), g.gather(kp, 1, 1)
        base = self.weight_src(prefix + ".base_kernel").to(self.tdt)
        self._base[prefix] = g.weight(prefix + ".base_kernel.1", base[1].contiguous())
        y = self._conv(g.reshape(normed, [-1, h]), pre, g.weight(prefix + ".base_kernel.0", base[0].contiguous()),
                       prefix + ".prepare")
        return g.reshape(y, g.op("Shape", normed)), post

    def conv_finish(self, prefix: str, sub_out: str, post: str, residual: str) -> str:
        g, h = self.g, self.cfg.hidden_size
        res = g.cast(g.reshape(residual, [-1, h]), "float32", self.dt)
        y = self._conv(g.reshape(sub_out, [-1, h]), post, self._base[prefix], prefix + ".finish", residual=res)
        return g.reshape(g.cast(y, self.dt, "float32"), g.op("Shape", residual))

    def _conv(self, x, delta, base, name, residual=None):
        from .ops import dynamic_conv

        c = self.cfg
        return dynamic_conv(self.g, x, delta, base, hidden=c.hidden_size, block_size=c.block_size,
                            kernel_size=c.conv_kernel_size, group_size=c.conv_group_size, dtype=self.dt,
                            residual=residual, use_plugins=self.use_plugins, name=name)

    # -- attention
    def heads(self, x: str, name: str, n: int, norm: str | None) -> str:
        g = self.g
        y = g.reshape(self.linear(x, name), [0, 0, n, self.cfg.head_dim])
        if norm is not None:
            y = self.rms(y, norm)
        return g.op("Transpose", y, perm=[0, 2, 1, 3])

    def attention(self, i: int, h: str, ctx: str, past_k: str, past_v: str, tables, mask) -> str:
        g, c = self.g, self.cfg
        p = f"layers.{i}.self_attn"
        nh, nkv, d, T = c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.block_size
        (cos_q, sin_q), (cos_c, sin_c) = tables
        q = self.rope(self.heads(h, p + ".q_proj", nh, p + ".q_norm"), cos_q, sin_q)
        kb = self.rope(self.heads(h, p + ".k_proj", nkv, p + ".k_norm"), cos_q, sin_q)
        vb = self.heads(h, p + ".v_proj", nkv, None)
        kc = self.rope(self.heads(ctx, p + ".k_proj", nkv, p + ".k_norm"), cos_c, sin_c)
        vc = self.heads(ctx, p + ".v_proj", nkv, None)
        pk = g.op("Concat", past_k, kc, axis=2, outputs=[f"present_key_{i}"])
        pv = g.op("Concat", past_v, vc, axis=2, outputs=[f"present_value_{i}"])
        k_all = g.op("Concat", pk, kb, axis=2)
        v_all = g.op("Concat", pv, vb, axis=2)
        q5 = g.reshape(q, [0, nkv, nh // nkv, T, d])                    # head h reads kv head h // rep
        k5 = g.op("Transpose", g.unsqueeze(k_all, [2]), perm=[0, 1, 2, 4, 3])
        scores = g.op("Mul", g.cast(g.op("MatMul", q5, k5), "float32", self.dt),
                      g.const(np.float32(d ** -0.5), name="scale"))
        if mask is not None:
            scores = g.op("Where", mask, scores, g.const(np.float32(-np.inf), name="minus_inf"))
        probs = g.cast(g.op("Softmax", scores, axis=-1), self.dt, "float32")
        out = g.op("MatMul", probs, g.unsqueeze(v_all, [2]))            # [B, nkv, rep, T, d]
        out = g.op("Transpose", g.reshape(out, [0, nh, T, d]), perm=[0, 2, 1, 3])
        return self.linear(g.reshape(out, [0, T, nh * d]), p + ".o_proj")

    def mlp(self, i: int, x: str) -> str:
        g, p = self.g, f"layers.{i}.mlp"
        gate = self.linear(x, p + ".gate_proj")
        return self.linear(g.op("Mul", g.op("Mul", gate, g.op("Sigmoid", gate)), self.linear(x, p + ".up_proj")),
                           p + ".down_proj")

    def masks(self, q_pos: str, k_pos: str) -> dict:
        """Per distinct layer window: bool [T, S] of allowed (query, key) pairs, or None (all allowed)."""
        g, c = self.g, self.cfg
        diff = g.op("Sub", g.unsqueeze(q_pos, [1]), g.unsqueeze(k_pos, [0]))
        out = {}
        for i in range(c.num_hidden_layers):
            w = c.layer_window(i)
            if w in out:
                continue
            m = None
            if w is not None:
                m = g.op("Less", diff, g.const(np.int64(w), name="window"))
            if c.is_causal:
                causal = g.op("Not", g.op("Less", diff, g.const(np.int64(0), name="zero_i")))
                m = causal if m is None else g.op("And", m, causal)
            out[w] = m
        return out

    def build(self) -> None:
        g, c, dt = self.g, self.cfg, self.dt
        T, L, K = c.block_size, c.block_size - 1, c.selector_top_k
        nkv, d = c.num_key_value_heads, c.head_dim
        ids = g.input("block_ids", "int32", ["batch", T])
        taps = g.input("context_taps", dt, ["batch", "context_length", c.num_taps * self.target_hidden])
        past = [(g.input(f"past_key_{i}", dt, ["batch", nkv, "past_length", d]),
                 g.input(f"past_value_{i}", dt, ["batch", nkv, "past_length", d])) for i in range(c.num_hidden_layers)]
        temperature = g.input("temperature", "float32", ["batch"])
        uniforms = g.input("uniforms", "float32", ["batch", L])

        # positions: context past_length + c, anchor at start = past_length + context_length, block start + j
        p_len = g.squeeze(g.dim(past[0][0], 2), [0])
        start = g.op("Add", p_len, g.squeeze(g.dim(taps, 1), [0]))
        one = g.const(np.int64(1), name="one_i")
        q_pos = g.op("Add", g.const(np.arange(T, dtype=np.int64), name="arange_t"), start)
        c_pos = g.op("Range", p_len, start, one)
        k_pos = g.op("Range", g.const(np.int64(0), name="zero_i"), g.op("Add", start, g.const(np.int64(T), name="t_i")),
                     one)
        tables = (self.rope_tables(q_pos), self.rope_tables(c_pos))
        masks = self.masks(q_pos, k_pos)

        ctx = self.rms(self.linear(taps, "fc"), "hidden_norm")
        x = g.op("Gather", g.weight("embed_tokens.weight", self.embed_src().to(self.tdt)), ids, axis=0)
        if c.input_embedding_scale is not None:
            x = g.op("Mul", x, g.weight("input_embedding_scale", torch.tensor(c.input_embedding_scale, dtype=self.tdt)))
        for i in range(c.num_hidden_layers):
            p = f"layers.{i}"
            r = x
            h, post = self.conv_prepare(p + ".attention_conv", self.rms(x, p + ".input_layernorm"))
            h = self.attention(i, h, ctx, past[i][0], past[i][1], tables, masks[c.layer_window(i)])
            x = self.conv_finish(p + ".attention_conv", h, post, r)
            r = x
            h, post = self.conv_prepare(p + ".mlp_conv", self.rms(x, p + ".post_attention_layernorm"))
            x = self.conv_finish(p + ".mlp_conv", self.mlp(i, h), post, r)
        hidden = g.slice(self.rms(x, "norm"), [1], [T], [1])                                   # [B, L, H]
        logits = g.op("MatMul", hidden, g.weight("lm_head.weight.T", self.head_src().to(self.tdt).t().contiguous()))
        unary = g.cast(logits, "float32", dt)
        if c.output_multiplier is not None:
            unary = g.op("Mul", unary, g.const(np.float32(c.output_multiplier), name="output_multiplier"))
        if c.final_logit_softcapping is not None:
            cap = g.const(np.float32(c.final_logit_softcapping), name="softcap")
            unary = g.op("Mul", g.op("Tanh", g.op("Div", unary, cap)), cap)
        scores, idx = g.op("TopK", unary, g.const([K], "int64", "k"), axis=-1, largest=1, sorted=1, outputs=2)
        cand = g.op("Cast", idx, to=ONNX_DTYPES["int32"], outputs=["cand_ids"])
        proj = self.linear(hidden, "candidate_selector.hidden_projection")
        anchor = g.gather(ids, 0, 1)
        from .ops import pairwise_scan

        pairwise_scan(g, scores, cand, proj, anchor, self.w("candidate_selector.predecessor_codebook"),
                      self.w("candidate_selector.successor_codebook"), temperature, uniforms, mode=self.scan_mode,
                      length=L, top_k=K, dtype=dt, use_plugins=self.use_plugins, outputs=("draft_ids", "q"))
        g.output("draft_ids", "int32", ["batch", L])
        g.output("q", "float32", ["batch", L, K])
        g.output("cand_ids", "int32", ["batch", L, K])
        for i in range(c.num_hidden_layers):
            for kind in ("key", "value"):
                g.output(f"present_{kind}_{i}", dt, ["batch", nkv, "present_length", d])


# ------------------------------------------------------------------------------------ entry point
def export_onnx(drafter_dir, target_dir, output, *, dtype: str | None = None, opset: int = DEFAULT_OPSET,
                use_plugins: bool = True, selector: str = "greedy", tp_size: int = 1, max_batch_size: int = 8,
                max_seq_len: int | None = None, force: bool = False, target_key: str | None = None,
                command: list[str] | None = None) -> ExportResult:
    """Export the drafter of a pair as ONNX into ``output`` (see the module docstring)."""
    t0 = time.perf_counter()
    import onnx

    from ..checkpoint.writer import AtomicOutputDir, check_output_dir, sha256_file, write_small_file
    from ..convert.driver import source_identity
    from ..loading import validate_pair
    from .graph import OPSETS, GraphBuilder

    if tp_size != 1:
        raise ConfigError(f"{tp_size}: an ONNX graph is one device's; tensor parallelism is TensorRT-LLM's "
                          f"(dflash2-trt build --tp-size)", field="--tp-size")
    if not isinstance(opset, int) or isinstance(opset, bool) or opset not in OPSETS:
        raise ConfigError(f"{opset!r} not in {OPSETS.start}..{OPSETS.stop - 1}", field="--opset")
    if dtype is not None and dtype not in DTYPES:
        raise ConfigError(f"must be one of {', '.join(DTYPES)}, got {dtype!r}", field="--dtype")
    if selector not in SELECTORS:
        raise ConfigError(f"must be one of {', '.join(SELECTORS)}, got {selector!r}", field="--selector")
    if not isinstance(max_batch_size, int) or isinstance(max_batch_size, bool) \
            or not 1 <= max_batch_size <= MAX_EAGLE_BATCH:
        raise ConfigError(f"must be an integer in [1, {MAX_EAGLE_BATCH}] ({MAX_EAGLE_BATCH}: the largest "
                          f"max_batch_size dflash2-trt build accepts, trtllm-build's EAGLE limit), "
                          f"got {max_batch_size!r}", field="--max-batch-size")
    drafter_dir, target_dir = Path(drafter_dir), Path(target_dir)
    pair = validate_pair(drafter_dir, target_dir, cast_dtype=dtype)
    cfg, tcfg = pair.drafter, pair.target
    if tcfg.family not in SUPPORTED_FAMILIES:   # TargetConfig refuses other architectures already
        raise ConfigError(f"target family {tcfg.family!r}: export-onnx supports {', '.join(SUPPORTED_FAMILIES)}",
                          source=tcfg.source, field="architectures")
    if use_plugins:
        _check_plugin_limits(cfg, cfg.source)
    T = cfg.block_size
    max_seq = tcfg.max_position_embeddings if max_seq_len is None else max_seq_len
    mpe = tcfg.max_position_embeddings
    if not isinstance(max_seq, int) or isinstance(max_seq, bool) or not T + 1 <= max_seq <= mpe:
        raise ConfigError(f"must be an integer in [{T + 1}, {mpe}] (block size {T} + at least one context position "
                          f".. the target's max_position_embeddings), got {max_seq!r}", field="--max-seq-len")
    dt = dtype or cfg.dtype
    refuse_overlap(output, "--output", [("target directory", target_dir), ("drafter directory", drafter_dir)])
    check_output_dir(output, force)

    dck, tck = pair.drafter_ckpt, pair.target_ckpt
    embed_name = tcfg.weight_prefix + "embed_tokens.weight"
    head_name = embed_name if tcfg.tie_word_embeddings else "lm_head.weight"
    for n in (embed_name, head_name):
        if n not in tck:
            raise DFlash2Error(f"{target_dir}: tensor '{n}' not found (needed for the drafter's embedding / LM head)")
    scan_mode = SELECTORS[selector]
    atomic = AtomicOutputDir(output, force=force)
    with atomic as tmp:
        g = GraphBuilder(opset, tmp / DATA_FILE)
        try:
            _Drafter(g, cfg, tcfg.hidden_size, dck.get, lambda: tck.get(embed_name), lambda: tck.get(head_name),
                     dtype=dt, use_plugins=use_plugins, scan_mode=scan_mode).build()
        finally:
            g.close_data()
        kind = "plugins" if use_plugins else "no plugins"
        model = g.model("dflash2_drafter", doc=f"DFlash2 drafter draft pass ({kind})")
        onnx.save_model(model, str(tmp / GRAPH_FILE))
        try:
            onnx.checker.check_model(str(tmp / GRAPH_FILE))
        except onnx.checker.ValidationError as exc:  # a bug of this exporter, never the user's input
            raise DFlash2Error(f"the exported graph fails onnx.checker: {str(exc).splitlines()[0]}") from exc
        nodes = {}
        for n in model.graph.node:
            if n.domain:
                key = f"{n.domain}::{n.op_type}"
                entry = nodes.setdefault(key, {"count": 0, "attributes": []})
                entry["count"] += 1
                attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
                if attrs not in entry["attributes"]:
                    entry["attributes"].append(attrs)
        past_max = max_seq - T      # >= 1: context + past positions before the block (max_seq >= T + 1)
        manifest = {
            "format": FORMAT, "schema_version": SCHEMA_VERSION, "graph": GRAPH_FILE, "external_data": DATA_FILE,
            "plugins": use_plugins, "plugin_nodes": nodes, "opset": opset, "ir_version": model.ir_version,
            "dtype": dt, "selector": selector, "scan_mode": scan_mode, "target": target_key,
            "family": tcfg.family, "block_size": T, "draft_len": T - 1, "top_k": cfg.selector_top_k,
            "num_layers": cfg.num_hidden_layers, "vocab_size": cfg.vocab_size,
            "inputs": [_io(v) for v in model.graph.input], "outputs": [_io(v) for v in model.graph.output],
            "profile": _profile(max_batch_size, T, past_max),
            "versions": {"dflash2_trt": __version__, "python": sys.version.split()[0], "onnx": onnx.__version__,
                         "torch": torch.__version__},
            "sources": {"drafter": source_identity(drafter_dir, dck), "target": source_identity(target_dir, tck)},
            "command": command or [],
        }
        manifest["trtexec"] = _trtexec_shapes(manifest)
        manifest["files"] = {f: {"size": (tmp / f).stat().st_size, "sha256": sha256_file(tmp / f)}
                             for f in (GRAPH_FILE, DATA_FILE)}
        manifest["export_seconds"] = round(time.perf_counter() - t0, 3)
        write_small_file(tmp / "manifest.json", json.dumps(manifest, indent=2) + "\n")
    return ExportResult(Path(output), manifest, time.perf_counter() - t0)


def _io(v) -> dict:
    t = v.type.tensor_type
    dims = [d.dim_param if d.dim_param else int(d.dim_value) for d in t.shape.dim]
    return {"name": v.name, "dtype": {c: n for n, c in ONNX_DTYPES.items()}[t.elem_type], "shape": dims}
