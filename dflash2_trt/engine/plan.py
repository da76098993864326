"""What ``dflash2-trt build`` will do, computed from configs alone: settings, steps, the trtllm-build
command line and the numbers a GPU is sized with (``build --dry-run``; the real build runs the same
:func:`prepare` first).

Config-only directories (a ``config.json`` and no weights, e.g. the published configs in
``dflash2_trt/assets/published/``) are enough: weight bytes come from the converter's own plan
(:mod:`dflash2_trt.convert.plan`: every output tensor's shape per rank), not from files.

Memory figures (per rank, bytes; ``K = block_size - 1``, ``itemsize`` of the engine dtype):

======================================  ==========================================================================
figure                                  how it is computed
======================================  ==========================================================================
weights                                 sum of the rank's output tensors (``convert`` plan) x itemsize
KV bytes per token                      (target attention layers + drafter layers) x 2 (K and V) x KV heads per
                                        rank x head_size x itemsize: ONE pool, one per-token layout for every layer
                                        (the drafter's layers are pool layers after the target's)
extra slots per request                 2K: trtllm-build adds ``max_draft_len`` and ``num_eagle_layers`` (both K)
                                        to ``max_seq_len`` in EAGLE mode (tensorrt_llm/builder.py)
KV bytes per request                    ceil((max_seq_len + 2K) / tokens_per_block) blocks x tokens_per_block x
                                        KV bytes per token (a request's blocks are reserved for its whole life)
recurrent state per request             Qwen3.5 hybrid only: linear layers x (value heads per rank x (key_dim +
                                        E) x value_dim x 4 (fp32 state + the deferred commit's records, E rows
                                        for K+1 verify tokens: trtllm/gdn_slot.py) + (conv_kernel - 1) x conv
                                        channels per rank x itemsize)
activations (estimate)                  logits max_batch_size x (K+1) x vocab x 4 (fp32 output) + max_num_tokens x
                                        3 x intermediate per rank x itemsize (the MLP's widest live tensors) +
                                        max_num_tokens x taps x hidden x itemsize (the drafter's fc input); the
                                        real figure is TensorRT's and is known only after the build
reserve (estimate)                      1 GiB: CUDA context, cuBLAS/NCCL workspaces
KV budget                               kv_cache_free_gpu_mem_fraction x (GPU memory - weights - activations -
                                        reserve): TensorRT-LLM gives the KV cache that share of what is free
largest batch that fits                 KV budget // (KV bytes per request + recurrent state per request), every
                                        request at the full max_seq_len
======================================  ==========================================================================
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .. import __version__
from ..bench.trtllm_bench import OPTIONS_FILE, SAMPLER_FILE, planned_command
from ..checkpoint.reader import SafetensorsCheckpoint
from ..config import DFlash2Config, TargetConfig, pairing_problems
from ..config.build import BuildConfig, fit_pool_blocks, pool_blocks
from ..config.pairing import warn_once, warn_pairing
from ..convert.driver import FAMILY_MAPS, rank_plans
from ..convert.schema import build_config
from ..errors import ConfigError, MissingDependencyError, PairingError
from ..plugins import plugin_dir
from ..targets import TARGETS, get_target, status_of
from .checkpoint import checkpoint_problems
from .common import eagle_choices, shell_line
from ..trtllm.gdn_slot import gdn_slot_layout
from .pretrained import drafter_pool_layers_per_layer, engine_pretrained_config, resolve_sliding_path
from .trtllm.command import cuda_archs, default_checkpoint_dir, trtllm_build_argv, trtllm_build_env
from .trtllm.paths import runtime_path
from .trtllm.runtime_rules import runtime_reading
from .trtllm.xqa import xqa_plan
from .trtllm.windows import is_sm100_family, sm100_note, sm100_refusal, window_blockers
from .trtllm.toolchain import environment_problems, plugin_toolchain_missing, probe_toolchain, trtllm_version_refusal
from .verify import AUTO_MAX_TARGET_BYTES, planned_check_pool
from ..trtllm.backend import cuda_available, load_network, resolve
from ..trtllm.cuda.plugin_lib import nvcc_path

GIB = 1 << 30
H200_GIB = 140.4        # the H200's memory as CUDA reports it (nvidia-smi: 143771 MiB = 140.40 GiB; "141 GB" is the
                        # data sheet's, in decimal gigabytes): --gpu-memory-gib default
RESERVE_BYTES = 1 * GIB
ITEMSIZE = {"bfloat16": 2, "float16": 2, "float32": 4}
HYBRID_ISSUE = "issue 15"
# The one-line origin of a setting given on the command line (error messages name it).
OPTION_OF = {"block_size": "--block-size", "max_batch_size": "--max-batch-size", "max_input_len": "--max-input-len",
             "max_seq_len": "--max-seq-len", "max_num_tokens": "--max-num-tokens",
             "tokens_per_block": "--tokens-per-block", "selector": "--selector", "drafter_window": "--drafter-window",
             "tp_size": "--tp-size", "dtype": "--dtype"}


@dataclass
class Prepared:
    """A validated build request: configs, settings, the checkpoint config convert will write, and
    what stands in the way of each backend."""

    drafter_dir: Path
    target_dir: Path
    target_key: str | None
    t: Any                      # TargetConfig
    d: Any                      # DFlash2Config
    cfg: Any                    # BuildConfig (file + overrides, validated)
    checkpoint_config: dict     # config.json of the converted checkpoint (convert/schema.py)
    engine_families: tuple[str, ...]
    blockers: list[str] = field(default_factory=list)      # no engine for this target at all
    trtllm_blockers: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # which XQA kernel each attention layer gets on TensorRT-LLM (engine/trtllm/xqa.py): the trtllm-build env, warnings
    xqa: dict = field(default_factory=dict)

    @property
    def K(self) -> int:
        return self.cfg.block_size - 1

    @property
    def settings(self) -> dict:
        return self.cfg.to_dict()


def _defaults_from_checkpoints(t, d) -> dict:
    mpe = t.max_position_embeddings
    block = d.block_size
    return {"target": None, "dtype": t.dtype, "block_size": block, "max_batch_size": 8, "max_input_len": mpe // 2,
            "max_seq_len": mpe, "max_num_tokens": max(4096, 8 * block)}


def split_overrides(overrides: dict | None, sets: dict | None) -> tuple[dict, dict]:
    """(overrides, origins) from the named options (``None`` = not given) and ``--set``; a key given both
    ways is an error."""
    out: dict[str, Any] = {}
    origins: dict[str, str] = {}
    for k, v in (overrides or {}).items():
        if v is not None:
            out[k] = v
            origins[k] = OPTION_OF.get(k, k)
    for k, v in (sets or {}).items():
        if k in out:
            raise ConfigError(f"given twice ({origins[k]} and --set {k}=...)", source="--set", field=k)
        out[k] = v
        origins[k] = "--set"
    return out, origins


def prepare(drafter_dir, target_dir, *, target_key: str | None = None, overrides: dict | None = None,
            sets: dict | None = None) -> Prepared:
    """Configs, pairing and settings, checked; nothing is written. Weights are not needed."""
    drafter_dir, target_dir = Path(drafter_dir), Path(target_dir)
    t = TargetConfig.from_hugging_face(target_dir)
    d = DFlash2Config.from_hugging_face(drafter_dir)
    over, origins = split_overrides(overrides, sets)
    if target_key is not None:
        entry = get_target(target_key)
        check_target_family(entry, t, target_dir)
        cfg = BuildConfig.load(entry.build_config_path, over, origins, target_key=target_key)
        if cfg.block_size != d.block_size and "block_size" not in over:
            warn_once(f"the drafter in {drafter_dir} was trained with block_size {d.block_size} (its config.json), "
                      f"but target {target_key!r}'s build config ({entry.build_config}) builds block {cfg.block_size}: "
                      f"acceptance usually drops with a block the drafter was not trained for; pass --block-size "
                      f"{d.block_size} for the drafter's own")
    else:
        try:
            cfg = BuildConfig.from_mapping(_defaults_from_checkpoints(t, d), "<defaults from the checkpoint configs>",
                                           over, origins)
        except ConfigError as exc:
            # a limit derived from the target's max_position_embeddings that the build refuses: the fault is that
            # field (a fuzzing review: the line named only "<defaults from the checkpoint configs>")
            if exc.field not in ("max_input_len", "max_seq_len") or exc.field in over:
                raise
            raise ConfigError(f"{t.max_position_embeddings} is too small to derive the build's limits from "
                              f"(max_input_len = half of it, max_seq_len = all of it; {exc.field}: "
                              f"{exc.reason}); give --max-input-len and --max-seq-len",
                              source=target_dir / "config.json", field="max_position_embeddings") from None

    def origin(key: str) -> str:
        return origins.get(key, cfg.source)

    # sliding_path context of a target without sliding layers: refused here, naming where it was set
    resolve_sliding_path({"layer_types": t.layer_types, "sliding_window": t.sliding_window}, cfg,
                         source=origin("sliding_path"))
    if cfg.max_seq_len > t.max_position_embeddings:
        raise ConfigError(f"max_seq_len {cfg.max_seq_len} exceeds the target's max_position_embeddings "
                          f"{t.max_position_embeddings}", source=origin("max_seq_len"), field="max_seq_len")
    fc_shape = None
    try:
        dck = SafetensorsCheckpoint(drafter_dir)
        fc_shape = dck.info("fc.weight").shape if "fc.weight" in dck else None
    except Exception:   # config-only directory: the pairing is checked on the configs alone
        fc_shape = None
    # A dtype the build names (build config or override) casts both sides, so their stored dtypes need not agree.
    cast = target_key is not None or "dtype" in over
    problems = pairing_problems(replace(d, dtype=t.dtype) if cast else d, t, fc_weight_shape=fc_shape)
    warn_pairing(d)
    if problems:
        raise PairingError("drafter and target do not pair:\n  - " + "\n  - ".join(problems))
    if t.family in FAMILY_MAPS:
        ck = build_config(t, d, tp_size=cfg.tp_size, dtype=cfg.dtype, converter_version=__version__)
    else:
        ck = {}
    weight_bytes_per_rank(t, d, cfg.tp_size, cfg.dtype)   # the converter's split: tp must divide heads, widths, vocab
    prep = Prepared(drafter_dir, target_dir, target_key, t, d, cfg, ck, _engine_families())
    _collect_blockers(prep)
    return prep


def check_target_family(entry, t: TargetConfig, target_dir: Path) -> None:
    """A registered target's name with a target directory of another family is refused: the build would take the
    named target's build config (block size, windows, limits) and label for a different model."""
    if t.family == entry.family:
        return
    same = [k for k, e in TARGETS.items() if e.family == t.family]
    hint = f"pass --target {' or '.join(same)}, or " if same else ""
    cfg = Path(target_dir) / "config.json"
    try:
        field = "architectures" if "architectures" in json.loads(cfg.read_text()) else "model_type"
    except (OSError, ValueError):
        field = "model_type"
    raise ConfigError(f"a {t.family} model, but target {entry.key!r} is {entry.family}: {hint}drop --target to "
                      f"build with defaults from the checkpoints' own configs", source=cfg, field=field)


def _engine_families() -> tuple[str, ...]:
    return tuple(load_network("cpu").TARGET_FAMILIES)


def _collect_blockers(p: Prepared) -> None:
    t, d, cfg = p.t, p.d, p.cfg
    if t.family not in FAMILY_MAPS:
        p.blockers.append(f"target family {t.family!r} cannot be converted yet (no weight map; supported: "
                          f"{', '.join(FAMILY_MAPS)})")
    if t.family not in p.engine_families:
        extra = f" ({HYBRID_ISSUE})" if t.family == "qwen3_5" else ""
        p.blockers.append(f"target family {t.family!r} has no engine network yet: trtllm/network/families covers "
                          f"{', '.join(p.engine_families)} targets{extra}")
    if p.checkpoint_config:
        try:
            check_kv_compatible(engine_pretrained_config(p.checkpoint_config, cfg, d))
        except ConfigError as exc:
            p.blockers.append(str(exc))
    # a target's or the drafter's sliding window that can bind: TensorRT-LLM's attention plugin does not apply it in
    # speculative-decoding steps (engine/trtllm/windows.py, facts/attention_window.yaml)
    p.trtllm_blockers.extend(window_blockers(t, d, cfg))
    # and an attention layer no XQA kernel takes in those steps (engine/trtllm/xqa.py, facts/xqa_spec_decoding.yaml)
    p.xqa = xqa_plan(t, d, cfg)
    p.trtllm_blockers.extend(p.xqa["blockers"])
    if t.family == "qwen3_5":
        n_kv = sum(1 for lt in t.layer_types if lt != "linear_attention") + d.num_hidden_layers
        n_all = t.num_hidden_layers + d.num_hidden_layers
        p.warnings.append(
            f"on TensorRT-LLM the runtime reads pretrained_config.layer_types in its own names (attention, recurrent, "
            f"linear, no_op) and adds eagle_net_config.num_hidden_layers to num_hidden_layers (gptJsonConfig.cpp) "
            f"[read, not run]: the engine config therefore writes one attention/recurrent entry per layer, the "
            f"drafter's as attention (with the checkpoint's names it would give {n_all} pool layers KV space, not the "
            f"{n_kv} the sizing counts), keeps hf_layer_types, and writes the per-rank RNN fields the runtime "
            f"requires of a recurrent variant; "
            f"the stock 1.2 executor refuses speculative decoding for recurrent models (docs/TRTLLM-ENGINE.md §4), so "
            f"the engine runs on the project runtime over TensorRT (the runtime path above; stock tensorrt-llm 1.2 "
            f"is enough); the executor itself would need the relaxations of docs/hybrid-runtime.md, applied to a "
            f"1.2.x checkout by scripts/patch_trtllm_recurrent_spec.py (not yet built or run on a GPU)")
    if cfg.dtype == "float32":
        p.warnings.append("dtype float32 on TensorRT-LLM: EAGLE mode needs paged context FMHA, whose kernels are "
                          "float16/bfloat16 [inferred]; build a GPU engine with --dtype float16 or bfloat16")


def check_kv_compatible(pre: dict) -> None:
    """The network's own pool-layout check (``trtllm/network/kv_layout.py``), as a ConfigError."""
    net = load_network("cpu")
    try:
        net.check_kv_compatible(net.api.PretrainedConfig.from_dict(pre))
    except ValueError as exc:
        raise ConfigError(str(exc), field="num_key_value_heads") from None


# ---------------------------------------------------------------------------------------- sizing
def weight_bytes_per_rank(t, d, tp: int, dtype: str) -> list[dict] | None:
    """Per rank: bytes of the target's and the drafter's tensors in the converted checkpoint (from the
    converter's plan, so config-only directories work); None for a family without a weight map."""
    if t.family not in FAMILY_MAPS:
        return None
    item = ITEMSIZE[dtype]
    out = []
    for plan in rank_plans(t, d, tp):
        tb = sum(math.prod(o.shape) for o in plan if not o.name.startswith("dflash2.")) * item
        db = sum(math.prod(o.shape) for o in plan if o.name.startswith("dflash2.")) * item
        out.append({"target": tb, "drafter": db, "total": tb + db})
    return out


def kv_request_bytes(tokens: int, extra: int, tokens_per_block: int, kv_token: int) -> int:
    """One request's KV bytes per rank: ``tokens`` and the ``extra`` draft slots in whole blocks of ``kv_token`` bytes
    a token (:func:`sizing` at max_seq_len; bench project at a context)."""
    return -(-(int(tokens) + int(extra)) // tokens_per_block) * tokens_per_block * kv_token


def sizing(p: Prepared, gpu_memory_gib: float, backend: str = "trtllm") -> dict:
    """The memory plan: per rank, TensorRT-LLM's (weights, activations, the KV budget as a fraction of what is free);
    for a cpu or cuda engine also ``standin``, what the project's stand-in engine allocates (:func:`standin_memory`)."""
    t, d, cfg = p.t, p.d, p.cfg
    tp, item, K = cfg.tp_size, ITEMSIZE[cfg.dtype], p.K
    weights = weight_bytes_per_rank(t, d, tp, cfg.dtype)
    kv_heads = t.num_key_value_heads // tp if t.num_key_value_heads >= tp else 1
    per_layer = 2 * kv_heads * t.head_dim * item
    n_target = sum(1 for lt in t.layer_types if lt != "linear_attention")
    n_drafter = d.num_hidden_layers * drafter_pool_layers_per_layer(t, d, tp)
    kv_token = (n_target + n_drafter) * per_layer
    extra = 2 * K
    seq = cfg.max_seq_len + extra
    blocks = -(-seq // cfg.tokens_per_block)
    kv_request = kv_request_bytes(cfg.max_seq_len, extra, cfg.tokens_per_block, kv_token)
    recurrent = 0
    if t.family == "qwen3_5":
        nk, nv = t.linear_num_key_heads, t.linear_num_value_heads
        nk_l, nv_l = (nk // tp if nk >= tp else 1), nv // tp
        conv = 2 * nk_l * t.linear_key_head_dim + nv_l * t.linear_value_head_dim
        n_lin = sum(1 for lt in t.layer_types if lt == "linear_attention")
        # the runtime's slot: the state and the deferred commit's records of the K+1 verify tokens (gdn_slot.py)
        slot = gdn_slot_layout(nk_l, nv_l, t.linear_key_head_dim, t.linear_value_head_dim, K + 1)
        recurrent = n_lin * (slot.floats * 4 + (t.linear_conv_kernel_dim - 1) * conv * item)
    inter = max(t.intermediate_size, d.intermediate_size) // tp
    act = {"logits": cfg.max_batch_size * (K + 1) * t.vocab_size * 4,
           "mlp": cfg.max_num_tokens * 3 * inter * item,
           "taps": cfg.max_num_tokens * d.num_taps * t.hidden_size * item}
    act_total = sum(act.values())
    gpu = int(gpu_memory_gib * GIB)
    out = {
        "tp_size": tp, "dtype": cfg.dtype, "gpu_memory_bytes": gpu, "gpu_memory_gib": gpu_memory_gib,
        "weights_per_rank": weights,
        "kv": {"pool_layers": {"target": n_target, "drafter": n_drafter}, "kv_heads_per_rank": kv_heads,
               "head_size": t.head_dim, "bytes_per_token_per_layer": per_layer,
               "bytes_per_token": kv_token, "bytes_per_token_target": n_target * per_layer,
               "bytes_per_token_drafter": n_drafter * per_layer},
        "extra_slots_per_request": extra, "engine_max_seq_len": seq, "blocks_per_request": blocks,
        "kv_bytes_per_request": kv_request, "recurrent_state_bytes_per_request": recurrent,
        "activations_estimate": {**act, "total": act_total}, "reserve_estimate": RESERVE_BYTES,
        "kv_cache_free_gpu_mem_fraction": cfg.kv_cache_free_gpu_mem_fraction,
    }
    out["standin"] = (standin_memory(cfg, weights, kv_token, recurrent, act_total, gpu, backend)
                      if backend in ("cpu", "cuda") else None)
    if weights is None:
        out.update(kv_budget=None, max_batch_that_fits=None, tokens_in_kv_budget=None, fits=None)
        return out
    free = gpu - weights[0]["total"] - act_total - RESERVE_BYTES
    budget = max(0, math.floor(free * cfg.kv_cache_free_gpu_mem_fraction))
    fit = budget // (kv_request + recurrent)
    # where a full batch does not fit at max_seq_len: the longest sequence (prompt + output) each of max_batch_size
    # requests can have with all of them running at once (whole blocks, less the extra slots); the schedulers admit a
    # request only with KV blocks for its whole length, so longer ones wait (nothing is refused)
    per_request = max(0, budget // cfg.max_batch_size - recurrent)
    full_batch_len = max(0, per_request // (cfg.tokens_per_block * kv_token) * cfg.tokens_per_block - extra)
    # the most requests at once at all: each of the shortest length (a 1-token prompt and 1 new token, the extra slots)
    shortest = -(-(2 + extra) // cfg.tokens_per_block) * cfg.tokens_per_block * kv_token + recurrent
    out.update(free_after_load=free, kv_budget=budget, max_batch_that_fits=fit,
               tokens_in_kv_budget=budget // kv_token,
               fits=fit >= cfg.max_batch_size,
               full_batch_max_len=min(full_batch_len, cfg.max_seq_len),
               most_requests_at_once=budget // shortest)
    return out


def standin_memory(cfg, weights, kv_token: int, recurrent: int, act_total: int, gpu: int, backend: str) -> dict | None:
    """What a cpu or cuda engine allocates when it opens (engine/standin/engine.py), unlike TensorRT-LLM's budget: every
    rank in one process on one device, each rank its own paged KV pool and ``max_batch_size`` recurrent-state slots
    per linear-attention layer. The pool: ``num_kv_blocks`` blocks, else enough for ``max_batch_size`` requests of
    ``max_seq_len``, which a cuda engine cuts to what ``kv_cache_free_gpu_mem_fraction`` of the memory free once its
    weights and slots are in holds (as TensorRT-LLM sizes its pool; the free memory estimated here as the GPU less the
    weights, the slots and the reserve). The activations are allocated as steps run, from what the pool leaves, every
    rank's at once. For cuda: whether it all fits ``gpu`` bytes with a pool that holds one request at max_seq_len, the
    most ``num_kv_blocks`` that fit, and (a pool sized from free memory) the largest fraction that works. None without
    a weight map."""
    if weights is None:
        return None
    tp, tpb = cfg.tp_size, cfg.tokens_per_block
    every = pool_blocks(cfg.max_seq_len, tpb, cfg.max_batch_size)
    blocks = pool_blocks(cfg.max_seq_len, tpb, cfg.max_batch_size, cfg.num_kv_blocks)
    one = pool_blocks(cfg.max_seq_len, tpb, 1)            # the blocks of one request at max_seq_len
    block_bytes = tpb * kv_token * tp                     # one block index, in every rank's pool
    w = sum(r["total"] for r in weights)
    states = recurrent * cfg.max_batch_size * tp
    out = {"ranks_on_one_device": tp, "num_kv_blocks_set": bool(cfg.num_kv_blocks), "sized_from_free_memory": False,
           "weights": w, "state_slots": states, "device": "on the GPU" if backend == "cuda" else "in host memory",
           "fits": None, "num_kv_blocks_that_fit": None, "full_length_requests": None, "fraction_that_fits": None}
    if backend == "cuda":
        act = act_total * tp                               # every rank's activations, in one process at once
        free = max(0, gpu - w - states - RESERVE_BYTES)    # what the engine finds free when it sizes its pool
        room = max(0, free - act)
        if not cfg.num_kv_blocks:
            blocks = fit_pool_blocks(every, free, block_bytes, cfg.kv_cache_free_gpu_mem_fraction)
            out["sized_from_free_memory"] = True
            # the largest fraction (two decimals) whose pool leaves the activations their room, where it holds one
            # request at max_seq_len
            best = math.floor(100 * room / free) / 100 if free else 0.0
            if best > 0 and fit_pool_blocks(every, free, block_bytes, best) >= one:
                out["fraction_that_fits"] = best
        out["num_kv_blocks_that_fit"] = room // block_bytes
        out["fits"] = blocks >= one and blocks * block_bytes + act <= free
        out["full_length_requests"] = blocks // one
    out["one_request_blocks"] = one
    total = w + blocks * block_bytes + states
    out.update(num_kv_blocks=blocks, kv_pool=blocks * block_bytes, total=total)
    return out


# ------------------------------------------------------------------------------------------ disk
DISK_HEADROOM = 1.10
"""What the disk check asks for beyond the estimate: TensorRT engines carry the weights plus their kernels, and a
file system needs some room to breathe."""


def _disk_label(it: dict) -> str:
    """A disk line's words for an item of :func:`disk_needs`."""
    if "state" not in it:
        return " (reused)" if it["reused"] else ""
    if it["state"] == "reused" and not it["reused"]:     # --reconvert: counted in full
        return " (reused if the build's re-hash matches, else written: counted in full)"
    return CHECKPOINT_LABELS[it["state"]]


# what a kept checkpoint's state reads as on a disk line
CHECKPOINT_LABELS = {"reused": " (reused)", "replaced": " (replaced: --reconvert)",
                     "mismatch": " (does not match this build: the build will refuse without --reconvert)",
                     "unchecked": " (kept: not checked against config-only sources)", "written": ""}


def kept_checkpoint_state(p: Prepared, ckpt_dir, *, reconvert: bool = False) -> dict:
    """What the build will do with a kept checkpoint directory (``--checkpoint-dir``, or the TensorRT-LLM backend's
    ``OUTPUT.checkpoint``), decided as :func:`~dflash2_trt.engine.checkpoint.ensure_checkpoint` decides it:
    ``{"path", "state", "why"}``, ``state`` one of ``written`` (nothing there yet), ``reused`` (it matches),
    ``mismatch`` (it does not: the build refuses, naming ``why``, unless ``--reconvert``), ``replaced`` (it does not
    and ``reconvert``: converted again) or ``unchecked`` (a source is config-only: the dry run of a checkpoint not on
    this machine cannot tell; the build checks it against the weights it reads).

    Only the cheap checks of :func:`~dflash2_trt.engine.checkpoint.checkpoint_problems` run (the manifest's format,
    converter version, tp and dtype, the sources' config hashes, safetensors headers, sizes and modification times,
    the listed files' sizes, config.json), the same function without its re-hash of every file (``rehash=False``):
    the build re-hashes them (about 54 GB for Qwen3.8-27B) before it reuses the checkpoint, and refuses a file
    changed in place since."""
    ckpt = Path(ckpt_dir)
    try:
        exists = ckpt.is_dir() and any(ckpt.iterdir())
    except OSError:
        exists = False
    if not exists:
        return {"path": str(ckpt), "state": "written", "why": None}
    problems = checkpoint_problems(ckpt, p, rehash=False)
    if not problems:
        return {"path": str(ckpt), "state": "reused", "why": None}
    if problems[0].startswith("sources.") and not all(_has_weights(d) for d in (p.target_dir, p.drafter_dir)):
        return {"path": str(ckpt), "state": "unchecked", "why": problems[0]}
    return {"path": str(ckpt), "state": "replaced" if reconvert else "mismatch", "why": problems[0]}


def _has_weights(directory) -> bool:
    try:
        return bool(SafetensorsCheckpoint(directory).infos())
    except Exception:   # config-only (a published checkpoint's shipped configs), or unreadable
        return False


def kept_checkpoint_dir(backend: str, output, *, checkpoint_dir=None, keep_checkpoint: bool = True) -> Path | None:
    """The checkpoint directory a build keeps (and so may reuse): ``--checkpoint-dir``, else on the TensorRT-LLM
    backend ``OUTPUT.checkpoint`` unless ``--no-keep-checkpoint``; None where it converts afresh (inside a cpu or
    cuda engine, or into a temporary directory)."""
    if checkpoint_dir is not None:
        return Path(checkpoint_dir)
    if backend == "trtllm" and keep_checkpoint and output is not None:
        return default_checkpoint_dir(output)
    return None


def disk_needs(p: Prepared, *, backend: str, output, checkpoint_dir=None, keep_checkpoint: bool = True,
               reconvert: bool = False, baseline: bool = False, checkpoint_state: dict | None = None):
    """What ``build`` writes and on which file system, as ``[{"what", "path", "anchor", "bytes", "reused"}]`` (None for
    a family without a weight map). Every directory is written beside its final place first (an atomic rename), so
    ``anchor`` is the parent of the path. What is written: the converted checkpoint (every rank's tensors in the build
    dtype: the converter's plan); for the TensorRT-LLM backend the engines (they hold the same weights); for a cpu or
    cuda engine with ``--checkpoint-dir`` the checkpoint's files inside the engine, hard links (nothing) on the same
    file system, copies across. A kept checkpoint directory counts as :func:`kept_checkpoint_state` decides (its
    ``state`` on the item): reused (nothing) when it matches this build; in full when it is replaced, when it does not
    match (the build refuses it; ``--reconvert`` writes it again), when config-only sources leave it unchecked, and
    with ``reconvert`` also when it passes the checks a dry run makes (the build's re-hash may still find a file
    changed in place, and then writes it again). ``baseline``
    (``build --baseline``): the baseline engines too, the target's tensors again. ``checkpoint_state``: the kept
    directory's :func:`kept_checkpoint_state` where the caller has it already (its checks read every source's
    safetensors headers)."""
    w = weight_bytes_per_rank(p.t, p.d, p.cfg.tp_size, p.cfg.dtype)
    if w is None:
        return None
    total = sum(r["total"] for r in w)
    out = Path(output).absolute()
    kept_dir = kept_checkpoint_dir(backend, out, checkpoint_dir=checkpoint_dir, keep_checkpoint=keep_checkpoint)
    if kept_dir is not None:
        ckpt = kept_dir.absolute()
    elif backend == "trtllm":
        ckpt = out.parent / f".{out.name}.checkpoint-<temporary>"
    else:
        ckpt = out / "checkpoint"
    own = kept_dir is not None or backend == "trtllm"   # the checkpoint is a directory of its own (not in the engine)
    if kept_dir is None:
        state = "written"
    else:
        state = (checkpoint_state or kept_checkpoint_state(p, ckpt, reconvert=reconvert))["state"]
    # with --reconvert a checkpoint that passes the cheap checks may still fail the build's re-hash (a file changed in
    # place) and be written again: counted in full, as before the dry run looked at it (the session's reviewer)
    items = [{"what": "checkpoint", "path": str(ckpt), "anchor": str(ckpt.parent if own else out.parent),
              "bytes": total, "reused": state == "reused" and not reconvert, "state": state}]
    if backend == "trtllm":
        items.append({"what": "engines", "path": str(out), "anchor": str(out.parent), "bytes": total, "reused": False})
        if baseline:
            items.append({"what": "baseline engines", "path": str(out / "baseline"), "anchor": str(out.parent),
                          "bytes": sum(r["target"] for r in w), "reused": False})
    elif checkpoint_dir is not None:
        same = _device(ckpt.parent) == _device(out.parent)
        items.append({"what": "checkpoint files in the engine" + (" (hard links)" if same else " (copies)"),
                      "path": str(out / "checkpoint"), "anchor": str(out.parent), "bytes": total, "reused": same})
    return items


def _existing_anchor(path) -> Path:
    """The nearest existing directory at or above ``path`` (where its file system is)."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _device(path):
    """The file system of ``path`` (its nearest existing ancestor's), or None when it cannot be stat'ed."""
    import os

    try:
        return os.stat(_existing_anchor(path)).st_dev
    except OSError:
        return None


def disk_report(items, *, usage=None) -> list[dict]:
    """Per file system the build writes to: ``{"anchor", "need", "free", "items", "fits"}`` (``need`` with
    :data:`DISK_HEADROOM`; reused items count nothing). A file system that cannot be measured has ``free`` None
    and is taken to fit: a check that cannot measure never blocks a build."""
    import shutil

    usage = usage or shutil.disk_usage
    groups: dict = {}
    for it in items or ():
        try:
            anchor = _existing_anchor(it["anchor"])
        except OSError:
            anchor = Path(it["anchor"])
        key = _device(anchor) or str(anchor)
        g = groups.setdefault(key, {"anchor": str(anchor), "items": [], "bytes": 0})
        g["items"].append(it)
        g["bytes"] += 0 if it["reused"] else it["bytes"]
    out = []
    for g in groups.values():
        need = int(g["bytes"] * DISK_HEADROOM)
        try:
            free = int(usage(g["anchor"]).free)
        except OSError:
            free = None
        fits = free is None or need <= free
        out.append({"anchor": g["anchor"], "need": need, "free": free, "items": g["items"], "fits": fits,
                    **({} if fits else {"unwritable": _unwritable(g["anchor"])})})
    return out


def _unwritable(anchor: str) -> str | None:
    """Why nothing can be written in ``anchor`` (a place that shows no free space: /proc, a read-only mount), or None
    where it can, or where it is merely full (ENOSPC, EDQUOT: the free-space message is the one that applies)."""
    import errno

    try:
        tempfile.TemporaryDirectory(prefix=".dflash2-probe-", dir=anchor).cleanup()
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return None
        return exc.strerror or str(exc)
    return None


def check_disk(p: Prepared, *, backend: str, output, checkpoint_dir=None, keep_checkpoint: bool = True,
               reconvert: bool = False, usage=None, baseline: bool = False) -> None:
    """One line before anything is converted when a file system the build writes to has too little room (the
    conversion and trtllm-build of a published target write tens of GB each, and running out hours in is the
    failure this prevents); ``build --no-disk-check`` skips it."""
    for g in disk_report(disk_needs(p, backend=backend, output=output, checkpoint_dir=checkpoint_dir,
                                    keep_checkpoint=keep_checkpoint, reconvert=reconvert, baseline=baseline),
                            usage=usage):
        if g["fits"]:
            continue
        written = [it for it in g["items"] if not it["reused"]]
        parts = "; ".join(f"{it['what']} {_gib(it['bytes'])} at {it['path']}" for it in written)
        only_ckpt = all(it["what"] == "checkpoint" for it in written)
        field = "--checkpoint-dir" if only_ckpt and checkpoint_dir else "--output"
        if g.get("unwritable"):   # reads as 0 B free (/proc, a read-only mount): said as such, not "free space"
            raise ConfigError(f"cannot write in {g['anchor']}: {g['unwritable']}", field=field)
        # a cpu or cuda engine holds its checkpoint's files itself: another disk for --checkpoint-dir would only
        # move a copy of them
        advice = ("free space there, put the checkpoint on another disk with --checkpoint-dir, or pass "
                  "--no-disk-check" if backend == "trtllm" and not only_ckpt else
                  "free space there, or pass --no-disk-check")
        raise ConfigError(f"the build needs about {_gib(g['need'])} free on the file system of {g['anchor']} "
                          f"({parts}; {DISK_HEADROOM - 1:.0%} headroom), {_gib(g['free'])} is available: {advice}",
                          field=field)


# ------------------------------------------------------------------------------------------ plan
def make_plan(p: Prepared, *, backend: str, output: str | None, checkpoint_dir: str | None = None,
              gpu_memory_gib: float = H200_GIB, toolchain=None, keep_checkpoint: bool = True,
              verify: bool | None = None, baseline: bool = False, reconvert: bool = False) -> dict:
    """The steps of ``build`` for ``backend`` with every path and command spelled out, the sizing,
    and what is supported for the target today (``baseline``: ``build --baseline``'s second trtllm-build too).
    A kept checkpoint directory that exists is checked as the build checks it, but for the content re-hash
    (:func:`kept_checkpoint_state`; ``reconvert``: ``build --reconvert``): the plan's ``checkpoint``."""
    cfg, t, d = p.cfg, p.t, p.d
    if not (gpu_memory_gib > 0 and math.isfinite(gpu_memory_gib)):
        raise ConfigError(f"must be a positive number, got {gpu_memory_gib}", field="--gpu-memory-gib")
    out = Path(output) if output else Path("ENGINE_DIR")
    size = sizing(p, gpu_memory_gib, backend)
    ckpt = Path(checkpoint_dir) if checkpoint_dir else default_checkpoint_dir(out)
    # what the build does with the checkpoint: a kept directory checked as the build checks it; without --output the
    # TensorRT-LLM backend's OUTPUT.checkpoint is a placeholder, nothing there to check ("unknown")
    kept = kept_checkpoint_dir(backend, output, checkpoint_dir=checkpoint_dir, keep_checkpoint=keep_checkpoint)
    if kept is not None:
        ck_state = kept_checkpoint_state(p, kept, reconvert=reconvert)
    elif backend == "trtllm":
        ck_state = ({"path": str(ckpt), "state": "unknown", "why": None} if keep_checkpoint else
                    {"path": None, "state": "written", "why": "a temporary directory (--no-keep-checkpoint)"})
    else:
        ck_state = {"path": str(out / "checkpoint"), "state": "written", "why": None}
    plugin_lib = "$DFLASH2_TRT_CACHE/plugins-trt/<sha256 of plugins/ + flags>/libdflash2_plugins.so"
    steps = [{"step": "validate", "what": f"configs, pairing and settings ({cfg.source})"}]
    command = bench = base_command = None
    if backend == "trtllm":
        if not keep_checkpoint and not checkpoint_dir:
            convert = (f"checkpoint into a temporary directory beside {out}, removed after the build "
                       f"(--no-keep-checkpoint)")
        else:
            convert = f"checkpoint at {ckpt}: {_checkpoint_words(ck_state, cfg, reconvert)}"
        steps.append({"step": "convert", "what": convert})
        archs = cuda_archs(cfg.gpus)
        if toolchain is not None and toolchain.gpu_sm:
            archs = toolchain.gpu_sm.removeprefix("sm_")
        steps.append({"step": "plugins", "what": "libdflash2_plugins.so with CMake, cached by source hash: "
                      + shell_line(["cmake", "-S", str(plugin_dir()), "-B", "<tmp>", "-DCMAKE_BUILD_TYPE=Release",
                                    f"-DCMAKE_CUDA_ARCHITECTURES={archs}", "-DTensorRT_INCLUDE_DIR=<TensorRT>/include"])
                      + " && cmake --build <tmp> --target dflash2_plugins"})
        py = toolchain.python if toolchain is not None else None   # TensorRT-LLM's interpreter (--trtllm-python)
        argv = trtllm_build_argv(cfg, checkpoint_dir=out / "build-checkpoint", output_dir=out, python=py)
        env = trtllm_build_env(plugin_lib, p.xqa["env"])
        command = {"argv": argv, "env": env, "line": shell_line(argv, env)}
        if baseline:
            bargv = trtllm_build_argv(cfg, checkpoint_dir=out / "baseline-checkpoint", output_dir=out / "baseline",
                                      target_only=True, python=py)
            base_command = {"argv": bargv, "env": env, "line": shell_line(bargv, env)}
        steps.append({"step": "engine", "what": f"{out}/build-checkpoint: the checkpoint's config.json with the EAGLE "
                                                 f"fields and dflash2_engine, rank files linked; then trtllm-build "
                                                 f"(log kept as {out}/trtllm-build.log); rank engines, config.json, "
                                                 f"the plugin library, engine.json and RUN.md in {out}; "
                                                 f"{out}/trtllm-bench/: the --model_path folder (tokenizer, config, "
                                                 f"placeholder safetensors), {OPTIONS_FILE} and {SAMPLER_FILE} "
                                                 f"(greedy)"})
        bench = planned_command(engine_dir=out, target_key=p.target_key, draft_len=p.K,
                                max_batch_size=cfg.max_batch_size, eos_id=(list(t.eos_token_ids) or [None])[0],
                                kv_cache_fraction=cfg.kv_cache_free_gpu_mem_fraction, python=py)
    else:
        linked = (f", linked from {checkpoint_dir}: {_checkpoint_words(ck_state, cfg, reconvert)}" if checkpoint_dir
                  else "")
        steps.append({"step": "convert", "what": f"checkpoint into {out}/checkpoint{linked}"})
        if backend == "cuda":
            steps.append({"step": "plugins", "what": "the plugins' CUDA kernels with nvcc for the visible GPU "
                                                     "(libdf2_cuda_sm<arch>.so in $DFLASH2_TRT_CACHE/plugins-cuda/"
                                                     "<sha256>/, built on first use and cached by source hash)"})
        where = "on the GPU (torch stand-in + the plugins' CUDA kernels; not a TensorRT engine)" \
            if backend == "cuda" else "on the CPU stand-in"
        steps.append({"step": "engine", "what": f"{out}/config.json (engine config) and engine.json (manifest); the "
                                                 f"network runs {where} at load time"})
    steps.append({"step": "verify", "what": "fixed prompts through the engine vs the target's own greedy decoding "
                                            "(transformers); any token difference fails the build"
                                            + ("" if verify is None else (" [on]" if verify else " [off]"))})
    if backend == "trtllm" and baseline:   # after verify, as the build runs it: a failing engine costs no baseline
        steps.append({"step": "baseline", "what": f"{out}/baseline-checkpoint: the same config marked "
                                                   f"target_only (max_draft_len 0), the same rank files; then "
                                                   f"trtllm-build of TargetOnlyForCausalLM without a speculative "
                                                   f"decoding mode (log {out}/baseline/trtllm-build.log): the "
                                                   f"target alone in {out}/baseline/, `bench run`'s "
                                                   f"autoregressive baseline on the project runtime (if it fails, "
                                                   f"the combined engine is kept without baseline/ and the build "
                                                   f"exits 1)"})
    supported = {"stages": [], "cpu_engine": False, "trtllm_engine": False, "verified": None}
    if p.target_key is not None:
        supported["stages"] = list(get_target(p.target_key).supported)
        supported["verified"] = status_of(get_target(p.target_key))   # README's status row
    engine_config = engine_pretrained_config(p.checkpoint_config, cfg, d) if p.checkpoint_config else None
    trtllm_blockers = list(p.trtllm_blockers)
    warnings = list(p.warnings)
    if backend == "trtllm":   # Blackwell: no attention kernel for a TensorRT engine's speculative steps (windows.py)
        warnings += p.xqa["warnings"]   # and on Hopper, a layer only the JIT XQA kernel takes (xqa.py)
        gpu_sm = toolchain.gpu_sm if toolchain is not None else None
        if (sm100 := sm100_refusal(gpu_sm)) is not None:
            trtllm_blockers.append(sm100)
        elif not gpu_sm and any(is_sm100_family(g) for g in cfg.gpus):
            warnings.append(f"{sm100_note()}: the build refuses a Blackwell GPU (--backend cuda there)")
    path = None
    if backend == "trtllm" and engine_config is not None and not p.blockers:
        path = runtime_path(engine_config)
    supported["cpu_engine"] = not p.blockers
    supported["trtllm_engine"] = not p.blockers and not trtllm_blockers
    return {
        "target": p.target_key, "family": t.family, "backend": backend, "output": str(out),
        "drafter_dir": str(p.drafter_dir), "target_dir": str(p.target_dir),
        "settings": {**cfg.to_dict(), "max_draft_len": p.K, "source": cfg.source,
                     # what auto became (the network reads the resolved value: engine_config.dflash2_engine)
                     "sliding_path_resolved": ((engine_config or {}).get("dflash2_engine") or {}).get("sliding_path")},
        "eagle_choices": eagle_choices(p.K), "steps": steps, "trtllm_build": command, "trtllm_bench": bench,
        "baseline_trtllm_build": base_command,
        "sizing": size,
        "checkpoint": ck_state,
        "disk": (None if output is None else disk_report(disk_needs(p, backend=backend, output=out,
                                                                    checkpoint_dir=checkpoint_dir,
                                                                    keep_checkpoint=keep_checkpoint,
                                                                    reconvert=reconvert, baseline=baseline,
                                                                    checkpoint_state=ck_state if kept else None))),
        "supported": supported, "blockers": list(p.blockers), "trtllm_blockers": trtllm_blockers,
        # which runtime will drive the TensorRT engine, and why (engine/trtllm/paths.py)
        "runtime_path": path,
        "warnings": warnings,
        # the build checkpoint's config.json, exactly as trtllm-build receives it (engine step), and what the
        # runtime will count in it
        "engine_config": engine_config, "runtime": runtime_reading(engine_config, cfg),
    }


def _checkpoint_words(state: dict, cfg, reconvert: bool = False) -> str:
    """The convert step's words for a kept checkpoint directory (:func:`kept_checkpoint_state`; ``unknown``: no
    --output, so OUTPUT.checkpoint is not a directory the dry run can look at)."""
    cheap = (f"its manifest matches this build: format, converter version, tp {cfg.tp_size}, {cfg.dtype}, the "
             f"sources' configs, safetensors headers, sizes and modification times, the files' sizes and config.json; "
             f"the build also re-hashes every file before reusing it, a dry run does not: one changed in place since "
             f"it was written is refused, or replaced with --reconvert"
             + ("; --reconvert replaces only a checkpoint that does not match" if reconvert else "") + ")")
    return {"unknown": f"reused when its manifest.json matches the sources, tp {cfg.tp_size} and {cfg.dtype} (and "
                       f"every file's sha256), refused without --reconvert when it does not, else written (give "
                       f"--output for the dry run to check the one there)",
            "written": "written (nothing there yet)",
            "reused": f"reused ({cheap}",
            "mismatch": f"exists and does NOT match this build: {state['why']}: the build will refuse; pass "
                        f"--reconvert to replace it, or another --checkpoint-dir",
            "replaced": f"exists and does not match this build ({state['why']}): replaced (--reconvert)",
            "unchecked": f"exists, not checked: the sources here are config-only ({state['why']}); the build "
                         f"reuses it when it matches the weights it reads, else refuses it without --reconvert",
            }[state["state"]]


def _gib(n) -> str:
    """Bytes in the largest binary unit that keeps the number >= 1 (GiB at most)."""
    if n is None:
        return "n/a"
    for unit, scale in (("GiB", GIB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            return f"{n / scale:,.2f} {unit}"
    return f"{n:,} B"


def _render_standin(m: dict | None, s: dict, backend: str, gpu_gib: float) -> list[str]:
    """The lines of :func:`standin_memory`: what a cpu or cuda engine allocates (the budget above is TensorRT-LLM's)."""
    if m is None:
        return []
    ranks = f"its {m['ranks_on_one_device']} ranks in one process" if m["ranks_on_one_device"] > 1 else "one process"
    every = f"max_batch_size {s['max_batch_size']} x max_seq_len {s['max_seq_len']}"
    if m["num_kv_blocks_set"]:
        pool = "--set num_kv_blocks"
    elif m["sized_from_free_memory"]:
        pool = (f"kv_cache_free_gpu_mem_fraction {s['kv_cache_free_gpu_mem_fraction']:g} of the memory free once the "
                f"weights and state slots are in, at most enough for {every}, as TensorRT-LLM sizes its pool")
    else:
        pool = f"enough for {every}"
    lines = [f"the {backend} engine allocates ({ranks}, {m['device']}; not TensorRT-LLM's budget above): "
             f"weights {_gib(m['weights'])} + KV pool {_gib(m['kv_pool'])} ({m['num_kv_blocks']:,} blocks: {pool}) + "
             f"recurrent state slots {_gib(m['state_slots'])} = {_gib(m['total'])}"]
    n, full = m["num_kv_blocks_that_fit"], m["full_length_requests"]
    at_once = ("" if full is None else f"; {full:,} requests at max_seq_len at once"
               + (f" (the others of max_batch_size {s['max_batch_size']} wait for blocks)"
                  if 0 < full < s["max_batch_size"] else ""))
    if m["fits"] is True:
        lines.append(f"  fits the GPU's {gpu_gib:g} GiB with the activations and reserve above{at_once}")
    elif m["fits"] is False:
        one, blocks, tpb = m["one_request_blocks"], m["num_kv_blocks"], s["tokens_per_block"]
        short = blocks < one
        slots = "--max-batch-size (its state slots), " if m["state_slots"] else ""
        if m["weights"] + m["state_slots"] + RESERVE_BYTES > gpu_gib * GIB:
            fix = ("the weights and state slots alone do not fit (every rank on this one GPU: --tp-size does not "
                   "help): a GPU with more memory" + (", or --dtype bfloat16" if s["dtype"] == "float32" else "")
                   + (", or a lower --max-batch-size (its state slots)" if m["state_slots"] else ""))
        elif m["sized_from_free_memory"] and m["fraction_that_fits"] is not None:
            why = ("holds no request at max_seq_len" if short else "leaves too little for the activations")
            fix = (f"the pool at {s['kv_cache_free_gpu_mem_fraction']:g} {why}: --set kv_cache_free_gpu_mem_fraction="
                   f"{m['fraction_that_fits']:g} fits, or lower {slots.replace(', ', ' or ')}--max-num-tokens")
        elif n >= one and (m["sized_from_free_memory"] or not short):
            fix = (f"--set num_kv_blocks={n} fits (requests then wait for blocks), or lower {slots}--max-num-tokens "
                   f"or --max-seq-len")
        elif n < one:
            fix = (f"not one request at max_seq_len ({one:,} blocks) fits beside the weights, the state slots and "
                   f"the activations: lower {slots}--max-num-tokens (most of the activations' estimate) or "
                   f"--max-seq-len, or use a GPU with more memory")
        else:   # a --set num_kv_blocks pool that fits the GPU but holds no request at max_seq_len
            lines.append(f"  holds NO request at max_seq_len: num_kv_blocks {blocks:,} is {blocks * tpb:,} tokens, and "
                         f"a request longer than that is refused (max_seq_len {s['max_seq_len']:,} needs {one:,} "
                         f"blocks); --set num_kv_blocks={n} fits the GPU's {gpu_gib:g} GiB")
            return lines
        lines.append(f"  does NOT fit the GPU's {gpu_gib:g} GiB with the activations and reserve above: {fix}")
    return lines


def render_plan(plan: dict) -> str:
    s, z = plan["settings"], plan["sizing"]
    lines = [f"plan: build {plan['target'] or plan['target_dir']} ({plan['family']}) -> {plan['output']} "
             f"[{plan['backend']} backend]",
             f"settings ({s['source']}): block {s['block_size']} (max_draft_len {s['max_draft_len']}), tp "
             f"{s['tp_size']}, {s['dtype']}, max batch {s['max_batch_size']}, max input {s['max_input_len']}, max "
             f"seq {s['max_seq_len']}, max tokens {s['max_num_tokens']}, {s['tokens_per_block']} tokens/block, "
             f"selector {s['selector']}, drafter window {s['drafter_window']}, sliding path "
             f"{s.get('sliding_path_resolved') or s.get('sliding_path', 'auto')}, KV fraction "
             f"{s['kv_cache_free_gpu_mem_fraction']}, gpus {','.join(s['gpus'])}",
             "steps:"]
    for i, st in enumerate(plan["steps"], 1):
        lines.append(f"  {i}. {st['step']}: {st['what']}")
    if plan["trtllm_build"]:
        lines.append("trtllm-build command:")
        lines.append("  " + plan["trtllm_build"]["line"])
        lines.append(f"eagle_choices (every request/executor): {json.dumps(plan['eagle_choices'])}")
    if plan.get("baseline_trtllm_build"):
        lines.append("baseline trtllm-build command (--baseline: the target alone):")
        lines.append("  " + plan["baseline_trtllm_build"]["line"])
    if plan.get("trtllm_bench"):
        if (plan.get("runtime_path") or {}).get("path") == "project":   # the C++ executor does not take this engine
            lines.append("trtllm-bench command (the C++ executor's, which this engine's runtime path below does not "
                         "take: `bench run` measures it on the project runtime instead):")
        else:
            lines.append("trtllm-bench command (after the build; DATASET.jsonl from `dflash2-trt bench "
                         "prepare-dataset --engine-dir ENGINE_DIR ...`; `bench run` runs it per concurrency):")
        lines.append("  " + plan["trtllm_bench"]["line"])
    rt = plan.get("runtime")
    if rt and "error" in rt:
        lines.append(f"TensorRT-LLM runtime reading of the engine config: REFUSED: {rt['error']}")
    elif rt:
        line = (f"TensorRT-LLM runtime reading of the engine config (gptJsonConfig.cpp rule): {rt['layers']} layers "
                f"({rt['target_layers']} target + {rt['eagle_net_layers']} EAGLE-net): {rt['attention_layers']} "
                f"attention (KV pool) / {rt['recurrent_layers']} recurrent (state)")
        if rt["rnn"]:
            line += (f"; variant {rt['variant']} (with the runtime patch's R1); RNN fields per rank: "
                     + ", ".join(f"{k} {v}" for k, v in rt["rnn"].items()))
        lines.append(line)
    path = plan.get("runtime_path")
    if path:
        lines.append(f"runtime path: {path['path']}: {path['description']}")
        lines += [f"  why: {w}" for w in path["why"]] + [f"  limit: {w}" for w in path["limits"]]
    for f in (rt or {}).get("config_fixes") or []:
        lines.append(f"the build will set {f['field']} {f['from']!r} -> {f['to']!r} in trtllm-build's config.json "
                     f"({f['why']})")
    lines.append(f"sizing per rank (tp {z['tp_size']}, {z['dtype']}, GPU {z['gpu_memory_gib']:g} GiB):")
    w = z["weights_per_rank"]
    if w is None:
        lines.append("  weights: unknown (no weight map for this family)")
    else:
        lines.append(f"  weights: {_gib(w[0]['total'])} ({w[0]['total']:,} B: target {_gib(w[0]['target'])}, "
                     f"drafter {_gib(w[0]['drafter'])})")
    kv = z["kv"]
    lines.append(f"  KV cache per token: {kv['bytes_per_token']:,} B ({kv['pool_layers']['target']} target + "
                 f"{kv['pool_layers']['drafter']} drafter layers x 2 x {kv['kv_heads_per_rank']} heads x "
                 f"{kv['head_size']} x {ITEMSIZE[z['dtype']]} B; target {kv['bytes_per_token_target']:,} B, "
                 f"drafter {kv['bytes_per_token_drafter']:,} B)")
    lines.append(f"  extra slots per request: {z['extra_slots_per_request']} (engine max_seq_len "
                 f"{z['engine_max_seq_len']}, {z['blocks_per_request']} blocks)")
    lines.append(f"  KV cache per request at max_seq_len: {_gib(z['kv_bytes_per_request'])}")
    if z["recurrent_state_bytes_per_request"]:
        lines.append(f"  recurrent state per request: {_gib(z['recurrent_state_bytes_per_request'])}")
    a = z["activations_estimate"]
    lines.append(f"  activations (estimate): {_gib(a['total'])} (logits {_gib(a['logits'])}, MLP {_gib(a['mlp'])}, "
                 f"taps {_gib(a['taps'])}); reserve (estimate) {_gib(z['reserve_estimate'])}")
    if z["kv_budget"] is not None and z["free_after_load"] < 0:
        lines.append(f"  KV budget: none: the weights, activations and reserve alone need "
                     f"{_gib(-z['free_after_load'])} more than the GPU's memory: the engine would not load on such "
                     f"a GPU (raise --tp-size, or plan another GPU with --gpu-memory-gib)")
    elif z["kv_budget"] is not None:
        lines.append(f"  KV budget: {_gib(z['kv_budget'])} ({z['kv_cache_free_gpu_mem_fraction']} of "
                     f"{_gib(z['free_after_load'])} free after load); {z['tokens_in_kv_budget']:,} tokens")
        if z["fits"]:
            lines.append(f"  largest batch at max_seq_len: {z['max_batch_that_fits']} (max_batch_size "
                         f"{s['max_batch_size']} fits)")
        elif z["max_batch_that_fits"] == 0:
            lines.append(f"  largest batch at max_seq_len: 0 (not one request of max_seq_len {s['max_seq_len']} "
                         f"fits the KV budget: lower --max-seq-len or raise --tp-size)")
        elif z["full_batch_max_len"] < 2:
            lines.append(f"  largest batch at max_seq_len: {z['max_batch_that_fits']} (max_batch_size "
                         f"{s['max_batch_size']} does NOT fit at any length: at most "
                         f"{min(z['most_requests_at_once'], s['max_batch_size'])} requests run at once, however short; "
                         f"the rest wait for KV blocks: lower --max-batch-size)")
        else:
            lines.append(f"  largest batch at max_seq_len: {z['max_batch_that_fits']} (max_batch_size "
                         f"{s['max_batch_size']} does NOT fit at that length: a request starts only with KV blocks "
                         f"for its whole length, so longer ones wait, none is refused; all {s['max_batch_size']} "
                         f"run at once up to {z['full_batch_max_len']:,} tokens each)")
    lines += _render_standin(z.get("standin"), s, plan["backend"], z["gpu_memory_gib"])
    for g in plan.get("disk") or ():
        what = ", ".join(f"{it['what']} {_gib(it['bytes'])}"
                         f"{_disk_label(it)}"
                         f" at {it['path']}" for it in g["items"])
        free = "free space unknown" if g["free"] is None else f"{_gib(g['free'])} free"
        verdict = "" if g["fits"] else (f" -- CANNOT WRITE THERE ({g['unwritable']}): the build will refuse"
                                        if g.get("unwritable") else " -- NOT ENOUGH: the build will refuse")
        lines.append(f"disk: {what}: needs {_gib(g['need'])} with headroom on the file system of {g['anchor']}, "
                     f"{free}{verdict}")
    sup = plan["supported"]
    lines.append(f"supported today: stages {', '.join(sup['stages']) or '(unregistered target)'}; CPU engine "
                 f"{'yes' if sup['cpu_engine'] else 'no'}; TensorRT-LLM engine "
                 f"{'buildable (not yet built or run on a GPU by this project)' if sup['trtllm_engine'] else 'no'}")
    if sup.get("verified"):
        lines.append("  verified: " + "; ".join(f"{k}: {v}" for k, v in sup["verified"].items())
                     + " (`dflash2-trt targets` says what the words mean)")
    for b in plan["blockers"] + plan["trtllm_blockers"]:
        lines.append(f"  blocked: {b}")
    for wn in plan["warnings"]:
        lines.append(f"  warning: {wn}")
    m = plan.get("machine")
    if m is not None:
        have = (f"TensorRT-LLM {m['tensorrt_llm']}" if m["tensorrt_llm"] else "no TensorRT-LLM") + \
            (f" in {m['python']} (transformers {m.get('transformers')})" if m.get("python") else "") + ", " + \
            (f"GPU {m['gpu_name']} ({m['gpu_sm']})" if m["gpu_sm"] else "no GPU")
        lines.append(f"this machine: {have}" + (f"; missing for the {plan['backend']} build: "
                                                 f"{'; '.join(m['missing'])}" if m["missing"] else ""))
    return "\n".join(lines)


def cuda_backend_missing() -> list[str]:
    """What this machine lacks for ``build --backend cuda`` (a GPU torch sees, nvcc)."""
    missing = [] if cuda_available() else ["a CUDA GPU visible to torch (and a CUDA build of torch)"]
    try:
        nvcc_path()
    except MissingDependencyError:
        missing.append("nvcc (the CUDA toolkit: the plugins' kernels are compiled on first use)")
    return missing


def check_checkpoint_options(backend: str, *, keep_checkpoint: bool, reconvert: bool, checkpoint_dir) -> None:
    """The checkpoint options a cpu or cuda build has no use for, refused rather than ignored: its converted
    checkpoint lives inside the engine unless ``--checkpoint-dir`` keeps it outside, so there is no temporary
    checkpoint for ``--no-keep-checkpoint`` to remove and no kept one for ``--reconvert`` to replace."""
    if backend == "trtllm":
        return
    if not keep_checkpoint:
        raise ConfigError(f"applies to --backend trtllm (a {backend} engine holds its converted checkpoint inside "
                          f"it; nothing is left outside to remove)", field="--no-keep-checkpoint")
    if reconvert and checkpoint_dir is None:
        raise ConfigError(f"needs --checkpoint-dir on a {backend} build (its checkpoint is otherwise inside the new "
                          f"engine, converted afresh)", field="--reconvert")


def verify_default(p: Prepared, backend: str) -> bool:
    """The verify gate's default: on for small targets (the reference decodes on this machine through
    transformers), and on the TensorRT-LLM backend only at tp 1 (its runner needs one MPI rank per GPU)."""

    w = weight_bytes_per_rank(p.t, p.d, p.cfg.tp_size, p.cfg.dtype)
    small = w is not None and sum(r["target"] for r in w) <= AUTO_MAX_TARGET_BYTES
    return small and (backend in ("cpu", "cuda") or p.cfg.tp_size == 1)


def planned_backend(backend: str) -> str:
    """The backend ``build --dry-run --backend BACKEND`` plans: a named one as named; ``auto`` as the build resolves
    it (:func:`dflash2_trt.trtllm.backend.resolve`: ``$DFLASH2_TRT_BACKEND`` first, an unknown value refused in the
    same words), except where the variable leaves the choice to the auto rule (unset, or ``auto``): there the dry run
    plans the TensorRT-LLM build, sizing a GPU being what it is for, on any machine."""
    if backend != "auto":
        return backend
    if os.environ.get("DFLASH2_TRT_BACKEND", "auto") == "auto":
        return "trtllm"
    return resolve(None)


def dry_run_plan(drafter_dir, target_dir, *, output=None, backend: str = "auto", target_key=None, overrides=None,
                 sets=None, gpu_memory_gib: float = H200_GIB, checkpoint_dir=None, keep_checkpoint: bool = True,
                 verify=None, toolchain=None, baseline: bool = False, reconvert: bool = False) -> dict:
    """``build --dry-run``: the plan for ``backend`` (``auto``: :func:`planned_backend`) plus what this machine has
    and lacks for it. What the build would refuse with these settings is refused in the build's words: ``--baseline``
    or a checkpoint option the backend has no use for, and a ``num_kv_blocks`` pool too small for the verify gate's
    requests (:func:`~dflash2_trt.engine.verify.planned_check_pool`, cpu and cuda with the gate on); a kept checkpoint
    that does not match is the convert step's and ``checkpoint``'s (:func:`kept_checkpoint_state`)."""

    p = prepare(drafter_dir, target_dir, target_key=target_key, overrides=overrides, sets=sets)
    be = planned_backend(backend)
    if baseline and be != "trtllm":      # the build's own refusal (engine/build.py check_baseline_backend)
        raise ConfigError(f"applies to --backend trtllm (a {be} engine's `bench run` builds the target-only baseline "
                          f"from the engine's own checkpoint)", field="--baseline")
    check_checkpoint_options(be, keep_checkpoint=keep_checkpoint, reconvert=reconvert, checkpoint_dir=checkpoint_dir)
    v = verify_default(p, be) if verify is None else bool(verify)
    if v and be in ("cpu", "cuda") and not p.blockers:   # the stand-in build's own check, before it converts
        planned_check_pool(p.target_key, p.t.vocab_size, p.cfg, p.K)   # (engine/standin/build.py)
    tc = toolchain if toolchain is not None else probe_toolchain()
    plan = make_plan(p, backend=be, output=output, checkpoint_dir=checkpoint_dir, gpu_memory_gib=gpu_memory_gib,
                     toolchain=tc, keep_checkpoint=keep_checkpoint, verify=v, baseline=baseline and be == "trtllm",
                     reconvert=reconvert)
    missing = []
    if be == "trtllm":
        env_missing, env_warnings = environment_problems(tc)
        missing += env_missing
        plan["warnings"] += env_warnings
        if tc.tensorrt_llm is None:
            # TensorRT-LLM 1.2 pins transformers 4.57, this project 5.x: it lives in an environment of its own, named
            # by --trtllm-python (README), not installed here
            missing.append(f"tensorrt_llm (TensorRT-LLM 1.2.x){f' in {tc.python}' if tc.python else ''}"
                           + ("" if tc.python else ": install it in an environment of its own and pass its Python "
                                                   "(--trtllm-python PY or $DFLASH2_TRTLLM_PYTHON; README)"))
        elif (wrong := trtllm_version_refusal(tc.tensorrt_llm)) is not None:
            missing.append(wrong)
        if tc.trtllm_build is None:
            missing.append("trtllm-build")
        missing += plugin_toolchain_missing(tc)
        if tc.gpu_sm is None:
            missing.append("a CUDA GPU")
    elif be == "cuda":
        missing += cuda_backend_missing()
    plan["machine"] = {**tc.to_dict(), "missing": missing}
    plan["verify"] = v
    return plan
