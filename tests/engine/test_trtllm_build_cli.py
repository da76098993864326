"""The trtllm-build command line against TensorRT-LLM's own parser, as recorded in
``dflash2_trt/engine/trtllm/facts/trtllm_build_cli.yaml`` (read from ``tensorrt_llm/commands/build.py``
``parse_arguments`` and ``tensorrt_llm/plugin/plugin.py`` ``add_plugin_argument``; sources in the record's header).

TensorRT-LLM cannot be installed here, so an ``argparse`` parser is built from the record (names, types, choices,
defaults, actions, nargs, ``allow_abbrev`` as the real parser has them) and the argv ``trtllm_build_argv`` makes is
parsed by it, for several build configs. An unknown flag, a value outside the choices, a value of the wrong type, or
an abbreviated flag (which the real parser would accept today but which is one new option away from being
ambiguous) is refused. The checks ``main()`` applies to our flags are reproduced from the record's ``checks``.

Where TensorRT-LLM's sources are on disk ($DFLASH2_TRTLLM_SRC with tensorrt_llm/commands/build.py, the conformance
harness's files), the record itself is held to the real ``parse_arguments`` (every option, as recorded) and our
command lines are parsed by it (the last two tests; skipped otherwise).
"""

from __future__ import annotations

import argparse
import json
import sys
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
REPO = Path(__file__).resolve().parents[2]
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


# --- the record against TensorRT-LLM's real parser, where its sources are on disk

sys.path.insert(0, str(REPO / "tests" / "trtllm"))
from real_sources import SRC, child_json, have  # noqa: E402

# Run in a child (the conformance harness's import of the real modules over TensorRT-RTX): build.py's own enum_type
# and parse_arguments, taken out of the file as they are, over the real plugin.py (add_plugin_argument,
# PluginConfig) and logger.py (severity_map). What build.py imports from files not on disk is replaced by markers:
# a BuildConfig default arrives as "<BuildConfig.field>" (so the record's default_from is what is checked; the parser
# that parses our command lines takes the record's values of those fields instead), the
# LoRA module table as one "<LoraManager.LORA_MODULE_IDS>" key, and KVCacheType (a C++ binding) as an enum with the
# record's names and from_string (real_build.KVCacheType).
_REAL_PARSER = r"""
import argparse, ast, contextlib, enum, io, json, sys
sys.path.insert(0, sys.argv[2])
from trtllm_conformance_lib import harness
harness.install(sys.argv[1])
import importlib
plugin = importlib.import_module("tensorrt_llm.plugin.plugin")
logger_module = importlib.import_module("tensorrt_llm.logger")
tree = ast.parse(open(sys.argv[1] + "/tensorrt_llm/commands/build.py", encoding="utf-8").read())
fns = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in ("enum_type", "parse_arguments")]


class Marker:
    def __init__(self, owner):
        self._owner = owner

    def __getattr__(self, name):
        return f"<{self._owner}.{name}>"

from trtllm_conformance_lib.real_build import KVCacheType


given = json.load(open(sys.argv[3]))


def real_parser(build_config):
    ns = {"argparse": argparse, "BuildConfig": build_config, "KVCacheType": KVCacheType,
          "LoraManager": type("LoraManager", (), {"LORA_MODULE_IDS": {"<LoraManager.LORA_MODULE_IDS>": 0}}),
          "add_plugin_argument": plugin.add_plugin_argument, "severity_map": logger_module.severity_map}
    exec(compile(ast.Module(body=fns, type_ignores=[]), "build.py", "exec"), ns)
    return ns["parse_arguments"]()


parser = real_parser(Marker("BuildConfig"))
# for parsing, the BuildConfig defaults the record gives (argparse converts a string default with the option's type)
parsing = real_parser(type("BuildConfig", (), given["build_config"]))


def js(v):
    if isinstance(v, enum.Enum):
        return v.name
    try:
        json.dumps(v)
        return v
    except TypeError:
        return repr(v)


actions = [{"flags": a.option_strings, "dest": a.dest,
            "default": "SUPPRESS" if a.default is argparse.SUPPRESS else js(a.default),
            "type": None if a.type is None else getattr(a.type, "__name__", repr(a.type)),
            "choices": None if a.choices is None else [js(c) for c in a.choices],
            "action": type(a).__name__, "nargs": a.nargs} for a in parser._actions]
parsed = []
for argv in given["argvs"]:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            parsed.append({"ok": True, "ns": {k: js(v) for k, v in vars(parsing.parse_args(argv)).items()}})
    except SystemExit as e:
        parsed.append({"ok": False, "code": e.code, "stderr": err.getvalue()[-500:]})
print(json.dumps({"parser": {"allow_abbrev": parser.allow_abbrev, "add_help": parser.add_help,
                             "prefix_chars": parser.prefix_chars}, "actions": actions, "parsed": parsed}))
"""

ACTION_CLASS = {None: "_StoreAction", "store_true": "_StoreTrueAction", "store_false": "_StoreFalseAction",
                "store_const": "_StoreConstAction", "append": "_AppendAction", "count": "_CountAction"}
TYPE_NAME = {None: None, "str": "str", "int": "int", "kv_cache_type": "parse_enum"}


@pytest.fixture(scope="module")
def real_parser(record, tmp_path_factory):
    if not have("functional.py", "commands/build.py"):
        pytest.skip("TensorRT-LLM's sources (with tensorrt_llm/commands/build.py) are not in $DFLASH2_TRTLLM_SRC")
    work = tmp_path_factory.mktemp("real-parser")
    argvs = []
    for name in sorted(CONFIGS):
        cfg = CONFIGS[name]()
        for target_only in (False, True):
            argv = trtllm_build_argv(cfg, checkpoint_dir=work / name / "ckpt", output_dir=work / name / "engine",
                                     target_only=target_only)
            argvs.append(argv[3:])
    build_config = {o["default_from"].split(".", 1)[1]: o["default"] for o in record["options"]
                    if str(o.get("default_from", "")).startswith("BuildConfig.")}
    (work / "argvs.json").write_text(json.dumps({"argvs": argvs, "build_config": build_config}))
    return child_json(_REAL_PARSER, str(work / "argvs.json")), argvs


def test_the_record_is_trtllm_builds_own_parser(record, real_parser):
    """Every option of the real parse_arguments (+ add_plugin_argument) is recorded with its flags, dest, type,
    choices, action, nargs and default (default_from where the default is a BuildConfig field), and nothing else."""
    real, _ = real_parser
    p = record["parser"]
    assert real["parser"] == {"allow_abbrev": p["allow_abbrev"], "add_help": p["add_help"],
                              "prefix_chars": p["prefix_chars"]}
    actions = {tuple(a["flags"]): a for a in real["actions"] if a["flags"] != ["-h", "--help"]}
    recorded = {tuple(o["flags"]): o for o in record["options"]}
    assert set(actions) == set(recorded), (set(actions) ^ set(recorded))
    for flags, o in recorded.items():
        a = actions[flags]
        assert a["dest"] == o["dest"], flags
        assert a["action"] == ACTION_CLASS[o.get("action")], (flags, a["action"])
        if o.get("action") not in ("store_true", "store_false"):   # argparse gives those nargs 0
            assert a["nargs"] == o.get("nargs"), (flags, a["nargs"])
        if "action" not in o:
            assert a["type"] == TYPE_NAME[o.get("type")], (flags, a["type"])
        if o.get("choices_recorded", True) is False:
            assert a["choices"] is not None, flags
        else:   # the real list names "disable" twice for --bert_attention_plugin: the same choices to argparse
            real_choices = None if a["choices"] is None else list(dict.fromkeys(a["choices"]))
            assert real_choices == o.get("choices"), (flags, a["choices"])
        if str(o.get("default_from", "")).startswith("BuildConfig."):
            assert a["default"] == f"<{o['default_from']}>", (flags, a["default"])
        else:
            assert a["default"] == o["default"], (flags, a["default"], o["default"])


def test_our_command_lines_parse_with_trtllm_builds_own_parser(real_parser):
    """The argv of every build config here, combined and --baseline, through the real parser: accepted (the
    values each flag lands in are the previous test's dest / type check and test_our_command_line_is_what_trtllm_build_
    accepts' on the mirror parser; here max_batch_size, model_cls_name and the KV cache type)."""
    real, argvs = real_parser
    for argv, got in zip(argvs, real["parsed"], strict=True):
        assert got["ok"], (argv, got)
        ns = got["ns"]
        for flag, value in zip(argv, argv[1:]):
            if flag == "--max_batch_size":
                assert ns["max_batch_size"] == int(value)
            if flag == "--model_cls_name":
                assert ns["model_cls_name"] == value
        assert ns["kv_cache_type"] == "PAGED"


def _real_build_config_defaults() -> dict:
    """BuildConfig's literal field defaults, read from the real builder.py's class body (not imported: it imports most
    of TensorRT-LLM); a default that is not a literal (an enum member, a default_factory) is left out."""
    import ast

    if not have("builder.py"):
        pytest.skip("TensorRT-LLM's sources (with tensorrt_llm/builder.py) are not in $DFLASH2_TRTLLM_SRC")
    path = Path(SRC) / "tensorrt_llm" / "builder.py"
    cls = next(n for n in ast.parse(path.read_text(encoding="utf-8")).body
               if isinstance(n, ast.ClassDef) and n.name == "BuildConfig")
    out = {}
    for b in cls.body:
        if isinstance(b, ast.AnnAssign) and b.value is not None:
            try:
                out[b.target.id] = ast.literal_eval(b.value)
            except ValueError:
                pass
    return out


def test_recorded_build_config_defaults_are_builder_pys(record):
    """The values the record gives for the parser's BuildConfig-derived defaults are the real BuildConfig's, and
    trtllm-build's network is strongly typed by default (api_1_2.yaml dtype_rules strongly_typed)."""
    real = _real_build_config_defaults()
    fields = [o for o in record["options"] if str(o.get("default_from", "")).startswith("BuildConfig.")]
    assert fields
    for o in fields:
        name = o["default_from"].split(".", 1)[1]
        assert name in real, name
        assert real[name] == o["default"], (name, real[name], o["default"])
    assert real["strongly_typed"] is True
