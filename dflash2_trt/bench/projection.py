"""``dflash2-trt bench project``: a roofline MODEL of speculative vs autoregressive decoding on a GPU.

Not a measurement. From an acceptance (the mean tokens a speculative step accepts, from a measured
histogram or given), the published model shapes (the target's and drafter's ``config.json``; the
parameter counts come from the project's own inventories: transformers' model class on the meta
device for the target, :func:`~dflash2_trt.checkpoint.inventory.expected_drafter_tensors` for the
drafter) and a GPU's data-sheet bandwidth and dense bf16 tensor throughput, it gives the expected
decode speedup over autoregressive decoding at each concurrency B.

The cost model (every quantity is also in the document it returns, ``components``):

- A decode step is a sum of components, each one kernel family bound by memory or by arithmetic::

      t(component) = max(bytes / (BW * bw_efficiency), FLOPs / (peak * compute_efficiency))
      t(step)      = sum of its components + step_overhead

- Autoregressive step (B requests, one token each, context of L tokens per request), the target
  over T = B tokens:

  ``target_weights``   every target layer weight + the final norm + lm_head read once, plus the T
                       embedding rows; FLOPs 2 * (layer params) * T + 2 * V * H * T (logits)
  ``target_attention`` per attention layer, K/V of its visible context (min(L, window) for a
                       sliding layer) read once per request, the T new tokens' K/V written
                       (bf16); FLOPs 4 * context * q_heads * head_dim per token and layer
  ``target_recurrent`` per linear-attention (Gated DeltaNet) layer, the fp32 recurrent state
                       (value heads * key dim * value dim) read and written once per request;
                       FLOPs 6 * value heads * key dim * value dim per token (delta-rule update,
                       readout). A verify pass (K + 1 tokens) touches it more: ``replay`` (this
                       project's design, docs/TRTLLM-ENGINE.md §4 A: verify reads the committed state,
                       then the accepted tokens are replayed from it) reads it twice and writes it
                       once; ``intermediate`` (keep the state after every draft position, as
                       SGLang / vLLM do for rollback) reads it once and writes it K + 1 times

- Speculative step (K drafts per request, the combined engine's one step): the same target
  components over T = B * (K + 1) tokens (logits for every row), plus

  ``drafter_weights``  the drafter's weights read once (its selector codebooks are gathered, not
                       streamed: 2 * K * top_k rows of rank values per request); FLOPs
                       2 * (layer params) * B * (K + 1) for the draft block and the commit of the
                       step's B * (K + 1) tokens into the drafter's context (fc + each layer's
                       k / v projection: 2 * (taps * H_target * H + layers * 2 * kv * d * H) per token)
  ``drafter_attention`` K/V of min(L, drafter window) context per drafter layer and request (a
                       published target's window is its build config's: ``drafter_window: full``
                       attends to all of L, as the engine is built)
  ``drafter_lm_head``  the target's lm_head again on B * K draft rows (weights re-read)
  ``selector``         the pairwise scan: 2 * K * top_k^2 * rank FLOPs per request

- speedup(B) = tau * t_AR(B) / t_spec(B), where tau = mean tokens accepted per speculative step (the
  acceptance length; on long outputs every accepted token is emitted);
  throughputs B / t_AR and B * tau / t_spec tokens per second.

What it ignores (each could move the answer; see docs/benchmarks.md §3): prefill (context phases and
their interference with decode), kernel launch, scheduling, sampling and host overheads (unless
``step_overhead_s`` is given), attention / GEMM kernel efficiency below the roofline (unless the
efficiencies are given), tensor-parallel communication (one GPU), the KV-cache rewind and any
intermediate recurrent states kept for rejected drafts, the conv states, memory capacity (whether
B requests fit), overlap between components, clocks and power limits, quantisation, and any change
of acceptance with concurrency (the same tau at every B).
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ..checkpoint.inventory import expected_drafter_tensors, expected_target_tensors
from ..config import DFlash2Config, TargetConfig
from ..errors import ConfigError
from ..targets import fixtures_dir, resolve_dirs
from .common import MEASURED_KIND, ROOFLINE_KIND, STEPS_FORMAT, paired_target


@dataclass(frozen=True)
class GPU:
    key: str
    name: str
    hbm_bytes_per_s: float
    bf16_flops_per_s: float     # dense tensor-core bf16
    source: str
    memory_bytes: int = 0       # the memory the capacity check sizes for (memory_source says where it comes from)
    memory_source: str = ""


GPUS: dict[str, GPU] = {
    "h200": GPU("h200", "NVIDIA H200 SXM", 4.8e12, 989.5e12,
                "NVIDIA H200 Tensor Core GPU data sheet: 141 GB HBM3e at 4.8 TB/s; BF16 Tensor Core 1,979 TFLOPS "
                "with sparsity, 989.5 dense", 143771 << 20,
                "nvidia-smi on the H200 lent to this project: 143771 MiB (build --dry-run's 140.4 GiB)"),
    "h100": GPU("h100", "NVIDIA H100 SXM", 3.35e12, 989.4e12,
                "NVIDIA H100 Tensor Core GPU data sheet (SXM): 80 GB HBM3 at 3.35 TB/s; BF16 Tensor Core 1,979 "
                "TFLOPS with sparsity, 989.4 dense", 81559 << 20,
                "nvidia-smi on the H100 80GB HBM3 lent to this project: 81559 MiB"),
    "b200": GPU("b200", "NVIDIA B200 (HGX, 1000 W)", 8.0e12, 2.25e15,
                "NVIDIA Blackwell B200: 192 GB HBM3e at 8 TB/s; HGX B200 FP16/BF16 Tensor Core 4.5 PFLOPS with "
                "sparsity, 2.25 dense", 192 * 10 ** 9,
                "the data sheet's 192 GB (not yet read from CUDA on a B200 by this project)"),
}


@dataclass(frozen=True)
class TargetShapes:
    """What the model needs of a target (per layer: ``attention`` | ``sliding`` | ``linear``)."""

    name: str
    hidden_size: int
    vocab_size: int
    layer_params: int          # every decoder-layer tensor (matmul weights dominate)
    other_params: int          # final norm and similar, read once per pass
    lm_head_params: int
    layer_kinds: tuple[str, ...]
    q_heads: int
    kv_heads: int
    head_dim: int
    window: int | None
    linear_value_heads: int = 0
    linear_key_dim: int = 0
    linear_value_dim: int = 0
    weight_bytes: int = 2      # bf16
    kv_bytes: int = 2          # bf16 KV cache
    state_bytes: int = 4       # fp32 recurrent state
    max_position_embeddings: int | None = None   # the longest context the model takes (--context-len's bound)


@dataclass(frozen=True)
class DrafterShapes:
    name: str
    hidden_size: int
    layer_params: int          # drafter layers (attention, MLP, dynamic convs)
    fc_params: int             # fc (taps -> hidden)
    other_params: int          # norms, the selector's hidden projection
    num_layers: int
    q_heads: int
    kv_heads: int
    head_dim: int
    window: int | None
    num_taps: int
    target_hidden_size: int
    block_size: int
    top_k: int
    rank: int
    weight_bytes: int = 2


_LAYER = re.compile(r"\.layers\.(\d+)\.")


def _numel(shape) -> int:
    return int(math.prod(shape))


def target_shapes(target_dir_or_config, name: str | None = None) -> TargetShapes:
    """Shapes of a target from its ``config.json`` (a directory or a dict); params from transformers'
    model class on the meta device (the project's inventory of the target)."""
    cfg = TargetConfig.from_hugging_face(target_dir_or_config)
    tensors = expected_target_tensors(cfg)
    layer = other = embed = lm_head = 0
    for n, e in tensors.items():
        k = _numel(e.shape)
        if _LAYER.search(n):
            layer += k
        elif "embed_tokens" in n:
            embed += k
        elif n.endswith("lm_head.weight"):
            lm_head += k
        else:
            other += k
    if lm_head == 0:             # tied: the embedding table is the lm_head
        lm_head = embed
    kinds = []
    for t in cfg.layer_types:
        kinds.append({"full_attention": "attention", "sliding_attention": "sliding",
                      "linear_attention": "linear"}.get(t, "attention"))
    return TargetShapes(
        name=name or str(getattr(cfg, "source", "target")), hidden_size=cfg.hidden_size, vocab_size=cfg.vocab_size,
        layer_params=layer, other_params=other, lm_head_params=lm_head, layer_kinds=tuple(kinds),
        q_heads=cfg.num_attention_heads, kv_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
        window=cfg.sliding_window, linear_value_heads=cfg.linear_num_value_heads or 0,
        linear_key_dim=cfg.linear_key_head_dim or 0, linear_value_dim=cfg.linear_value_head_dim or 0,
        max_position_embeddings=cfg.max_position_embeddings)


def drafter_shapes(drafter_dir_or_config, target: TargetShapes, name: str | None = None) -> DrafterShapes:
    cfg = DFlash2Config.from_hugging_face(drafter_dir_or_config)
    tensors = expected_drafter_tensors(cfg, target.hidden_size)
    layer = fc = other = 0
    for n, e in tensors.items():
        k = _numel(e.shape)
        if n.startswith("layers."):
            layer += k
        elif n == "fc.weight":
            fc += k
        elif "codebook" in n:
            continue             # gathered rows only (see the module docstring)
        else:
            other += k
    return DrafterShapes(
        name=name or str(getattr(cfg, "source", "drafter")), hidden_size=cfg.hidden_size, layer_params=layer,
        fc_params=fc, other_params=other, num_layers=cfg.num_hidden_layers, q_heads=cfg.num_attention_heads,
        kv_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim, window=cfg.sliding_window,
        num_taps=cfg.num_taps, target_hidden_size=target.hidden_size, block_size=cfg.block_size,
        top_k=cfg.selector_top_k, rank=cfg.selector_rank)


# ---- the cost model ------------------------------------------------------------------------------
def _comp(name: str, bytes_: float, flops: float, gpu: GPU, bw_eff: float, fl_eff: float) -> dict:
    t_mem = bytes_ / (gpu.hbm_bytes_per_s * bw_eff)
    t_fl = flops / (gpu.bf16_flops_per_s * fl_eff)
    return {"name": name, "bytes": bytes_, "flops": flops, "time_s": max(t_mem, t_fl),
            "bound": "memory" if t_mem >= t_fl else "compute"}


RECURRENT_VERIFY = ("replay", "intermediate")


def target_pass(t: TargetShapes, batch: int, tokens_per_request: int, context: int, gpu: GPU, *,
                bw_eff: float = 1.0, fl_eff: float = 1.0, recurrent: str = "replay") -> list[dict]:
    """The target over ``batch * tokens_per_request`` tokens (logits for every one)."""
    T = batch * tokens_per_request
    wb = t.weight_bytes
    weights = _comp("target_weights",
                    (t.layer_params + t.other_params + t.lm_head_params) * wb + T * t.hidden_size * wb,
                    2.0 * t.layer_params * T + 2.0 * t.lm_head_params * T, gpu, bw_eff, fl_eff)
    att_bytes = att_flops = 0.0
    n_attn = 0
    for kind in t.layer_kinds:
        if kind == "linear":
            continue
        n_attn += 1
        ctx = min(context, t.window) if (kind == "sliding" and t.window) else context
        per_tok = 2 * t.kv_heads * t.head_dim * t.kv_bytes
        att_bytes += batch * ctx * per_tok + T * per_tok
        att_flops += 4.0 * ctx * t.q_heads * t.head_dim * T
    out = [weights, _comp("target_attention", att_bytes, att_flops, gpu, bw_eff, fl_eff)]
    n_lin = sum(k == "linear" for k in t.layer_kinds)
    if n_lin:
        state = t.linear_value_heads * t.linear_key_dim * t.linear_value_dim
        if tokens_per_request == 1:
            touches = 2                                   # read + write
        elif recurrent == "replay":
            touches = 3                                   # verify reads; the replay reads and writes
        elif recurrent == "intermediate":
            touches = 1 + tokens_per_request              # one read, a state written per position
        else:
            raise ConfigError(f"one of {', '.join(RECURRENT_VERIFY)}, got {recurrent!r}", field="--recurrent-verify")
        out.append(_comp("target_recurrent", n_lin * batch * touches * state * t.state_bytes,
                         n_lin * 6.0 * state * T, gpu, bw_eff, fl_eff))
    return out


def drafter_pass(d: DrafterShapes, t: TargetShapes, batch: int, context: int, gpu: GPU, *, bw_eff: float = 1.0,
                 fl_eff: float = 1.0) -> list[dict]:
    """One draft block (K + 1 positions) per request + the commit of the step's B * (K + 1) tokens."""
    K = d.block_size - 1
    T = batch * (K + 1)
    wb = d.weight_bytes
    kv_out = 2 * d.kv_heads * d.head_dim
    commit_params = d.fc_params + d.num_layers * kv_out * d.hidden_size
    gathered = batch * 2 * K * d.top_k * d.rank * wb
    weights = _comp("drafter_weights",
                    (d.layer_params + d.fc_params + d.other_params) * wb + gathered + T * d.hidden_size * wb,
                    2.0 * d.layer_params * T + 2.0 * commit_params * T, gpu, bw_eff, fl_eff)
    ctx = min(context, d.window) if d.window else context
    per_tok = kv_out * t.kv_bytes
    attention = _comp("drafter_attention", d.num_layers * (batch * ctx * per_tok + 2 * T * per_tok),
                      d.num_layers * 4.0 * ctx * d.q_heads * d.head_dim * T, gpu, bw_eff, fl_eff)
    lm_head = _comp("drafter_lm_head", t.lm_head_params * wb, 2.0 * t.lm_head_params * batch * K, gpu, bw_eff, fl_eff)
    selector = _comp("selector", 0.0, batch * 2.0 * K * d.top_k ** 2 * d.rank, gpu, bw_eff, fl_eff)
    return [weights, attention, lm_head, selector]


def project_point(t: TargetShapes, d: DrafterShapes, gpu: GPU, *, batch: int, context: int, tau: float,
                  bw_eff: float = 1.0, fl_eff: float = 1.0, step_overhead_s: float = 0.0,
                  recurrent: str = "replay") -> dict:
    K = d.block_size - 1
    ar = target_pass(t, batch, 1, context, gpu, bw_eff=bw_eff, fl_eff=fl_eff)
    spec = (target_pass(t, batch, K + 1, context, gpu, bw_eff=bw_eff, fl_eff=fl_eff, recurrent=recurrent)
            + drafter_pass(d, t, batch, context, gpu, bw_eff=bw_eff, fl_eff=fl_eff))
    t_ar = sum(c["time_s"] for c in ar) + step_overhead_s
    t_spec = sum(c["time_s"] for c in spec) + step_overhead_s
    return {"concurrency": batch, "ar_step_s": t_ar, "spec_step_s": t_spec,
            "ar_tokens_per_s": batch / t_ar, "spec_tokens_per_s": batch * tau / t_spec,
            "speedup": tau * t_ar / t_spec, "components": {"autoregressive": ar, "speculative": spec}}


# ---- the article's published table (Qwen3.8-27B, SGLang, one H200, seven draft tokens) -------------------
ARTICLE = {
    "source": "DFlash 2 blog post (Inco AI, 2026-08-23), 'Why acceptance length is not a leaderboard statistic'",
    "setup": "Qwen3.8-27B, SGLang on one H200, seven draft tokens per step",
    "dflash2_mean_acceptance": 4.80,
    "headline_speedup_range": [2.7, 3.4],
    "headline_note": "'2.7-3.4x autoregressive on Qwen3.8-27B' (concurrency not stated; the post's framing puts the "
                     "clear wins at concurrency 1)",
    "concurrency_32": {          # task: (autoregressive tok/s, DFlash2 tok/s, DFlash2 speedup)
        "GSM8K": (1329.8, 1922.5, 1.45), "MATH-500": (1505.8, 1951.8, 1.30), "HumanEval": (1546.5, 1799.0, 1.16),
        "MBPP": (1507.7, 1886.8, 1.25), "MT-Bench": (1507.4, 1525.3, 1.01),
    },
}


def compare_with_article(points: list[dict], tau: float) -> dict | None:
    """How close the H200 projection comes to the article (where the setup matches). Like for like only
    when the projection's tau is the article's DFlash2 acceptance (``--acceptance 4.80``): ``same_tau``."""
    by_b = {p["concurrency"]: p for p in points}
    c32 = ARTICLE["concurrency_32"]
    sp = [v[2] for v in c32.values()]
    ar = [v[0] for v in c32.values()]
    out = {"source": ARTICLE["source"], "setup": ARTICLE["setup"], "article_tau": ARTICLE["dflash2_mean_acceptance"],
           "projection_tau": tau, "same_tau": abs(tau - ARTICLE["dflash2_mean_acceptance"]) < 0.005}
    if 32 in by_b:
        p = by_b[32]
        out["concurrency_32"] = {
            "article_speedup_range": [min(sp), max(sp)], "article_speedup_mean": sum(sp) / len(sp),
            "projected_speedup": p["speedup"], "ratio_projected_to_article_mean": p["speedup"] / (sum(sp) / len(sp)),
            "article_ar_tokens_per_s_range": [min(ar), max(ar)], "projected_ar_tokens_per_s": p["ar_tokens_per_s"],
            "ratio_projected_ar_to_article_mean": p["ar_tokens_per_s"] / (sum(ar) / len(ar)),
        }
    if 1 in by_b:
        lo, hi = ARTICLE["headline_speedup_range"]
        out["concurrency_1"] = {"article_headline_range": [lo, hi], "note": ARTICLE["headline_note"],
                                "projected_speedup": by_b[1]["speedup"],
                                "ratio_projected_to_headline_mid": by_b[1]["speedup"] / ((lo + hi) / 2)}
    return out if ("concurrency_32" in out or "concurrency_1" in out) else None


def tau_from(*, acceptance: float | None = None, report: dict | None = None, draft_len: int,
             report_source=None, target: str | None = None) -> tuple[float, dict]:
    """The mean tokens per speculative step: given, or from a bench report's measured histogram (pooled over
    its runs). A report measured with more drafts than the projected drafter has is truncated:
    E[min(n, draft_len + 1)]; with fewer it cannot say what the extra positions would accept (an error). ``target``:
    the projected target; a report that names another is refused, as ``--costs-from`` refuses one (a drafter's
    acceptance is its own pair's: a tiny pair's projected qwen3.8-27b "measured", naming neither)."""
    if (acceptance is None) == (report is None):
        raise ConfigError("give exactly one of --acceptance or --acceptance-from", field="--acceptance")
    if acceptance is not None:
        if not (1.0 <= acceptance <= draft_len + 1):
            raise ConfigError(f"must be in [1, {draft_len + 1}] (tokens per step with {draft_len} drafts), got "
                              f"{acceptance}", field="--acceptance")
        return float(acceptance), {"kind": "given", "mean": float(acceptance)}
    try:
        runs = report["runs"]
        measured_k = report["draft_len"]
        if not isinstance(runs, list):
            raise TypeError
        hists = [(i, run["speculative"]["acceptance"]["histogram"]) for i, run in enumerate(runs)]
    except (KeyError, TypeError, ValueError):
        raise ConfigError("not a bench report with measured acceptance histograms (runs[].speculative.acceptance."
                          "histogram)", source=report_source) from None
    if not isinstance(measured_k, int) or isinstance(measured_k, bool) or not 1 <= measured_k <= 1024:
        raise ConfigError(f"must be an integer in [1, 1024] (drafts per step), got {measured_k!r}",
                          source=report_source, field="draft_len")
    hist: dict[int, int] = {}
    for i, h in hists:
        where = f"runs[{i}].speculative.acceptance.histogram"
        if not isinstance(h, dict):
            raise ConfigError(f"must be an object {{tokens per step: steps}}, got {type(h).__name__}",
                              source=report_source, field=where)
        for n, c in h.items():
            # a step emits 1 .. K+1 tokens; a count is a number of steps (a whole number >= 0)
            try:
                n_int = int(n)
            except (TypeError, ValueError):
                n_int = None
            if n_int is None or str(n_int) != str(n).strip() or not 1 <= n_int <= measured_k + 1:
                raise ConfigError(f"step length {n!r} is not in [1, {measured_k + 1}] (draft_len {measured_k} + 1)",
                                  source=report_source, field=where)
            if isinstance(c, bool) or not isinstance(c, int) or c < 0:
                raise ConfigError(f"[{n!r}]: the count must be a whole number >= 0, got {c!r}", source=report_source,
                                  field=where)
            hist[n_int] = hist.get(n_int, 0) + c
    hist = {n: c for n, c in hist.items() if c}
    if not hist:
        raise ConfigError("the report has no generation steps", source=report_source)
    if measured_k < draft_len:
        raise ConfigError(f"the report measured {measured_k} drafts per step; the projected drafter has {draft_len} "
                          f"(acceptance beyond position {measured_k} is unknown)", source=report_source,
                          field="draft_len")
    steps = sum(hist.values())
    tau = sum(min(n, draft_len + 1) * c for n, c in hist.items()) / steps
    measured_target = report.get("target")
    if target is not None and isinstance(measured_target, str) and measured_target != target:
        raise ConfigError(f"measured {measured_target!r}, not {target!r}: a drafter's acceptance is its own pair's "
                          f"(--acceptance {tau:.2f} projects this one's deliberately)", source=report_source,
                          field="target")
    info = {"kind": "measured", "source": str(report_source) if report_source else None, "steps": steps,
            "histogram": {str(k): hist[k] for k in sorted(hist)}, "measured_draft_len": measured_k, "mean": tau}
    if measured_k > draft_len:   # said in the rendered projection: the report's own mean is not the tau used
        info["truncated_to"] = draft_len + 1
        info["report_mean"] = sum(n * c for n, c in hist.items()) / steps
    emitted = report_emitted_mean(runs)
    if emitted is not None:
        info["report_emitted_mean"] = emitted
    return tau, info


def report_emitted_mean(runs) -> float | None:
    """Tokens a bench report's generation steps emitted per step, pooled over its runs (``acceptance.emitted_mean``
    weighted by ``steps``); None where a run lacks it (a TensorRT-LLM tool's report). Below the acceptance length
    when requests were short enough for their cut last steps to count: the projection keeps the acceptance length
    (what long outputs reach) and says so."""
    total = steps = 0.0
    for run in runs:
        acc = (run.get("speculative") or {}).get("acceptance") or {}
        e, n = acc.get("emitted_mean"), acc.get("steps")
        if e is None or n is None:
            return None
        total, steps = total + float(e) * n, steps + n
    return total / steps if steps else None


def emitted_note(acceptance: dict) -> str | None:
    """The line that says a report's requests emitted fewer tokens per step than the tau used, if they did by over
    2%; or that the report measured more drafts per step than the projected drafter has (its steps truncated)."""
    if "truncated_to" in acceptance:
        k1 = acceptance["truncated_to"]
        return (f"  (the report measured {acceptance['measured_draft_len']} drafts per step, this drafter has {k1 - 1}: "
                f"its steps longer than {k1} tokens count as {k1}, tau = E[min(n, {k1})] = {acceptance['mean']:.2f}; "
                f"the report's own mean is {acceptance['report_mean']:.2f}. A drafter's acceptance at its own K is "
                f"better measured with it)")
    e, tau = acceptance.get("report_emitted_mean"), acceptance.get("mean")
    if e is None or tau is None or e >= 0.98 * tau:
        return None
    return (f"  (the report's requests emitted {e:.2f} tokens per generation step: their outputs were short enough "
            f"for the cut last steps to count; tau is the acceptance length, {tau:.2f}, what long outputs reach)")


def project(t: TargetShapes, d: DrafterShapes, gpus, *, concurrency, context: int, tau: float,
            acceptance_info: dict, bw_eff: float = 1.0, fl_eff: float = 1.0, step_overhead_s: float = 0.0,
            recurrent: str = "replay") -> dict:
    """The projection document (``report.projection``)."""
    if recurrent not in RECURRENT_VERIFY:
        raise ConfigError(f"one of {', '.join(RECURRENT_VERIFY)}, got {recurrent!r}", field="--recurrent-verify")
    for v, f in ((bw_eff, "--bandwidth-efficiency"), (fl_eff, "--compute-efficiency")):
        if not 0 < v <= 1:
            raise ConfigError(f"must be in (0, 1], got {v}", field=f)
    limit = t.max_position_embeddings
    if not isinstance(context, int) or isinstance(context, bool) or context < 1 or (limit and context > limit):
        raise ConfigError(f"must be an integer in [1, {limit or 'inf'}] (the target's max_position_embeddings), got "
                          f"{context!r}", field="--context-len")
    if not (isinstance(tau, (int, float)) and math.isfinite(tau) and 1 <= tau <= d.block_size):
        raise ConfigError(f"must be in [1, {d.block_size}], got {tau}", field="--acceptance")
    if not (isinstance(step_overhead_s, (int, float)) and math.isfinite(step_overhead_s)
            and 0 <= step_overhead_s <= 1.0):
        raise ConfigError(f"must be a finite number of milliseconds in [0, 1000], got {step_overhead_s * 1e3}",
                          field="--step-overhead-ms")
    for v, f in ((bw_eff, "--bandwidth-efficiency"), (fl_eff, "--compute-efficiency")):
        if not math.isfinite(v):
            raise ConfigError(f"must be in (0, 1], got {v}", field=f)
    per_gpu = []
    for g in gpus:
        pts = [project_point(t, d, g, batch=b, context=context, tau=tau, bw_eff=bw_eff, fl_eff=fl_eff,
                             step_overhead_s=step_overhead_s, recurrent=recurrent) for b in concurrency]
        entry = {"gpu": asdict(g), "points": pts}
        if g.key == "h200" and t.name.lower().startswith("qwen3.8-27b") and d.block_size == 8:
            entry["article"] = compare_with_article(pts, tau)
        per_gpu.append(entry)
    return {
        "kind": ROOFLINE_KIND,
        "costs": {"kind": "assumed", "model": "roofline", "bandwidth_efficiency": bw_eff,
                  "compute_efficiency": fl_eff, "step_overhead_s": step_overhead_s},
        "target": asdict(t) | {"layer_kinds": {k: t.layer_kinds.count(k) for k in sorted(set(t.layer_kinds))}},
        "drafter": asdict(d), "draft_len": d.block_size - 1, "acceptance": acceptance_info, "tau": tau,
        "context_len": context, "bandwidth_efficiency": bw_eff, "compute_efficiency": fl_eff,
        "step_overhead_s": step_overhead_s, "recurrent_verify": recurrent, "gpus": per_gpu,
        "model": "t(component) = max(bytes / (BW * bw_eff), FLOPs / (peak * compute_eff)); step = sum + overhead; "
                 "speedup = tau * t_AR / t_spec (dflash2_trt/bench/projection.py)",
    }


COST_BASES = {"busy": "gpu_busy_ms", "wall": "wall_ms", "graph": "graph_ms"}
"""Which time of a ``bench steps`` point a measured projection uses: the step's kernel time (what an engine replayed
without launch gaps approaches), its whole wall time (the eager stand-in's, host overhead included), or the step
replayed as a CUDA graph (kernels and the gaps between them, no launches)."""


def measured_projection(steps: dict, *, tau: float, acceptance_info: dict, source, concurrency=None,
                        basis: str = "busy") -> dict:
    """The projection from MEASURED step costs: a ``bench steps`` report (``dflash2_trt/bench/steps.py``) gives
    t_AR(B) and t_spec(B) on its GPU; speedup(B) = tau * t_AR / t_spec. Nothing is modelled."""
    if basis not in COST_BASES:
        raise ConfigError(f"one of {', '.join(COST_BASES)}, got {basis!r}", field="--cost-basis")
    try:
        if steps.get("format") != STEPS_FORMAT:
            raise TypeError
        by_c = {int(p["concurrency"]): p for p in steps["points"]}
        K, device = int(steps["draft_len"]), str(steps["device"])
    except (AttributeError, KeyError, TypeError, ValueError):
        raise ConfigError("not a `bench steps` report (format 'dflash2-trt bench steps', points[])",
                          source=source) from None
    levels = sorted(by_c) if concurrency is None else list(concurrency)
    missing = [c for c in levels if c not in by_c]
    if missing:
        why = {sk.get("concurrency"): sk.get("error") for sk in steps.get("skipped") or [] if isinstance(sk, dict)}
        raise ConfigError(f"concurrency {missing[0]} was not measured (the report has {sorted(by_c)}"
                          + (f"; {why[missing[0]]}" if why.get(missing[0]) else "") + ")", field="--concurrency")
    if not (isinstance(tau, (int, float)) and math.isfinite(tau) and 1 <= tau <= K + 1):
        raise ConfigError(f"must be in [1, {K + 1}], got {tau}", field="--acceptance")
    key = COST_BASES[basis]
    pts = []
    for c in levels:
        sp, ar = by_c[c]["speculative"], by_c[c]["target_only"]
        if key not in sp or key not in ar:
            why = sp.get("graph_error") or ar.get("graph_error") if basis == "graph" else None
            prof = sp.get("profiler_error") or ar.get("profiler_error") if basis == "busy" else None
            hint = (f"; its capture failed: {why}" if why else "; not probed (a capture at an earlier concurrency "
                    "failed, or the report is not a GPU's)" if basis == "graph" else "")
            # measured on a GPU whose profiler recorded nothing: its reason, and the bases that stand
            advice = (f": {prof} (use --cost-basis wall or graph)" if prof
                      else " (measure on a GPU, or --cost-basis wall)")
            raise ConfigError(f"concurrency {c}: no {key} in the report{advice}{hint}", source=source,
                              field="--cost-basis")
        t_spec, t_ar = sp[key] / 1e3, ar[key] / 1e3
        comps = sp.get("components_ms") if basis == "busy" else sp.get("spans_ms")
        pts.append({"concurrency": c, "ar_step_s": t_ar, "spec_step_s": t_spec, "ar_tokens_per_s": c / t_ar,
                    "spec_tokens_per_s": c * tau / t_spec, "speedup": tau * t_ar / t_spec,
                    "components": {"speculative": [{"name": k, "time_s": v / 1e3} for k, v in (comps or {}).items()]}})
    entry = {"gpu": {"key": "measured", "name": device}, "points": pts}
    if steps.get("target") == "qwen3.8-27b" and K == 7 and "H200" in device:
        entry["article"] = compare_with_article(pts, tau)
    return {
        "kind": MEASURED_KIND,
        "costs": {"kind": "measured", "source": str(source), "basis": basis, "device": device,
                  "backend": steps.get("backend"), "context_len": steps.get("context_len"),
                  "weights": steps.get("weights"), "notes": list(steps.get("notes") or [])},
        "target": {"name": steps.get("target")}, "draft_len": K, "acceptance": acceptance_info, "tau": tau,
        "context_len": steps.get("context_len"), "gpus": [entry],
        "model": "speedup = tau * t_AR / t_spec with both step times measured (dflash2_trt/bench/steps.py)",
    }


@functools.lru_cache(maxsize=8)
def published_pair_shapes(target_key: str) -> tuple[TargetShapes, DrafterShapes]:
    """Shapes of a registered target's published pair, from their config.json: the published-config
    configs shipped in the package (``assets/published/``), else the local
    checkpoints (``$DFLASH2_TRT_MODELS``, the HF cache); nothing is downloaded."""
    entry = paired_target(target_key)
    if entry.target_id is None or entry.drafter_id is None:
        d, tdir = resolve_dirs(entry)
    else:
        fx = fixtures_dir()
        tdir, d = (fx / entry.target_id.replace("/", "__")), (fx / entry.drafter_id.replace("/", "__"))
        if not ((tdir / "config.json").is_file() and (d / "config.json").is_file()):
            d, tdir = resolve_dirs(entry)
    t = target_shapes(Path(tdir), name=target_key)
    d = drafter_shapes(Path(d), t, name=f"{target_key} drafter")
    from ..config.build import BuildConfig

    if BuildConfig.load(entry.build_config_path).drafter_window == "full":
        # the engine's drafter attends to the whole context, as the target's build config builds it
        # (build_configs/*.yaml drafter_window: full), not within the checkpoint's own sliding window
        d = replace(d, window=None)
    return t, d


def render(doc: dict) -> str:
    if doc.get("costs", {}).get("kind") == "measured":
        return render_measured(doc)
    lines = ["costs: assumed (roofline model: data-sheet bandwidth and bf16 rate times the given efficiencies, no cost "
             "per step beyond --step-overhead-ms: what the shapes allow, not a prediction of a measured speedup; "
             "`--costs-from` a `bench steps` report uses measured ones)"]
    lines += [f"PROJECTION ({doc['kind']}): {doc['target']['name']} + drafter, {doc['draft_len']} drafts/step, "
             f"tau = {doc['tau']:.2f} tokens/step ({doc['acceptance']['kind']}), context {doc['context_len']} tokens, "
             f"efficiency bw {doc['bandwidth_efficiency']:g} / compute {doc['compute_efficiency']:g}, "
             f"overhead {doc['step_overhead_s'] * 1e3:g} ms/step"
             + (f", recurrent verify {doc['recurrent_verify']}" if "linear" in doc["target"]["layer_kinds"] else "")]
    if (note := emitted_note(doc["acceptance"])) is not None:
        lines.append(note)
    for g in doc["gpus"]:
        lines.append(f"  {g['gpu']['name']} ({g['gpu']['hbm_bytes_per_s'] / 1e12:g} TB/s, "
                     f"{g['gpu']['bf16_flops_per_s'] / 1e12:g} TFLOP/s bf16 dense)")
        lines.append(f"  {'conc':>6} {'AR ms/step':>10} {'spec ms/step':>12} {'AR tok/s':>9} {'spec tok/s':>10} "
                     f"{'speedup':>7}  bound (spec target weights)")
        for p in g["points"]:
            bound = p["components"]["speculative"][0]["bound"]
            over = "  (KV cache over capacity)" if p.get("kv_fits") is False else ""
            lines.append(f"  {p['concurrency']:>6} {_ms(p['ar_step_s']):>10} {_ms(p['spec_step_s']):>12} "
                         f"{p['ar_tokens_per_s']:>9.0f} {p['spec_tokens_per_s']:>10.0f} {p['speedup']:>7.2f}  {bound}"
                         f"{over}")
        if (cap := g.get("memory")) and cap.get("most_requests") is not None:
            over = [p["concurrency"] for p in g["points"] if p.get("kv_fits") is False]
            lines.append(f"  memory: {cap['gpu_memory_bytes'] / 2**30:.1f} GiB; the combined engine's KV budget "
                         f"({cap['kv_cache_free_gpu_mem_fraction']:g} of what weights and activations leave, as build "
                         f"--dry-run sizes it) holds {cap['most_requests']:,} requests at context "
                         f"{cap['context_len']:,}"
                         + (f": concurrency {', '.join(map(str, over))} would not all fit at once (projected all the "
                            f"same; on an engine the others wait for KV blocks)" if over else ""))
        art = g.get("article")
        if art:
            c32, c1 = art.get("concurrency_32"), art.get("concurrency_1")
            if not art["same_tau"]:
                lines.append(f"  (the article's DFlash2 accepts {art['article_tau']:.2f} tokens/step, this projection "
                             f"uses {art['projection_tau']:.2f}: not like for like; --acceptance 4.80 is)")
            if c32:
                lines.append(f"  vs the article at concurrency 32: DFlash2 {c32['article_speedup_range'][0]:.2f}-"
                             f"{c32['article_speedup_range'][1]:.2f}x (mean {c32['article_speedup_mean']:.2f}), "
                             f"projected {c32['projected_speedup']:.2f}x; AR {c32['article_ar_tokens_per_s_range'][0]:.0f}-"
                             f"{c32['article_ar_tokens_per_s_range'][1]:.0f} tok/s, projected "
                             f"{c32['projected_ar_tokens_per_s']:.0f}")
            if c1:
                lines.append(f"  vs the article's headline {c1['article_headline_range'][0]}-"
                             f"{c1['article_headline_range'][1]}x: projected {c1['projected_speedup']:.2f}x at "
                             f"concurrency 1")
    return "\n".join(lines)


def _ms(seconds: float) -> str:
    """A step time in milliseconds: two decimals, or three significant digits below 0.1 ms (a tiny target's step is
    microseconds, which two decimals print as 0.00)."""
    ms = seconds * 1e3
    return f"{ms:.2f}" if ms >= 0.1 or ms == 0 else f"{ms:.3g}"


def render_measured(doc: dict) -> str:
    c = doc["costs"]
    lines = [f"costs: measured ({c['basis']} time per step) from {c['source']}: {c['device']}, {c['backend']} backend, "
             f"context {c['context_len']}, {c['weights']}",
             f"PROJECTION (measured): {doc['target']['name']}, {doc['draft_len']} drafts/step, tau = {doc['tau']:.2f} "
             f"tokens/step ({doc['acceptance']['kind']})",
             f"  {'conc':>6} {'AR ms/step':>10} {'spec ms/step':>12} {'AR tok/s':>9} {'spec tok/s':>10} {'speedup':>7}"]
    if (note := emitted_note(doc["acceptance"])) is not None:
        lines.insert(2, note)
    for g in doc["gpus"]:
        for p in g["points"]:
            lines.append(f"  {p['concurrency']:>6} {_ms(p['ar_step_s']):>10} {_ms(p['spec_step_s']):>12} "
                         f"{p['ar_tokens_per_s']:>9.0f} {p['spec_tokens_per_s']:>10.0f} {p['speedup']:>7.2f}")
        art = g.get("article")
        what = "a TensorRT engine" if c["backend"] == "trtllm" else f"the {c['backend']} backend's eager stand-in"
        if art and "concurrency_32" in art:
            a = art["concurrency_32"]
            lines.append(f"  article (SGLang), concurrency 32: {a['article_speedup_range'][0]:.2f}-"
                         f"{a['article_speedup_range'][1]:.2f}x (mean {a['article_speedup_mean']:.2f}); measured here "
                         f"on {what}: {a['projected_speedup']:.2f}x")
        if art and "concurrency_1" in art:
            a = art["concurrency_1"]
            lines.append(f"  article headline: {a['article_headline_range'][0]}-{a['article_headline_range'][1]}x; "
                         f"measured here at concurrency 1 on {what}: {a['projected_speedup']:.2f}x")
    lines += ["notes:"] + [f"  - {n}" for n in c["notes"]]
    return "\n".join(lines)
