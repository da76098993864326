"""How TensorRT-LLM's C++ runtime reads an engine's ``config.json``, emulated from recorded facts.

The facts (``facts/gptJsonConfig.yaml``: source path and revision inside) are paraphrased from
``cpp/tensorrt_llm/runtime/gptJsonConfig.cpp``; this module applies them the way that code does, so a test (and
``build --dry-run``) can see what the runtime will count before anyone rents a GPU:

* the layer count is ``num_hidden_layers``, plus ``eagle_net_config.num_hidden_layers`` in EAGLE mode;
* ``layer_types`` is a group repeated cyclically over that count (``i % len``); names other than the runtime's
  (``attention``, ``recurrent``, ``linear``, ``no_op``) count as attention;
* attention layers get KV-pool layers, recurrent layers get state;
* the variant is Mamba / RecurrentGemma by ``architecture`` equality (``patched_architectures`` adds the names
  ``scripts/patch_trtllm_recurrent_spec.py`` change R1 maps to RecurrentGemma), and only then are the RNN fields
  read, four of them with no default.

A field the runtime reads with ``.at`` and the config lacks is a :class:`~dflash2_trt.errors.ConfigError` naming
it (the runtime throws there at load).
"""

from __future__ import annotations

import functools
from pathlib import Path

from ...errors import ConfigError
from ...yaml_files import load_yaml_file
from .command import engine_config_fixes, trtllm_engine_config

FACTS_DIR = Path(__file__).with_name("facts")
# The architectures scripts/patch_trtllm_recurrent_spec.py maps to the runtime's hybrid variant by default (R1).
PATCHED_ARCHITECTURES = ("DFlash2Qwen3_5ForCausalLM",)


@functools.lru_cache(maxsize=None)
def facts(name: str = "gptJsonConfig") -> dict:
    """A recorded-facts file of ``facts/`` (YAML)."""
    # utf-8 whatever the locale: the python-backend stub embeds Python without its UTF-8 mode (ascii in a C locale)
    return load_yaml_file(FACTS_DIR / f"{name}.yaml")


def build_layer_types(num_layers: int, names: list[str]) -> list[str]:
    """``buildLayerTypes``: one runtime layer type per layer, the list repeated cyclically; empty = all attention."""
    f = facts()["layer_types"]
    if not names:
        return ["attention"] * num_layers
    known = f["names"]
    return [known.get(names[i % len(names)], f["unknown_name"]) for i in range(num_layers)]


def _at(d, dotted: str, source: str):
    cur = d
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            raise ConfigError(f"missing: the runtime reads {dotted} with no default (gptJsonConfig.cpp)",
                              source=source, field=dotted)
        cur = cur[part]
    return cur


def parse_engine_config(engine: dict, *, source: str = "config.json",
                        patched_architectures: tuple[str, ...] = ()) -> dict:
    """What the runtime makes of an engine ``config.json`` (``{"pretrained_config", "build_config", ...}``):
    ``{"layers", "layer_types", "attention_layers", "recurrent_layers", "variant", "eagle", "rnn"}``."""
    f = facts()
    req = f["required"]
    for top in req["top"]:
        _at(engine, top, source)
    for section in ("pretrained_config", "pretrained_config.mapping", "build_config", "build_config.plugin_config"):
        node = _at(engine, section, source)
        for name in req[section]:
            _at(node, name, f"{source}: {section}")
    pre, build = engine["pretrained_config"], engine["build_config"]
    if pre["dtype"] not in f["dtypes"]:
        raise ConfigError(f"dtype {pre['dtype']!r} is not one the runtime loads ({', '.join(f['dtypes'])})",
                          source=source, field="pretrained_config.dtype")
    if pre.get("logits_dtype", "float32") not in f["logits_dtypes"]:
        raise ConfigError(f"logits_dtype {pre['logits_dtype']!r}: the runtime throws (float32 or float16 only)",
                          source=source, field="pretrained_config.logits_dtype")
    eagle = build.get("speculative_decoding_mode") == f["layer_count"]["eagle_mode_value"]
    layers = int(pre["num_hidden_layers"])
    eagle_info = None
    if eagle:
        for section, names in req["eagle"].items():
            if section == "positive":
                continue
            node = _at(engine, section, source)
            for name in names:
                _at(node, name, f"{source}: {section}")
        for dotted in req["eagle"]["positive"]:
            v = _at(engine, dotted, source) if dotted != "pretrained_config.num_eagle_layers" else pre.get(
                "num_eagle_layers", 0)
            if not isinstance(v, int) or v <= 0:
                raise ConfigError(f"must be > 0 for EAGLE decoding (gptJsonConfig.cpp), got {v!r}", source=source,
                                  field=dotted)
        net_layers = int(pre["eagle_net_config"]["num_hidden_layers"])
        layers += net_layers
        eagle_info = {"eagle_net_layers": net_layers, "num_eagle_layers": pre["num_eagle_layers"],
                      "max_draft_len": build["max_draft_len"]}
    types = build_layer_types(layers, list(pre.get(f["layer_types"]["field"].split(".")[-1]) or []))
    arch = pre["architecture"]
    variant = f["rnn"]["variant_by_architecture"].get(arch)
    if variant is None and arch in patched_architectures:
        variant = "kRecurrentGemma"
    rnn = None
    if variant is not None:
        rnn = {k: int(_at(pre, k, f"{source}: pretrained_config")) for k in f["rnn"]["required_when_rnn"]}
        for k in f["rnn"]["optional_when_rnn"]:
            if k in pre:
                rnn[k] = int(pre[k])
        plugin = build["plugin_config"]
        for need in f["rnn"]["state_manager_requires"]:      # the state manager, made at start-up, checks these
            name = need["field"].rsplit(".", 1)[1]
            value = plugin.get(name, f["plugin_config_defaults"].get(name))
            ok = value is True if need["must_be"] is True else value is not None
            if not ok:
                raise ConfigError(f"{value!r}: the runtime refuses the engine at start-up ({need['message']}, "
                                  f"rnnStateManager.cpp)", source=source, field=need["field"])
    return {"layers": layers, "layer_types": types, "attention_layers": types.count("attention"),
            "recurrent_layers": types.count("recurrent"), "variant": variant or "kGpt", "eagle": eagle_info,
            "rnn": rnn}


def state_pool_bytes_per_slot(rnn: dict, engine_dtype_itemsize: int) -> dict:
    """One slot of one recurrent layer as the runtime allocates it (``rnnStateManager.cpp``, docs/hybrid-runtime.md
    §1): state ``[rnn_hidden_size / rnn_head_size, state_size, rnn_head_size]`` float32 (without ``rnn_head_size``:
    ``[state_size, rnn_hidden_size]``), conv ``[conv_kernel - 1, rnn_conv_dim_size]`` in the engine dtype."""
    if rnn.get("rnn_head_size"):
        state = (rnn["rnn_hidden_size"] // rnn["rnn_head_size"]) * rnn["state_size"] * rnn["rnn_head_size"] * 4
    else:
        state = rnn["state_size"] * rnn["rnn_hidden_size"] * 4
    conv = (rnn["conv_kernel"] - 1) * rnn["rnn_conv_dim_size"] * engine_dtype_itemsize
    return {"state": state, "conv": conv}


def runtime_reading(pre: dict | None, cfg) -> dict | None:
    """What the (patched, for the hybrid) C++ runtime counts in the engine built from ``pre``: layers, KV-pool
    (attention) and state (recurrent) layers, the variant and the RNN fields (:func:`parse_engine_config` on
    trtllm-build's config with the build's fixes, :func:`~.command.engine_config_fixes`, listed as
    ``config_fixes``); ``{"error": ...}`` when it would refuse the config."""
    if pre is None:
        return None
    raw = trtllm_engine_config(pre, cfg)
    fixes = engine_config_fixes(raw)      # what the build changes in trtllm-build's config.json
    try:
        r = parse_engine_config(raw, source="engine config.json", patched_architectures=PATCHED_ARCHITECTURES)
    except ConfigError as exc:
        return {"error": str(exc), "config_fixes": fixes}
    return {"config_fixes": fixes, "layers": r["layers"], "target_layers": pre["num_hidden_layers"],
            "eagle_net_layers": (r["eagle"] or {}).get("eagle_net_layers", 0), "attention_layers": r["attention_layers"],
            "recurrent_layers": r["recurrent_layers"], "variant": r["variant"], "rnn": r["rnn"]}
