"""trtllm-bench on a DFlash2 engine: the launcher, the options file, the model folder, the commands and the
report parser. Run as ``python -m dflash2_trt.bench.trtllm_bench <trtllm-bench arguments>``.

Why a launcher (facts in ``trtllm_bench_1_2.yaml``, read in TensorRT-LLM 1.2's sources, not yet run on a GPU):
``trtllm-bench ... throughput --backend tensorrt --engine_dir E`` copies the engine's
``build_config.speculative_decoding_mode`` (EAGLE = 32 for this project's engines) into its own decoding
config and looks it up in ``SPECULATIVE_MAP`` (``bench/dataclasses/configuration.py``), which holds only
NONE and MEDUSA: a KeyError before any engine work, and before ``--extra_llm_api_options`` is merged in.
The launcher

1. adds EAGLE to ``SPECULATIVE_MAP`` with NONE's entry (no extra decoding mode: the LLM API sets the Eagle
   decoding mode itself from the options file's ``speculative_config``);
2. gives ``SpeculativeDecodingMode`` members the ``values`` its report reads for a non-NONE engine
   (``reporting.py`` names the mode by ``decoding_mode.values[1]``, an attribute an IntFlag member does
   not have: without it the report of an EAGLE engine fails after the run) — ``(value, name)``, so the
   report says ``EAGLE``; nothing is replaced where the attribute exists;
3. runs trtllm-bench's own CLI entry point (``tensorrt_llm.commands.bench:main``) with the arguments
   unchanged.

It fails with one line and exit status 2 where TensorRT-LLM does not import.

What trtllm-bench needs beside the engine (``build --backend trtllm`` writes both into
``ENGINE_DIR/trtllm-bench/``; ``bench run --tool trtllm-bench`` writes its own copies into its work directory):

- ``extra_llm_api_options.yaml``: ``speculative_config`` with ``decoding_type: Eagle``, ``max_draft_len: K``,
  the chain ``eagle_choices`` and ``speculative_model_dir`` (asserted not None on the TensorRT path; set to the
  model folder, an existing directory; read, not run: never loaded for a prebuilt engine). Without it the
  runtime gets no ``eagle_choices`` and the report no draft statistics.
- ``model/`` for ``--model_path``: the target's tokenizer files, a ``config.json`` that transformers'
  ``AutoConfig`` loads (a model type every transformers release that TensorRT-LLM 1.2 runs with knows —
  the target's own when it is one of :data:`BENCH_MODEL_TYPES`, else ``llama`` — with the target's layer,
  head and hidden sizes), and a one-tensor ``model.safetensors`` (trtllm-bench asserts a non-zero parameter
  count from its header; the weights are in the engine). It is a descriptor, not a model.

The report: ``--report_json`` (the dictionary trtllm-bench prints its log report from) is read first; the
log text is the fallback (:func:`parse_report_text`). Both become the bench report's RUN block
(:func:`metrics_from_report`): throughput, request latency percentiles, TTFT / TPOT (``--streaming``) and
the mean acceptance length (trtllm-bench's: per request, output tokens / (decoding iterations + 1),
averaged over requests). What it does not measure is listed in :data:`UNAVAILABLE`.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import yaml

from ..engine.common import eagle_choices, shell_line
from ..errors import ConfigError, MissingDependencyError, raise_if_stop_requested
from ..plugins import LIBRARY_NAME
from ..sampling import request_temperature
from ..tokenizer import copy_tokenizer_files, has_tokenizer_files
from ..yaml_files import load_yaml_file
from .common import parse_concurrency
from .dataset import load_bench_requests, prompt_tokenizer_dir

FACTS_FILE = Path(__file__).with_name("trtllm_bench_1_2.yaml")
LAUNCHER_MODULE = "dflash2_trt.bench.trtllm_bench"
BENCH_DIR = "trtllm-bench"                      # inside an engine directory
MODEL_DIR = "model"                             # BENCH_DIR/MODEL_DIR: --model_path
OPTIONS_FILE = "extra_llm_api_options.yaml"     # BENCH_DIR/OPTIONS_FILE: --extra_llm_api_options
SAMPLER_FILE = "sampler_options.yaml"           # BENCH_DIR/SAMPLER_FILE: --sampler_options, greedy (1e-6)


def sampler_options(temperature: float, *, speculative: bool) -> dict | None:
    """trtllm-bench's ``--sampler_options`` (SamplingParams fields) for a run at a user temperature, or None (no
    file). The speculative engine is always told its temperature: TensorRT-LLM fills eagle_temperature with 1.0
    when a request has none and its EAGLE layer refuses 0, so greedy is GREEDY_REQUEST_TEMPERATURE
    (engine_io.yaml request_temperature). The baseline is TensorRT-LLM's own target engine, greedy by default; to
    sample it needs top_p 1.0 too, because TensorRT-LLM decodes top_k 0 / top_p 0 (the defaults) greedily whatever
    the temperature."""
    if speculative:
        return {"temperature": float(request_temperature(temperature))}
    return {"temperature": float(temperature), "top_p": 1.0} if temperature > 0 else None
PLACEHOLDER_TENSOR = "dflash2_trt.trtllm_bench_placeholder"
# model types transformers has known since Qwen3 (4.51); other targets get a llama descriptor of their sizes
BENCH_MODEL_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                     "qwen3": "Qwen3ForCausalLM"}
UNAVAILABLE = ["engine_steps", "target_tokens", "target_tokens_per_emitted_token",
               "decode_target_tokens_per_emitted_token", "acceptance.steps", "acceptance.histogram",
               "acceptance.per_position", "acceptance.per_position_conditional"]


@functools.lru_cache(maxsize=1)
def facts() -> dict:
    """The recorded facts (``trtllm_bench_1_2.yaml``)."""
    return load_yaml_file(FACTS_FILE)


# -------------------------------------------------------------------------------------------- launcher
def patch_bench(configuration, modes) -> list[str]:
    """Make trtllm-bench's engine path take an EAGLE-mode engine: ``configuration`` is
    ``tensorrt_llm.bench.dataclasses.configuration`` (its ``SPECULATIVE_MAP``), ``modes`` the
    ``SpeculativeDecodingMode`` class. Returns what was changed (empty when nothing needed it)."""
    f = facts()
    table = getattr(configuration, f["speculative_map"]["name"], None)
    if not isinstance(table, dict):
        raise RuntimeError(f"{configuration.__name__} has no {f['speculative_map']['name']} dict: not the "
                           f"trtllm-bench this launcher was written for (TensorRT-LLM {f['tensorrt_llm']})")
    try:
        none, eagle = modes["NONE"], modes["EAGLE"]
    except (KeyError, TypeError):
        raise RuntimeError(f"{modes!r} has no NONE/EAGLE members: not TensorRT-LLM {f['tensorrt_llm']}'s "
                           f"SpeculativeDecodingMode") from None
    want = f["speculative_decoding_mode"]["members"]
    if int(eagle) != want["EAGLE"] or int(none) != want["NONE"]:
        raise RuntimeError(f"SpeculativeDecodingMode.EAGLE = {int(eagle)}, NONE = {int(none)}; recorded "
                           f"{want['EAGLE']} / {want['NONE']}")
    changed = []
    if eagle not in table:
        if none not in table:
            raise RuntimeError(f"{f['speculative_map']['name']} has no NONE entry to reuse for EAGLE")
        table[eagle] = table[none]
        changed.append("SPECULATIVE_MAP[EAGLE] = SPECULATIVE_MAP[NONE] (no extra decoding mode)")
    if not hasattr(eagle, "values"):
        # the report reads values[1] of a non-NONE engine mode (reporting.py); an IntFlag member has no `values`
        modes.values = property(lambda self: (int(self), self.name))
        changed.append("SpeculativeDecodingMode members answer .values = (value, name) for the report")
    return changed


def _import_bench():
    f = facts()
    mod_name, fn_name = f["cli"]["entry_point"].split(":")
    configuration = importlib.import_module(f["speculative_map"]["module"])
    modes = getattr(importlib.import_module(f["speculative_decoding_mode"]["module"]),
                    f["speculative_decoding_mode"]["name"])
    return configuration, modes, getattr(importlib.import_module(mod_name), fn_name)


def main(argv=None) -> int:
    """``python -m dflash2_trt.bench.trtllm_bench ARGS``: patch, then trtllm-bench's entry point with ARGS."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        configuration, modes, entry = _import_bench()
    except (ImportError, OSError) as exc:
        print(f"{LAUNCHER_MODULE}: TensorRT-LLM {facts()['tensorrt_llm']} is not importable here ({exc}); "
              f"trtllm-bench runs where it is installed (pip install 'tensorrt-llm>=1.2,<1.3', a GPU machine)",
              file=sys.stderr)
        return 2
    for what in patch_bench(configuration, modes):
        print(f"[{LAUNCHER_MODULE}] {what}", file=sys.stderr)
    rc = entry(args=argv, prog_name=facts()["cli"]["console_script"])
    return 0 if rc is None else int(rc)


# ---------------------------------------------------------------------------------------- options file
def options_document(draft_len: int, speculative_model_dir) -> dict:
    """The ``--extra_llm_api_options`` document: the EAGLE chain of ``draft_len`` drafts."""
    if not isinstance(draft_len, int) or draft_len < 1:
        raise ConfigError(f"an EAGLE chain needs >= 1 draft, got {draft_len!r}", field="max_draft_len")
    return {"speculative_config": {"decoding_type": facts()["eagle_decoding_config"]["decoding_type"],
                                   "max_draft_len": draft_len, "eagle_choices": eagle_choices(draft_len),
                                   "speculative_model_dir": str(speculative_model_dir)}}


def options_text(draft_len: int, speculative_model_dir) -> str:
    head = ("# trtllm-bench --extra_llm_api_options for a DFlash2 engine (dflash2-trt): the EAGLE chain the\n"
            "# runtime needs; speculative_model_dir must be set (asserted), it is not loaded for a built engine.\n")
    return head + yaml.safe_dump(options_document(draft_len, speculative_model_dir), sort_keys=False,
                                 default_flow_style=None, width=100000)


# ---------------------------------------------------------------------------------------- model folder
def model_config_document(t) -> dict:
    """``config.json`` of the model folder from the target's parsed config (``TargetConfig``)."""
    raw = getattr(t, "raw", None)
    mt = raw.get("model_type") if isinstance(raw, Mapping) else None
    model_type = mt if mt in BENCH_MODEL_TYPES else "llama"
    eos = [int(e) for e in t.eos_token_ids]
    return {
        "architectures": [BENCH_MODEL_TYPES[model_type]], "model_type": model_type,
        "hidden_size": t.hidden_size, "intermediate_size": t.intermediate_size,
        "num_hidden_layers": t.num_hidden_layers, "num_attention_heads": t.num_attention_heads,
        "num_key_value_heads": t.num_key_value_heads, "head_dim": t.head_dim, "vocab_size": t.vocab_size,
        "max_position_embeddings": t.max_position_embeddings, "rms_norm_eps": t.rms_norm_eps,
        "tie_word_embeddings": bool(t.tie_word_embeddings), "dtype": t.dtype, "torch_dtype": t.dtype,
        **({"eos_token_id": eos[0] if len(eos) == 1 else eos} if eos else {}),
        "dflash2_trt": {"role": "trtllm-bench --model_path descriptor: tokenizer and sizes; the weights are in the "
                                "engine", "target_model_type": mt, "target_family": t.family},
    }


def write_model_folder(dst, *, target_dir, t) -> dict:
    """The ``--model_path`` folder in ``dst`` (created). Raises ConfigError when the target has no tokenizer
    (trtllm-bench always loads one)."""
    import numpy as np
    from safetensors.numpy import save_file

    if not has_tokenizer_files(target_dir):
        raise ConfigError("has no tokenizer files; trtllm-bench loads the tokenizer of --model_path",
                          source=target_dir)
    dst = Path(dst)
    names = copy_tokenizer_files(target_dir, dst)         # creates dst
    doc = model_config_document(t)
    (dst / "config.json").write_text(json.dumps(doc, indent=2) + "\n")
    save_file({PLACEHOLDER_TENSOR: np.zeros((1,), dtype=np.float32)}, str(dst / "model.safetensors"),
              metadata={"format": "pt", "dflash2_trt": "placeholder for trtllm-bench's parameter count"})
    return {"model_type": doc["model_type"], "target_model_type": doc["dflash2_trt"]["target_model_type"],
            "tokenizer_files": [n for n in names if n != "config.json"]}


def safetensors_parameter_count(path) -> int:
    """Sum of the element counts in a safetensors file's header (what trtllm-bench counts)."""
    import math
    import struct

    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n))
    return sum(math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__")


def check_model_folder(path) -> dict:
    """Load ``path`` the way trtllm-bench does (recorded in the facts file) with the transformers installed here:
    ``AutoConfig`` (its required fields, the dtype), ``AutoTokenizer`` and the safetensors parameter count.
    Returns what it found; raises ConfigError naming the file and the field otherwise."""
    from transformers import AutoConfig, AutoTokenizer

    f = facts()["model_path"]
    path = Path(path)
    try:
        cfg = AutoConfig.from_pretrained(str(path), trust_remote_code=False).to_dict()
    except Exception as exc:  # noqa: BLE001 - transformers raises many kinds
        raise ConfigError(f"AutoConfig cannot load it ({exc})", source=path / "config.json") from None
    found = {}
    for name, keys in f["required"].items():
        for k in keys:
            v = cfg
            for part in k.split("."):
                v = v.get(part) if isinstance(v, dict) else None
            if v is not None:
                found[name] = v
                break
        else:
            raise ConfigError(f"none of {', '.join(keys)} (trtllm-bench's ModelConfig.{name})",
                              source=path / "config.json")
    dtype = next((cfg[k] for k in f["dtype_keys"] if cfg.get(k) is not None), None)
    if dtype is not None and str(dtype) not in [d for d in f["dtype_allowed"] if d]:
        raise ConfigError(f"dtype {dtype!r} is not one of trtllm-bench's {f['dtype_allowed']}",
                          source=path / "config.json", field="dtype")
    try:
        tok = AutoTokenizer.from_pretrained(str(path), padding_side="left")
    except Exception as exc:  # noqa: BLE001
        raise ConfigError(f"AutoTokenizer cannot load it ({exc})", source=path) from None
    st = next((path / n for n in f["safetensors_files"] if (path / n).is_file()), None)
    if st is None:
        raise ConfigError(f"no {' or '.join(f['safetensors_files'])} (trtllm-bench counts parameters there)",
                          source=path)
    count = safetensors_parameter_count(st)
    if count <= 0:
        raise ConfigError("its tensors hold no elements (trtllm-bench asserts a non-zero parameter count)", source=st)
    return {**found, "dtype": dtype, "param_count": count, "tokenizer": type(tok).__name__,
            "eos_token_id": tok.eos_token_id}


def write_bench_files(engine_tmp, *, target_dir, t, draft_len: int, final_dir) -> dict:
    """``build --backend trtllm``: ``trtllm-bench/model/`` and ``trtllm-bench/extra_llm_api_options.yaml`` in the
    engine's temporary directory; paths inside name ``final_dir`` (where the engine is renamed to). Returns the
    manifest's ``trtllm_bench`` entry (``available`` False with the reason when the target has no tokenizer)."""
    root = Path(engine_tmp) / BENCH_DIR
    final_model = Path(final_dir) / BENCH_DIR / MODEL_DIR
    try:
        info = write_model_folder(root / MODEL_DIR, target_dir=target_dir, t=t)
        check_model_folder(root / MODEL_DIR)     # as trtllm-bench loads it, with this machine's transformers
    except ConfigError as exc:                   # the engine stays good; only the trtllm-bench files are left out
        shutil.rmtree(root, ignore_errors=True)
        return {"available": False, "why": str(exc)}
    (root / OPTIONS_FILE).write_text(options_text(draft_len, final_model))
    (root / SAMPLER_FILE).write_text(yaml.safe_dump(sampler_options(0.0, speculative=True)))   # greedy
    return {"available": True, "model_dir": f"{BENCH_DIR}/{MODEL_DIR}", "options": f"{BENCH_DIR}/{OPTIONS_FILE}",
            "sampler_options": f"{BENCH_DIR}/{SAMPLER_FILE}", **info}


# -------------------------------------------------------------------------------------------- commands
def launcher_argv(python: str | None = None) -> list[str]:
    return [python or sys.executable, "-m", LAUNCHER_MODULE]


def bench_argv(*, model_name: str, model_dir, engine_dir, dataset, options=None, concurrency: int | None = None,
               num_requests: int | None = None, eos_id: int | None = None, streaming: bool = True,
               warmup: int | None = None, kv_cache_fraction: float | None = None, report_json=None,
               output_json=None, sampler_options=None, workspace=None, python: str | None = None) -> list[str]:
    """The launcher's argv for one ``throughput --backend tensorrt`` run (no ``--max_seq_len``: asserted absent
    on that backend). ``options`` None: no speculative_config (a target-only baseline engine)."""
    cmd = launcher_argv(python) + ["--model", model_name, "--model_path", str(model_dir)]
    if workspace is not None:
        cmd += ["--workspace", str(workspace)]
    cmd += ["throughput", "--backend", "tensorrt", "--engine_dir", str(engine_dir), "--dataset", str(dataset)]
    if options is not None:
        cmd += ["--extra_llm_api_options", str(options)]
    if concurrency is not None:
        cmd += ["--concurrency", str(int(concurrency))]
    if num_requests is not None:
        cmd += ["--num_requests", str(int(num_requests))]
    cmd += ["--eos_id", str(-1 if eos_id is None else int(eos_id))]
    if warmup is not None:
        cmd += ["--warmup", str(int(warmup))]
    if kv_cache_fraction is not None:
        cmd += ["--kv_cache_free_gpu_mem_fraction", repr(float(kv_cache_fraction))]
    if sampler_options is not None:
        cmd += ["--sampler_options", str(sampler_options)]
    if streaming:
        cmd.append("--streaming")
    for flag, p in (("--report_json", report_json), ("--output_json", output_json)):
        if p is not None:
            cmd += [flag, str(p)]
    return cmd


def bench_env(plugin_lib) -> dict[str, str]:
    """What every process that deserialises the engine needs: the DFlash2 plugins preloaded."""
    return {"LD_PRELOAD": str(plugin_lib)} if plugin_lib else {}


def command_line(argv: list[str], env: dict[str, str] | None = None) -> str:
    return shell_line(argv, env)


def planned_command(*, engine_dir, target_key: str | None, draft_len: int, max_batch_size: int,
                    eos_id: int | None, kv_cache_fraction: float | None, dataset="DATASET.jsonl",
                    python: str | None = None) -> dict:
    """``build --dry-run``: the trtllm-bench command the engine directory will take (its own model folder and
    options file), run by ``python`` (TensorRT-LLM's interpreter; default: ``python`` on PATH)."""
    e = Path(engine_dir)
    argv = bench_argv(model_name=model_name(target_key), model_dir=e / BENCH_DIR / MODEL_DIR, engine_dir=e,
                      dataset=dataset, options=e / BENCH_DIR / OPTIONS_FILE, concurrency=max_batch_size,
                      eos_id=eos_id, kv_cache_fraction=kv_cache_fraction, report_json="report.json",
                      sampler_options=e / BENCH_DIR / SAMPLER_FILE, python=python or "python")
    env = bench_env(e / LIBRARY_NAME)
    return {"argv": argv, "env": env, "line": command_line(argv, env), "draft_len": draft_len}


def model_name(target_key: str | None) -> str:
    """trtllm-bench's required ``--model`` (a label in its report; the files come from --model_path)."""
    return f"dflash2-trt/{target_key or 'engine'}"


# ---------------------------------------------------------------------------------------------- report
_NUM = r"(-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|nan|inf|-inf)"


def _pct(d, scale=1.0) -> dict | None:
    if not isinstance(d, dict) or "p50" not in d:
        return None
    g = (lambda k: None if d.get(k) is None else float(d[k]) * scale)
    # std: None, the key every RUN distribution has (the project's own runs compute it, metrics.distribution)
    return {"mean": g("average"), "std": None, "p50": g("p50"), "p90": g("p90"), "p99": g("p99"), "min": g("minimum"),
            "max": g("maximum")}


def parse_report_json(doc) -> dict:
    """trtllm-bench's ``--report_json`` document, checked for the parts the bench report uses."""
    if not isinstance(doc, dict) or not isinstance(doc.get("performance"), dict) \
            or not isinstance(doc.get("request_info"), dict):
        raise ConfigError("not a trtllm-bench report (no performance / request_info)", field="--report_json")
    return doc


def parse_report_text(text: str) -> dict:
    """The parts of trtllm-bench's log report the bench report uses, in ``--report_json``'s shape (labels and
    tags from the facts file). Raises ConfigError when the text holds no report (the run failed before it)."""
    f = facts()["report"]
    where = {"request_info": ("num_requests", "avg_num_concurrent_requests", "avg_input_length", "avg_output_length"),
             "streaming_metrics": ("avg_ttft_ms", "avg_tpot_ms", "token_output_speed_tok_s")}
    doc: dict = {"request_info": {}, "performance": {}, "streaming_metrics": {}, "decoding_stats": {}}
    # the last report in the text, from its REQUEST DETAILS section on (the dataset summary printed after it
    # may repeat some labels: the first match after the section start is the report's)
    start = text.rfind("REQUEST DETAILS")
    text = text[start:] if start >= 0 else text
    for key, label in f["text_labels"].items():
        m = re.search(re.escape(label) + r":\s*" + _NUM + r"\s*$", text, re.MULTILINE)
        if m is None:
            continue
        section = next((s for s, keys in where.items() if key in keys), "performance")
        doc[section][key] = float(m.group(1))
    tags = f["text_tags"]
    for key, tag in tags.items():
        vals = {}
        for m in re.finditer(r"\[" + re.escape(tag) + r"\]\s+([A-Z0-9]+)\s*:\s*" + _NUM + r"\s*$", text, re.MULTILINE):
            vals.setdefault(m.group(1).lower(), float(m.group(2)))
        if vals:
            section = ("performance" if key == "request_latency_percentiles_ms" else
                       "streaming_metrics" if tag in ("TPOT", "TTFT", "GTPS") else "decoding_stats")
            doc[section][key] = vals
    m = re.search(r"DECODING STATISTICS \(([^)]*)\)", text)
    if m is not None:
        doc["decoding_stats"]["mode"] = m.group(1)
    if "num_requests" in doc["request_info"]:
        doc["request_info"]["num_requests"] = int(doc["request_info"]["num_requests"])
    if not doc["performance"] or "num_requests" not in doc["request_info"]:
        raise ConfigError("no trtllm-bench report in its output (did it fail? its log says why)",
                          field="trtllm-bench")
    for k in ("streaming_metrics", "decoding_stats"):
        if not doc[k]:
            doc.pop(k)
    return doc


def metrics_from_report(doc: dict) -> dict:
    """A bench report RUN block from a parsed trtllm-bench report (figures it does not measure are null)."""
    ri, perf = doc["request_info"], doc["performance"]
    st = doc.get("streaming_metrics") or {}
    dec = doc.get("decoding_stats") or {}
    n = int(ri["num_requests"])
    wall = perf.get("total_latency_ms")
    wall = None if wall is None else float(wall) / 1e3
    mean_in, mean_out = ri.get("avg_input_length"), ri.get("avg_output_length")
    al = (dec.get("acceptance_length_percentiles") or {}).get("average")
    return {
        "requests": n, "input_tokens": None if mean_in is None else int(round(mean_in * n)),
        "output_tokens": None if mean_out is None else int(round(mean_out * n)), "wall_s": wall,
        "requests_per_s": perf.get("request_throughput_req_s"),
        "output_tokens_per_s": perf.get("system_output_throughput_tok_s"),
        "latency_s": _pct(perf.get("request_latency_percentiles_ms"), 1e-3),
        "ttft_s": _pct(st.get("ttft_percentiles"), 1e-3), "itl_s": _pct(st.get("tpot_percentiles"), 1e-3),
        "engine_steps": None, "target_tokens": None, "target_tokens_per_emitted_token": None,
        "decode_target_tokens_per_emitted_token": None,
        "acceptance": {"mean": None if al is None else float(al), "steps": None, "histogram": None,
                       "per_position": None, "per_position_conditional": None, "emitted_mean": None},
        "decoding_mode": dec.get("mode"),
    }


# ----------------------------------------------------------------------------------------------- bench
def check_engine_config(engine_dir) -> dict:
    """ENGINE_DIR/config.json holds every key trtllm-bench reads (facts: engine_config_reads)."""
    p = Path(engine_dir) / "config.json"
    try:
        cfg = json.loads(p.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read ({exc})", source=p) from None
    for key in facts()["engine_config_reads"]["keys"]:
        v = cfg
        for part in key.split("."):
            if not isinstance(v, dict) or part not in v:
                raise ConfigError("missing; trtllm-bench reads it (not an engine trtllm-build wrote?)", source=p,
                                  field=key)
            v = v[part]
    return cfg


def tensorrt_llm_importable(python: str | None = None) -> bool:
    if python is None or Path(python).resolve() == Path(sys.executable).resolve():
        import importlib.util

        return importlib.util.find_spec("tensorrt_llm") is not None
    r = subprocess.run([python, "-c", "import importlib.util,sys; sys.exit(importlib.util.find_spec('tensorrt_llm') "
                        "is None)"], capture_output=True)
    return r.returncode == 0


def dataset_lines(specs: list[dict]) -> str:
    return "".join(json.dumps({"task_id": i, "input_ids": list(s["input_ids"]),
                               "output_tokens": int(s["output_tokens"])}, separators=(",", ":")) + "\n"
                   for i, s in enumerate(specs))


def engine_options_file(engine_dir, draft_len: int) -> Path | None:
    """The engine's own options file when it still describes this engine: the chain of ``draft_len`` and a
    ``speculative_model_dir`` that is the engine's model folder (it moves with the engine directory only if
    the build wrote a path inside it that still exists). None otherwise (``bench run`` writes a fresh one)."""
    e = Path(engine_dir)
    p = e / BENCH_DIR / OPTIONS_FILE
    try:
        doc = yaml.safe_load(p.read_text())
    except (OSError, yaml.YAMLError):
        return None
    model = e / BENCH_DIR / MODEL_DIR
    try:
        same = Path(doc["speculative_config"]["speculative_model_dir"]).resolve() == model.resolve()
    except (TypeError, KeyError):
        return None
    return p if same and model.is_dir() and doc == options_document(draft_len, doc["speculative_config"][
        "speculative_model_dir"]) else None


def _outputs(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def bench_trtllm_bench(engine_dir, dataset, *, manifest: dict, concurrency, num_requests: int | None = None,
                       temperature: float = 0.0, max_new_tokens: int = 64, stop_on_eos: bool = True,
                       baseline_engine_dir=None, plugin_lib: str | None = None, workdir=None, dry_run: bool = False,
                       python: str | None = None, runner=subprocess.run) -> dict:
    """trtllm-bench (through the launcher) per concurrency, speculative then the baseline engine if given; the
    report's measured part. ``dry_run``: the commands, nothing written or run."""
    import tempfile

    levels = parse_concurrency(concurrency)
    K = int(manifest["block_size"]) - 1
    e = Path(engine_dir)
    vocab = int(manifest.get("vocab_size") or 2**31 - 1)
    specs = load_bench_requests(dataset, vocab_size=vocab, default_output_tokens=max_new_tokens,
                                num_requests=num_requests, tokenizer_dir=prompt_tokenizer_dir(engine_dir, manifest))
    limit = (manifest.get("limits") or {}).get("max_seq_len")
    if limit:
        for i, s in enumerate(specs):
            if len(s["input_ids"]) + int(s["output_tokens"]) > int(limit):
                raise ConfigError(f"request {i}: {len(s['input_ids'])} prompt + {s['output_tokens']} output tokens "
                                  f"exceed the engine's max_seq_len {limit} (trtllm-bench refuses the dataset)",
                                  source=dataset)
    eos = [int(x) for x in manifest.get("eos_token_ids") or []] if stop_on_eos else []
    model_dir = e / BENCH_DIR / MODEL_DIR
    if plugin_lib is None:
        plugin_lib = str(e / LIBRARY_NAME)
    if not dry_run:
        if not tensorrt_llm_importable(python):
            raise MissingDependencyError(f"TensorRT-LLM is not importable by {python or sys.executable}: trtllm-bench "
                                         f"runs where tensorrt-llm 1.2 is installed (a GPU machine); --tool "
                                         f"gptmanager uses gptManagerBenchmark instead")
        if not (model_dir / "config.json").is_file():
            raise ConfigError(f"no {BENCH_DIR}/{MODEL_DIR}/ (written by `dflash2-trt build --backend trtllm` from "
                              f"this version on): rebuild the engine, or use --tool gptmanager", source=e)
        check_engine_config(e)
        if baseline_engine_dir is not None:
            check_engine_config(baseline_engine_dir)
        if not Path(plugin_lib).is_file():
            raise ConfigError("does not exist (the DFlash2 plugins every rank loads)", field="--plugin-lib")
    work = Path(workdir or "WORKDIR") if dry_run else (Path(workdir) if workdir else
                                                      Path(tempfile.mkdtemp(prefix="dflash2-trtllm-bench-")))
    ds, samp = work / "dataset.jsonl", work / "sampler_options.yaml"
    own = engine_options_file(e, K)
    opts = own.absolute() if own is not None else work / OPTIONS_FILE
    writes = [f"{ds} ({len(specs)} requests, token ids)"]
    notes = [] if (model_dir / "config.json").is_file() else [
        f"{model_dir} does not exist: rebuild the engine with this version (`build --backend trtllm` writes it)"]
    if own is None:
        writes.append(f"{opts} (speculative_config: Eagle, {K} drafts)")
    # sampler_options: the speculative run always names its temperature, the baseline only to sample
    spec_s, base_s = sampler_options(temperature, speculative=True), sampler_options(temperature, speculative=False)
    samp_base = work / "sampler_options_baseline.yaml" if base_s and baseline_engine_dir is not None else None
    writes.append(f"{samp} (temperature: {spec_s['temperature']:g}{' = greedy' if temperature == 0 else ''})")
    if samp_base is not None:
        writes.append(f"{samp_base} (temperature: {base_s['temperature']:g}, top_p: 1.0)")
    if not dry_run:
        work.mkdir(parents=True, exist_ok=True)
        ds.write_text(dataset_lines(specs))
        if own is None:
            opts.write_text(options_text(K, model_dir.absolute()))
        samp.write_text(yaml.safe_dump(spec_s))
        if samp_base is not None:
            samp_base.write_text(yaml.safe_dump(base_s))
    env = bench_env(plugin_lib)
    runs, commands, lines = [], [], []
    for c in levels:
        row = {"concurrency": c}
        outs = {}
        for mode, edir, spec in (("speculative", e, True), ("autoregressive", baseline_engine_dir, False)):
            if edir is None:
                row[mode] = None
                continue
            rep, out_json = work / f"report_{mode}_c{c}.json", work / f"outputs_{mode}_c{c}.json"
            cmd = bench_argv(model_name=model_name(manifest.get("target")), model_dir=model_dir.absolute(),
                             engine_dir=Path(edir).absolute(), dataset=ds, options=opts if spec else None,
                             concurrency=c, num_requests=len(specs), eos_id=eos[0] if eos else None,
                             kv_cache_fraction=(manifest.get("limits") or {}).get("kv_cache_free_gpu_mem_fraction"),
                             sampler_options=samp if spec else samp_base,
                             report_json=rep, output_json=out_json,
                             workspace=work / "workspace", python=python)
            commands.append(cmd)
            lines.append(command_line(cmd, env))
            if dry_run:
                row[mode] = None
                continue
            run_env = dict(os.environ)
            if env:
                run_env["LD_PRELOAD"] = ":".join(x for x in (env["LD_PRELOAD"], os.environ.get("LD_PRELOAD")) if x)
            raise_if_stop_requested()   # a stop whose exception was lost does not start the next run
            proc = runner(cmd, capture_output=True, text=True, env=run_env)
            text = (proc.stdout or "") + "\n" + (proc.stderr or "")
            if proc.returncode != 0:
                tail = [ln for ln in text.strip().splitlines() if ln.strip()][-1:] or ["(no output)"]
                raise ConfigError(f"exited {proc.returncode} at concurrency {c} ({mode}): {tail[0]}",
                                  field="trtllm-bench")
            doc = _outputs(rep)
            stats = parse_report_json(doc) if doc is not None else parse_report_text(text)
            row[mode] = metrics_from_report(stats)
            outs[mode] = _outputs(out_json)
        spec, ar = row.get("speculative"), row.get("autoregressive")
        row["speedup"] = (spec["output_tokens_per_s"] / ar["output_tokens_per_s"]
                          if spec and ar and spec["output_tokens_per_s"] and ar["output_tokens_per_s"] else None)
        a, b = outs.get("speculative"), outs.get("autoregressive")
        row["outputs_match"] = (a == b) if (temperature == 0 and a is not None and b is not None) else None
        runs.append(row)
    return {
        "backend": "trtllm", "tool": "trtllm-bench", "engine_dir": str(engine_dir), "target": manifest.get("target"),
        "block_size": K + 1, "draft_len": K, "tp_size": int(manifest.get("tp_size", 1)), "dataset_requests": specs,
        "settings": {"concurrency": levels, "num_requests": len(specs), "temperature": temperature, "seed": None,
                     "stop_on_eos": bool(stop_on_eos), "stop_token_ids": eos[:1], "max_new_tokens": max_new_tokens,
                     "warmup": True},
        "baseline": ({"kind": "target-only engine", "description": f"TensorRT-LLM engine {baseline_engine_dir} run "
                      f"without speculation by trtllm-bench"} if baseline_engine_dir else None),
        "runs": runs, "unavailable": list(UNAVAILABLE), "commands": commands, "command_lines": lines,
        "writes": writes, "notes": notes, "workdir": str(work),
    }


if __name__ == "__main__":
    sys.exit(main())
