"""The trtllm-build command line against TensorRT-LLM's own parser, as recorded in
``dflash2_trt/engine/trtllm/facts/trtllm_build_cli.yaml`` (read from ``tensorrt_llm/commands/build.py``
``parse_arguments`` and ``tensorrt_llm/plugin/plugin.py`` ``add_plugin_argument``; sources in the record's header).

TensorRT-LLM cannot be installed here, so an ``argparse`` parser is built from the record (names, types, choices,
defaults, actions, nargs, ``allow_abbrev`` as the real parser has them) and the argv ``trtllm_build_argv`` makes is
parsed by it, for several build configs. An unknown flag, a value outside the choices, a value of the wrong type, or
an abbreviated flag (which the real parser would accept today but which is one new option away from being
ambiguous) is refused. The checks ``main()`` applies to our flags are reproduced from the record's ``checks``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from dflash2_trt.assets import trained_pair
from dflash2_trt.engine.plan import prepare
from dflash2_trt.engine.trtllm import command as command_module
from dflash2_trt.engine.trtllm.command import BUILD_ENTRY, MODEL_CLS_NAME, trtllm_build_argv, trtllm_engine_config
from dflash2_trt.testing.fixtures import QWEN_DRAFTER, QWEN_TARGET
from dflash2_trt.trtllm.backend import MODEL_FILE

RECORD_PATH = Path(command_module.__file__).resolve().parent / "facts" / "trtllm_build_cli.yaml"
TINY_SETS = {"drafter_window": "full"}      # what TensorRT-LLM needs of tiny's sliding-window drafter


class Refused(Exception):
    """What the mirror parser raises where the real one would print an error and exit 2."""


class _MirrorParser(argparse.ArgumentParser):
    def error(self, message):           # argparse's own error path (unknown argument, bad choice, bad type)
        raise Refused(message)

    def exit(self, status=0, message=None):
        raise Refused(message or f"exit {status}")


@pytest.fixture(scope="module")
def record() -> dict:
    return yaml.safe_load(RECORD_PATH.read_text())


def _kv_cache_type(values):
    """enum_type(KVCacheType): KVCacheType.from_string, which upper-cases and knows only the recorded names."""
    def parse(value: str) -> str:
        name = value.upper()
        if name not in values:
            raise ValueError(f"Invalid KV cache type: {name}")
        return name
    parse.__name__ = "parse_enum"
    return parse


def mirror_parser(record: dict) -> argparse.ArgumentParser:
    p = record["parser"]
    parser = _MirrorParser(prog="trtllm-build", allow_abbrev=p["allow_abbrev"], add_help=p["add_help"],
                           prefix_chars=p["prefix_chars"])
    types = {"str": str, "int": int, "kv_cache_type": _kv_cache_type(record["kv_cache_type_values"])}
    for o in record["options"]:
        kw = {"dest": o["dest"],
              "default": argparse.SUPPRESS if o["default"] == "SUPPRESS" else o["default"]}
        if "action" in o:
            kw["action"] = o["action"]
        elif o.get("type") is not None:
            kw["type"] = types[o["type"]]
        if o.get("choices") is not None:
            kw["choices"] = o["choices"]
        if "nargs" in o:
            kw["nargs"] = o["nargs"]
        parser.add_argument(*o["flags"], **kw)
    return parser


def known_flags(record: dict) -> set[str]:
    return {f for o in record["options"] for f in o["flags"]}


def parse_ours(record: dict, args: list[str]) -> argparse.Namespace:
    """Parse as the real trtllm-build would (the mirror parser), and refuse any flag that is not spelt out in full
    (the real parser's allow_abbrev would take a unique prefix; ours must not depend on that)."""
    ns = mirror_parser(record).parse_args(args)
    flags = known_flags(record)
    for a in args:
        if a.startswith("--") and a.split("=", 1)[0] not in flags:
            raise Refused(f"{a}: not an option of trtllm-build spelt in full")
    return ns


def main_check_problems(record: dict, ns: argparse.Namespace) -> list[str]:
    """The record's main()-level checks that can refuse our flags (checks: context_logits_with_draft,
    model_cls_name_required, multiple_profiles_vs_opt_num_tokens, checkpoint_or_config, streamingllm_refused)."""
    ids = {c["id"] for c in record["checks"]}
    assert {"context_logits_with_draft", "model_cls_name_required", "multiple_profiles_vs_opt_num_tokens",
            "checkpoint_or_config", "streamingllm_refused"} <= ids
    out = []
    gather_ctx = ns.gather_context_logits or ns.gather_all_token_logits
    if gather_ctx and ns.max_draft_len > 0:
        out.append("context_logits_with_draft")
    if ns.model_cls_file is not None and ns.model_cls_name is None:
        out.append("model_cls_name_required")
    if ns.build_config is None and ns.multiple_profiles == "enable" and ns.opt_num_tokens is not None:
        out.append("multiple_profiles_vs_opt_num_tokens")
    if (ns.checkpoint_dir if ns.checkpoint_dir is not None else ns.model_config) is None:
        out.append("checkpoint_or_config")
    if ns.streamingllm == "enable":
        out.append("streamingllm_refused")
    return out


def _tiny(**kw):
    pair = trained_pair("qwen3")
    sets = {**TINY_SETS, **kw.pop("sets", {})}
    return prepare(pair.drafter_dir, pair.target_dir, target_key="tiny", sets=sets, **kw).cfg


CONFIGS = {
    "tiny-default": lambda: _tiny(),
    "tiny-tp2": lambda: _tiny(overrides={"tp_size": 2}),
    "tiny-block4": lambda: _tiny(overrides={"block_size": 4}, sets={"tokens_per_block": 64, "max_batch_size": 2}),
    "qwen3.8-27b-tp2": lambda: prepare(QWEN_DRAFTER, QWEN_TARGET, target_key="qwen3.8-27b",
                                       overrides={"tp_size": 2}).cfg,
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def built(request, tmp_path_factory):
    cfg = CONFIGS[request.param]()
    work = tmp_path_factory.mktemp(request.param)
    argv = trtllm_build_argv(cfg, checkpoint_dir=work / "engine" / "build-checkpoint", output_dir=work / "engine")
    return cfg, argv


# --- the record itself


def test_record_names_its_sources_and_is_complete(record):
    sources = record["sources"]
    for name, s in sources.items():
        assert s["repo"] == "NVIDIA/TensorRT-LLM" and s["path"] and s["revision"] and s["functions"], name
    assert sources["build"]["path"] == "tensorrt_llm/commands/build.py"
    assert sources["plugin"]["path"] == "tensorrt_llm/plugin/plugin.py"
    assert "parse_arguments" in sources["build"]["functions"] and "main" in sources["build"]["functions"]
    assert "add_plugin_argument" in sources["plugin"]["functions"]
    opts = record["options"]
    assert len(opts) >= 30
    for o in opts:
        assert o["source"] in sources, o
        assert o["flags"] and all(f.startswith("--") for f in o["flags"]), o
        assert "default" in o and o["dest"], o
        assert ("action" in o) != ("type" in o), o                # store_true flags have no type, all others one
        assert o.get("type") in (None, "str", "int", "kv_cache_type"), o
        if o.get("choices_recorded") is False:
            assert "choices" not in o and o.get("choices_from"), o
    flags = [f for o in opts for f in o["flags"]]
    dests = [o["dest"] for o in opts]
    assert len(flags) == len(set(flags)) and len(dests) == len(set(dests))
    # add_plugin_argument adds exactly the cli_plugin_args fields (28 in the plugin.py read)
    assert sum(o["source"] == "plugin" for o in opts) == 28
    for c in record["checks"]:                                   # each check names the function that applies it
        assert c["id"] and c["function"] and c["when"] and c["effect"] and c["ours"], c


def test_the_mirror_parser_holds_every_recorded_option(record):
    parser = mirror_parser(record)
    actions = [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]
    assert len(actions) == len(record["options"])
    assert parser.allow_abbrev is True                            # argparse's default: parse_arguments keeps it
    ns = parser.parse_args([])
    assert not hasattr(ns, "kv_cache_type") and not hasattr(ns, "paged_kv_cache")   # SUPPRESS defaults
    assert ns.gemm_plugin is None and ns.gpt_attention_plugin == "auto" and ns.max_draft_len == 0
    assert parser.parse_args(["--max_draft", "3"]).max_draft_len == 3      # a unique prefix is taken, as there


# --- our command line


def test_our_command_line_is_what_trtllm_build_accepts(record, built):
    cfg, argv = built
    assert argv[1:3] == ["-m", BUILD_ENTRY]
    args = argv[3:]
    used = {a for a in args if a.startswith("--")}
    assert used <= known_flags(record)
    ns = parse_ours(record, args)
    K = cfg.block_size - 1
    assert ns.speculative_decoding_mode == "eagle" and ns.max_draft_len == K > 0
    assert (ns.max_batch_size, ns.max_input_len, ns.max_seq_len, ns.max_num_tokens, ns.max_beam_width) == (
        cfg.max_batch_size, cfg.max_input_len, cfg.max_seq_len, cfg.max_num_tokens, 1)
    assert ns.kv_cache_type == "PAGED" and ns.tokens_per_block == cfg.tokens_per_block
    assert ns.model_cls_file == str(MODEL_FILE) and ns.model_cls_name == MODEL_CLS_NAME
    assert (ns.gpt_attention_plugin, ns.gemm_plugin) == ("auto", "auto")
    assert (ns.context_fmha, ns.use_paged_context_fmha, ns.remove_input_padding) == ("enable",) * 3
    assert ns.logits_dtype == "float32" and ns.workers == 1
    assert not ns.checkpoint_dir.lower().endswith(".json")      # main(): a directory holding config.json
    assert Path(ns.output_dir) == Path(argv[argv.index("--output_dir") + 1])
    # check timing_cache_written: the cache goes where it is told, the default into the working directory
    assert "timing_cache_written" in {c["id"] for c in record["checks"]}
    assert Path(ns.output_timing_cache).parent == Path(ns.checkpoint_dir)
    assert main_check_problems(record, ns) == []
    # what main() turns the flags into, against what the project says trtllm-build writes
    spec = record["speculative_decoding_mode"]
    mode = spec["values"][spec["from_arguments"][ns.speculative_decoding_mode]]
    eng = trtllm_engine_config({"dtype": cfg.dtype}, cfg)["build_config"]
    assert eng["speculative_decoding_mode"] == mode == 32
    assert eng["max_draft_len"] == ns.max_draft_len and eng["kv_cache_type"] == ns.kv_cache_type
    assert eng["plugin_config"]["tokens_per_block"] == ns.tokens_per_block
    for flag in ("context_fmha", "use_paged_context_fmha", "remove_input_padding"):
        assert eng["plugin_config"][flag] is record["plugin_values"][getattr(ns, flag)], flag


def test_the_baseline_command_line_is_what_trtllm_build_accepts(record, built):
    """``build --baseline``'s second trtllm-build: the same limits and plugins, the target-only class, and no
    speculative decoding: the parser's defaults (mode None -> NONE = 1, max_draft_len 0), with which builder.build
    takes the config's max_draft_len (0 in the baseline's config) and adds no draft slots (checks
    max_draft_len_from_config, speculative_sizes)."""
    from dflash2_trt.engine.pretrained import baseline_pretrained_config
    from dflash2_trt.engine.trtllm.command import BASELINE_CLS_NAME

    cfg, argv = built
    work = Path(argv[argv.index("--output_dir") + 1])
    base = trtllm_build_argv(cfg, checkpoint_dir=work / "baseline-checkpoint", output_dir=work / "baseline",
                             target_only=True)
    ns = parse_ours(record, base[3:])
    assert ns.model_cls_name == BASELINE_CLS_NAME and ns.model_cls_file == str(MODEL_FILE)
    assert ns.speculative_decoding_mode is None and ns.max_draft_len == 0
    spec = record["speculative_decoding_mode"]
    assert spec["values"][spec["from_arguments"][None]] == 1
    combined = parse_ours(record, argv[3:])
    differ = {k for k, v in vars(ns).items() if getattr(combined, k) != v}
    assert differ == {"model_cls_name", "speculative_decoding_mode", "max_draft_len", "checkpoint_dir", "output_dir",
                      "output_timing_cache"}
    assert Path(ns.output_timing_cache).parent == Path(ns.checkpoint_dir)
    assert main_check_problems(record, ns) == []
    pre = baseline_pretrained_config({"dtype": cfg.dtype, "max_draft_len": cfg.block_size - 1,
                                      "dflash2_engine": {"selector": "greedy"}})
    assert pre["max_draft_len"] == 0 and pre["dflash2_engine"] == {"selector": "greedy", "network": "target_only"}
    eng = trtllm_engine_config(pre, cfg, target_only=True)["build_config"]
    assert (eng["speculative_decoding_mode"], eng["max_draft_len"], eng["max_seq_len"]) == (1, 0, cfg.max_seq_len)


@pytest.mark.parametrize("change, why", [
    (lambda a: a + ["--dflash2_block_size", "8"], "unrecognized arguments"),          # made-up flag
    (lambda a: _set(a, "--speculative_decoding_mode", "dflash2"), "invalid choice"),  # outside choices
    (lambda a: _set(a, "--speculative_decoding_mode", "ngram"), "invalid choice"),    # from_arguments only
    (lambda a: _set(a, "--gemm_plugin", "enable"), "invalid choice"),                 # dtype options, not enable
    (lambda a: _set(a, "--context_fmha", "true"), "invalid choice"),
    (lambda a: _set(a, "--logits_dtype", "bfloat16"), "invalid choice"),
    (lambda a: _set(a, "--kv_cache_type", "paged_v2"), "invalid parse_enum value"),
    (lambda a: _set(a, "--max_draft_len", "seven"), "invalid int value"),
    (lambda a: [x if x != "--max_draft_len" else "--max_draft" for x in a], "spelt in full"),   # abbreviation
])
def test_a_command_line_trtllm_build_refuses_is_refused(record, built, change, why):
    _, argv = built
    good = argv[3:]
    parse_ours(record, good)                                     # the unchanged line passes ...
    with pytest.raises(Refused, match=why):                      # ... and the changed one does not
        parse_ours(record, change(list(good)))


def test_the_main_checks_fire(record, built):
    _, argv = built
    ns = parse_ours(record, argv[3:] + ["--gather_all_token_logits"])
    assert main_check_problems(record, ns) == ["context_logits_with_draft"]
    args = list(argv[3:])
    i = args.index("--model_cls_name")
    del args[i:i + 2]
    assert main_check_problems(record, parse_ours(record, args)) == ["model_cls_name_required"]
    ns = parse_ours(record, argv[3:] + ["--multiple_profiles", "enable", "--opt_num_tokens", "64"])
    assert main_check_problems(record, ns) == ["multiple_profiles_vs_opt_num_tokens"]


def _set(args: list[str], flag: str, value: str) -> list[str]:
    i = args.index(flag)
    return [*args[:i + 1], value, *args[i + 2:]]
