"""The engine's ``pretrained_config``, written the same way by both backends: the converted checkpoint's
``config.json`` with the build's settings (the block size and ``dflash2_engine``, which the network reads) and
the EAGLE fields TensorRT-LLM's runtime reads; for a hybrid target also the runtime's layer types and RNN fields.

The CPU backend puts it in the engine's ``config.json``; the TensorRT-LLM backend gives it to trtllm-build as
the build checkpoint's ``config.json``; the dry run (:mod:`.plan`) shows it and sizes the KV pool with
:func:`drafter_pool_layers_per_layer`.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

from ..errors import ConfigError


def engine_pretrained_config(ck: dict, cfg, d) -> dict:
    """The checkpoint's config.json with the engine's settings: what the network reads (``dflash2_engine``,
    the block size) and the EAGLE fields TensorRT-LLM's runtime reads (``num_eagle_layers``,
    ``max_non_leaves_per_layer``, ``eagle_net_config.num_hidden_layers``: docs/TRTLLM-ENGINE.md §1). A copy:
    the reusable checkpoint's own config.json is never edited."""
    pre = json.loads(json.dumps(ck))
    K = cfg.block_size - 1
    pre["dflash2"]["block_size"] = cfg.block_size
    pre["max_draft_len"] = K
    pre["num_eagle_layers"] = K                        # tree depth; a chain of K
    pre["max_non_leaves_per_layer"] = 1
    # added to the KV pool's layer count: the drafter's pool layers (x its KV split, drafter_kv_split in trtllm/network/kv_layout.py)
    pre["eagle_net_config"] = {"num_hidden_layers": d.num_hidden_layers * drafter_pool_layers_per_layer(
        p_t(ck), d, cfg.tp_size)}
    # sliding_path resolved (context / generation): the network gives the target's sliding layers the second set of
    # request inputs on the context route (trtllm/network/io.py sliding_inputs)
    pre["dflash2_engine"] = {"selector": cfg.selector, "drafter_window": cfg.drafter_window,
                             "max_seq_len": cfg.max_seq_len, "tokens_per_block": cfg.tokens_per_block,
                             "sliding_path": resolve_sliding_path(ck, cfg)}
    if "linear_attention" in pre["layer_types"]:
        # TensorRT-LLM's runtime (gptJsonConfig.cpp, engine/trtllm/runtime_rules.py) reads layer_types in its own names,
        # one per layer of num_hidden_layers + eagle_net_config.num_hidden_layers (a shorter list repeats
        # cyclically): the drafter's pool layers are attention. The network reads the HF kinds from hf_layer_types
        # (trtllm/network/kv_layout.py hf_layer_types).
        pre["hf_layer_types"] = list(pre["layer_types"])
        pre["layer_types"] = (["recurrent" if t == "linear_attention" else "attention" for t in pre["layer_types"]]
                              + ["attention"] * pre["eagle_net_config"]["num_hidden_layers"])
        pre.update(rnn_fields(pre))
    return pre


def target_sliding_layers(layer_types, sliding_window) -> bool:
    """The target has sliding-window attention layers (HF layer kinds)."""
    return bool(sliding_window) and "sliding_attention" in list(layer_types or ())


def window_can_bind(window: int, max_seq_len: int, K: int) -> bool:
    """A query and a key of an engine of ``max_seq_len`` with ``K`` draft tokens can be ``window`` positions apart:
    positions reach max_seq_len + 2K - 1 on TensorRT-LLM (trtllm-build's 2K draft slots;
    engine/trtllm/facts/attention_window.yaml rule.window_can_bind)."""
    return int(window) < int(max_seq_len) + 2 * int(K)


def on_context_route(pre: dict | None) -> bool:
    """The engine of ``pretrained_config`` ``pre`` was built on the context route (its target's sliding-window layers
    read the ``sliding_*`` inputs, which only the project runtime binds)."""
    return isinstance(pre, dict) and (pre.get("dflash2_engine") or {}).get("sliding_path") == "context"


def resolve_sliding_path(ck: dict, cfg, *, source=None) -> str:
    """The build's ``sliding_path`` for the target of checkpoint config ``ck`` (HF ``layer_types`` or
    ``hf_layer_types``, ``sliding_window``): ``context`` or ``generation``; ``auto`` is ``context`` where the target's
    window can bind, ``W < max_seq_len + 2K`` (``engine/trtllm/facts/attention_window.yaml`` rule.window_can_bind),
    else ``generation``. A target without sliding layers takes ``generation`` (nothing to route); ``context`` asked of
    one is a ConfigError naming ``source`` (default the build config's file). The same on every backend: one network
    (the cpu and cuda backends apply the window on either path; on TensorRT-LLM only the context route does:
    engine/trtllm/windows.py)."""
    kinds = ck.get("hf_layer_types") or ck.get("layer_types") or ()
    sw = ck.get("sliding_window")
    asked = getattr(cfg, "sliding_path", "auto")
    if not target_sliding_layers(kinds, sw):
        if asked == "context":
            raise ConfigError("the target has no sliding-window layers (nothing takes the context route)",
                              source=source or getattr(cfg, "source", None), field="sliding_path")
        return "generation"
    if asked != "auto":
        return asked
    return "context" if window_can_bind(sw, cfg.max_seq_len, int(cfg.block_size) - 1) else "generation"


TARGET_ONLY = "target_only"
"""``pretrained_config.dflash2_engine.network`` of a baseline engine: the target alone
(``trtllm/network/target_only.py``), built beside the combined engine by ``build --baseline``."""

BASELINE_DIR = "baseline"
"""Where ``build --backend trtllm --baseline`` puts the baseline's rank engines and config.json in the engine directory."""


def baseline_pretrained_config(pre: dict) -> dict:
    """The build checkpoint config of the baseline engine: the combined engine's (``pre``, from
    :func:`engine_pretrained_config`; same target tensors, same KV pool layout, same state slots), marked
    :data:`TARGET_ONLY`, with ``max_draft_len`` 0 (trtllm-build takes a config's max_draft_len when its flag is 0:
    facts ``max_draft_len_from_config``; the baseline is built without a speculative decoding mode). A copy."""
    out = json.loads(json.dumps(pre))
    out["max_draft_len"] = 0
    out.setdefault("dflash2_engine", {})["network"] = TARGET_ONLY
    return out


def is_target_only(pre: dict) -> bool:
    return (pre.get("dflash2_engine") or {}).get("network") == TARGET_ONLY


def engine_draft_len(pre: dict) -> int:
    """K of the engine a ``pretrained_config`` describes: 0 for a baseline (target-only) engine, else the block size
    less one. What the runtime, the session and the stand-in size the draft slots with."""
    return 0 if is_target_only(pre) else int(pre["dflash2"]["block_size"]) - 1


def rnn_fields(ck: dict) -> dict:
    """The RNN fields the runtime requires of a recurrent variant (gptJsonConfig.cpp; after the patch's R1 the
    hybrid is one), per rank, from the Gated DeltaNet shapes and the block size (``dflash2.block_size`` = the
    plugin's max_verify_tokens Kv): the runtime's state slot ``[rnn_hidden_size / rnn_head_size, state_size,
    rnn_head_size]`` float32 is then the plugin's slot ``[Hv/tp, Dk + E, Dv]`` (the state and the deferred commit's
    records, E rows: trtllm/gdn_slot.py) and its conv slot ``[conv_kernel - 1, rnn_conv_dim_size]`` the plugin's
    ``[K-1, (2 Hk Dk + Hv Dv)/tp]`` (docs/hybrid-runtime.md §4 and docs/hybrid-runtime.md §5). The runtime divides
    none of them by tp."""
    from ..trtllm.gdn_slot import layout_of_linear_attention

    la, tp = ck["linear_attention"], ck["mapping"]["tp_size"]
    lay = layout_of_linear_attention(la, tp, ck["dflash2"]["block_size"])
    nk_l, nv_l, dk, dv = lay.num_k_heads, lay.num_v_heads, lay.head_k_dim, lay.head_v_dim
    return {"state_size": lay.state_size, "rnn_head_size": dv, "rnn_hidden_size": nv_l * dv,
            "conv_kernel": la["conv_kernel_size"], "rnn_conv_dim_size": 2 * nk_l * dk + nv_l * dv,
            "state_dtype": "float32"}


def drafter_pool_layers_per_layer(t, d, tp: int) -> int:
    """Pool layers one drafter layer occupies (``drafter_kv_split`` in ``trtllm/network/kv_layout.py``, from plain configs): its K/V
    per token and rank over the target's, 1 when equal (Qwen3.8-27B), 4 for Muse Glimmer 30B."""
    def local(n):
        return n // tp if n >= tp else 1
    t_tok = local(t.num_key_value_heads) * t.head_dim
    d_tok = local(d.num_key_value_heads) * d.head_dim
    return max(1, d_tok // t_tok) if t_tok else 1


def p_t(ck: dict):
    """The few target fields drafter_pool_layers_per_layer reads, from a checkpoint config.json."""
    return SimpleNamespace(num_key_value_heads=ck["num_key_value_heads"], head_dim=ck["head_size"])
