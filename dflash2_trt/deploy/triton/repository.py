"""``dflash2-trt deploy triton``: a Triton model repository for an engine directory.

The layout is TensorRT-LLM's ``inflight_batcher_llm`` one, generated from the project's own
templates (``templates/``)::

    REPO/
      preprocessing/   config.pbtxt, 1/model.py    text -> input_ids (the target's tokenizer)
      tensorrt_llm/    config.pbtxt, 1/[model.py]  the engine: TensorRT-LLM backend tensors
      postprocessing/  config.pbtxt, 1/model.py    output_ids -> text
      ensemble/        config.pbtxt, 1/            text_input, max_tokens, ... -> text_output
      launch.sh                                    (tensorrtllm backend) tritonserver + LD_PRELOAD;
                                                   tp > 1: mpirun, one tritonserver rank per GPU;
                                                   (python backend, a tp > 1 TensorRT engine) mpirun:
                                                   tritonserver as rank 0, the other ranks followers

``tensorrt_llm`` is served by ``backend: "tensorrtllm"`` (TensorRT-LLM's executor) for a TensorRT-LLM engine on
the executor path, or by a python-backend model on the project runtime (``models/tensorrt_llm_python.py``) for a CPU
or cuda engine and for a TensorRT-LLM engine on the project path (the engines the executor refuses: the model binds
the rank engine through TensorRT, docs/trt-session.md §8); the two configs come from one template and differ only
in ``backend`` and ``parameters``. ``dflash2_repository.json`` records which runtime the model uses. Every
``config.pbtxt`` is parsed strictly with Triton's own model-config protobuf (tritonclient's
``model_config_pb2``) and the ensemble's wiring is checked against the composing models before the
repository is renamed into place (:class:`~dflash2_trt.checkpoint.writer.AtomicOutputDir`: an
error leaves nothing behind). Without a tokenizer only ``tensorrt_llm`` is written (``ids_only``).
"""

from __future__ import annotations

import json
import re
import shutil
import string
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ... import __version__
from ...checkpoint.writer import AtomicOutputDir
from ...sampling import GREEDY_BELOW, GREEDY_REQUEST_TEMPERATURE
from ...engine.format import ENGINE_FORMAT, check_block_size, check_manifest_fields, load_engine_dir
from ...engine.graph_rules import refuse_graphs
from ...engine.pretrained import on_context_route
from ...errors import ConfigError, MissingDependencyError
from ...overlap import refuse_overlap
from ...tokenizer import engine_tokenizer_dir, find_tokenizer
from ...textfiles import json_loads

HERE = Path(__file__).resolve().parent
TEMPLATES = HERE / "templates"
MODELS = HERE / "models"
BACKENDS = ("python", "tensorrtllm")
MODEL_NAMES = ("preprocessing", "tensorrt_llm", "postprocessing")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
# The package itself, not the [triton] extra that holds it: in TensorRT-LLM's own environment (this project installed
# --no-deps, docs/trt-session.md §11) the extra would resolve this project's dependencies and move its transformers
TRITON_EXTRA = ("pip install nvidia-pytriton==0.7.0 (tritonserver + tritonclient: this project's [triton] extra, "
                "named alone: in TensorRT-LLM's own environment the extra would move its transformers; beside "
                "TensorRT-LLM's pins it is not yet tried, docs/trt-session.md §11)")


@dataclass
class RepositoryResult:
    output: Path
    backend: str
    runtime: str             # "project" (the python model) or "executor" (TensorRT-LLM's, the tensorrtllm backend)
    decoupled: bool
    max_batch_size: int
    ensemble: str | None
    tokenizer_dir: Path | None
    models: list[str]
    notes: list[str] = field(default_factory=list)


# ---- templates -----------------------------------------------------------------------------------
def fill(template: str, values: dict[str, object], *, source: str = "template") -> str:
    """``string.Template`` substitution where every placeholder must be given and every given value
    used (as TensorRT-LLM's fill_template.py insists): a typo is an error, not a silent default."""
    t = string.Template(template)
    names = set()
    for m in t.pattern.finditer(template):
        if m.group("invalid") is not None:
            raise ConfigError(f"invalid placeholder at offset {m.start()}", source=source)
        name = m.group("named") or m.group("braced")
        if name:
            names.add(name)
    missing, unused = sorted(names - set(values)), sorted(set(values) - names)
    if missing or unused:
        raise ConfigError(f"placeholders missing values: {missing}; values without placeholders: {unused}",
                          source=source)
    return t.substitute({k: str(v) for k, v in values.items()})


def read_template(name: str) -> str:
    return (TEMPLATES / name).read_text()


def parameters_block(params: dict[str, str]) -> str:
    return "\n".join(f'parameters: {{\n  key: "{k}"\n  value: {{ string_value: "{_pbtxt_str(v)}" }}\n}}'
                     for k, v in params.items())


def _pbtxt_str(v) -> str:
    return str(v).replace("\\", "\\\\").replace('"', '\\"')


def refuse_spaced_python_models(repository, *, field: str | None = None, source=None,
                                advice: str = "choose a path without spaces") -> None:
    """Triton's python backend cannot load a model whose repository path holds whitespace: it starts each model's
    stub with the path in a command line split at spaces, and every stub dies at once ("terminate called after
    throwing an instance of 'std::invalid_argument' what(): stol", seen with tritonserver 2.x of nvidia-pytriton
    0.7.0), while the server waits out its readiness time with the models LOADING. Refused in one line."""
    where = str(Path(repository).absolute())
    if any(c.isspace() for c in where):
        raise ConfigError(f"{where!r} holds whitespace, and Triton's python backend cannot load a model from such a "
                          f"path (its stubs die at start: 'stol'): {advice}", field=field, source=source)


def eagle_chain(K: int) -> str:
    """TensorRT-LLM's ``eagle_choices`` for the linear draft chain of depth K: ``{0},{0,0},...``."""
    return ",".join("{" + ",".join(["0"] * d) + "}" for d in range(1, K + 1))


def tensorrt_llm_parameters(backend: str, *, engine_dir: Path, K: int,
                            kv_cache_free_gpu_mem_fraction: float = 0.9,
                            tokenizer_dir: Path | None = None, engine_backend: str = "cpu",
                            cuda_graphs: bool = False, target_only: bool = False) -> dict[str, str]:
    """The ``parameters`` of the tensorrt_llm model. The python model's are a subset of the GPU ones,
    with equal values (those it reads; the KV fraction only for a TensorRT-LLM engine, whose session has a KV pool
    on the GPU), but for ``cuda_graph_mode`` (``cuda_graphs``: the python model's graphs; the GPU model's parameter
    of that name is the executor's own mode, which this project does not turn on). The GPU ones include every parameter the tensorrtllm backend reads
    without a default (``tensorrtllm_backend.yaml``); guided decoding stays off (empty backend and tokenizer
    info: it does not combine with in-engine acceptance). ``target_only`` (the python model only): this project's own
    ``target_only`` parameter, the target alone decoding autoregressively (``decoding_mode`` auto, no
    ``eagle_choices``)."""
    common = {
        "gpt_model_type": "inflight_fused_batching",
        "gpt_model_path": str(engine_dir),
        "max_beam_width": "1",
        "exclude_input_in_output": "true",
        "decoding_mode": "eagle",
        "eagle_choices": eagle_chain(K),
    }
    if backend == "python":
        # cuda_graph_mode: the tensorrtllm backend's name for it (ExtendedRuntimePerfKnobConfig), written when on;
        # enable_chunked_context, its name too: the project runtime takes a prompt that does not fit a step in chunks
        # (written always, so that the knob is in view: "true", or "false" where $DFLASH2_CHUNKED_CONTEXT is 0)
        from ...chunking import chunked_context_default

        graphs = {"cuda_graph_mode": "true"} if cuda_graphs else {}
        if target_only:
            common = {k: v for k, v in common.items() if k != "eagle_choices"}
            common.update(decoding_mode="auto", target_only="true")
        python = {**common, "enable_chunked_context": "true" if chunked_context_default() else "false", **graphs}
        if engine_backend in ("trtllm", "cuda"):   # a GPU engine's pool (a cpu engine's holds every request)
            return {**python, "kv_cache_free_gpu_mem_fraction": f"{kv_cache_free_gpu_mem_fraction:g}"}
        return python
    return {**common,
            "FORCE_CPU_ONLY_INPUT_TENSORS": "no",
            "batch_scheduler_policy": "guaranteed_no_evict",
            "kv_cache_free_gpu_mem_fraction": f"{kv_cache_free_gpu_mem_fraction:g}",
            "enable_kv_cache_reuse": "false",
            "enable_chunked_context": "false",
            "normalize_log_probs": "true",
            "cancellation_check_period_ms": "100",
            "tokenizer_dir": "" if tokenizer_dir is None else str(tokenizer_dir),
            "xgrammar_tokenizer_info_path": "",
            "guided_decoding_backend": ""}


def tensorrtllm_backend_facts() -> dict:
    """``tensorrtllm_backend.yaml``: the parameters TensorRT-LLM's Triton backend reads without a default (source
    paths and commits inside)."""
    from ...yaml_files import load_yaml_file

    return load_yaml_file(HERE / "tensorrtllm_backend.yaml")


def check_tensorrtllm_parameters(cfg, *, source) -> None:
    """The tensorrt_llm model of a ``backend: "tensorrtllm"`` repository carries every parameter the backend
    reads with no fallback, each with a value it accepts (``tensorrtllm_backend.yaml``); else a ConfigError
    naming the parameter, as the backend would fail the load ("Cannot find parameter with name: ...")."""
    facts = tensorrtllm_backend_facts()
    params = {k: v.string_value for k, v in cfg.parameters.items()}
    for name, rule in {**facts["required"], **facts["effectively_required"]}.items():
        if name not in params:
            raise ConfigError("missing: TensorRT-LLM's Triton backend reads it with no default and fails the load "
                              f"(Cannot find parameter with name: {name})", source=source, field=f"parameters.{name}")
        v = params[name]
        if "allowed" in (rule or {}) and v not in rule["allowed"]:
            raise ConfigError(f"{v!r} is not one of {rule['allowed']} (the backend throws)", source=source,
                              field=f"parameters.{name}")
        if (rule or {}).get("must_exist") and not v:
            raise ConfigError("empty: the backend needs an existing path", source=source, field=f"parameters.{name}")
    for name in facts["forbidden"]:
        if name in params:
            raise ConfigError("given: the backend refuses it", source=source, field=f"parameters.{name}")
    for name, v in params.items():
        if "${" in v:
            raise ConfigError(f"unfilled template value {v!r}", source=source, field=f"parameters.{name}")


# ---- config checks -------------------------------------------------------------------------------
def _pb():
    try:
        from google.protobuf import text_format
        from tritonclient.grpc import model_config_pb2
    except ImportError as exc:
        raise MissingDependencyError(f"checking config.pbtxt needs tritonclient ({exc.name} missing): "
                                     f"{TRITON_EXTRA}") from None
    return text_format, model_config_pb2


def parse_config(text: str, *, source: str | Path):
    """Strict text-format parse into Triton's ``inference.ModelConfig`` (unknown fields and bad enum
    values are errors)."""
    text_format, pb = _pb()
    try:
        return text_format.Parse(text, pb.ModelConfig())
    except text_format.ParseError as exc:
        raise ConfigError(f"not a valid Triton model config: {exc}", source=source) from None


def _dims(t) -> list[int]:
    return list(t.reshape.shape) if t.HasField("reshape") else list(t.dims)


def check_ensemble(ensemble, models: dict, *, source: str | Path = "ensemble/config.pbtxt") -> None:
    """The ensemble's steps name existing models and tensors, every step input is an ensemble input
    or an earlier step's output of the same data type, and every ensemble output is produced."""
    available = {t.name: t.data_type for t in ensemble.input}
    for i, step in enumerate(ensemble.ensemble_scheduling.step):
        where = f"ensemble_scheduling.step[{i}] ({step.model_name})"
        m = models.get(step.model_name)
        if m is None:
            raise ConfigError(f"model {step.model_name!r} is not in the repository", source=source, field=where)
        m_in = {t.name: t for t in m.input}
        m_out = {t.name: t for t in m.output}
        for key, value in step.input_map.items():
            if key not in m_in:
                raise ConfigError(f"input_map key {key!r} is not an input of {step.model_name}", source=source,
                                  field=where)
            if value not in available:
                raise ConfigError(f"input_map value {value!r} is neither an ensemble input nor an earlier output",
                                  source=source, field=where)
            if available[value] != m_in[key].data_type:
                raise ConfigError(f"{value!r} feeds {step.model_name}.{key} with another data type", source=source,
                                  field=where)
        for name, t in m_in.items():
            if not t.optional and name not in step.input_map:
                raise ConfigError(f"required input {name!r} of {step.model_name} is not mapped", source=source,
                                  field=where)
        for key, value in step.output_map.items():
            if key not in m_out:
                raise ConfigError(f"output_map key {key!r} is not an output of {step.model_name}", source=source,
                                  field=where)
            available[value] = m_out[key].data_type
    for t in ensemble.output:
        if t.name not in available:
            raise ConfigError(f"ensemble output {t.name!r} is produced by no step", source=source, field="output")
        if available[t.name] != t.data_type:
            raise ConfigError(f"ensemble output {t.name!r} has another data type than its producer", source=source,
                              field="output")


def check_repository(repo: str | Path) -> dict:
    """Parse every ``*/config.pbtxt`` of a repository strictly and check the ensemble(s); returns
    {model name: ModelConfig}."""
    repo = Path(repo)
    models = {}
    for cfg_path in sorted(repo.glob("*/config.pbtxt")):
        cfg = parse_config(cfg_path.read_text(), source=cfg_path)
        if cfg.name != cfg_path.parent.name:
            raise ConfigError(f"name {cfg.name!r} differs from its directory {cfg_path.parent.name!r}",
                              source=cfg_path, field="name")
        if not (cfg_path.parent / "1").is_dir():
            raise ConfigError("no version directory 1/", source=cfg_path.parent)
        models[cfg.name] = cfg
    for name, cfg in models.items():
        if cfg.backend == "tensorrtllm":
            check_tensorrtllm_parameters(cfg, source=repo / name / "config.pbtxt")
        if cfg.platform == "ensemble":
            check_ensemble(cfg, models, source=repo / name / "config.pbtxt")
    return models


# ---- the engine ----------------------------------------------------------------------------------
def read_engine(engine_dir: str | Path) -> tuple[dict, dict]:
    """(engine config, manifest). CPU engines are fully checked (load_engine_dir); a TensorRT-LLM
    engine directory's engine.json and config.json are read as ``build --backend trtllm`` writes them."""
    engine_dir = Path(engine_dir)
    man_path = engine_dir / "engine.json"
    if not engine_dir.is_dir():
        raise ConfigError("engine directory not found", source=engine_dir)
    if not man_path.is_file():
        raise ConfigError("not an engine directory (no engine.json; build one with `dflash2-trt build`)",
                          source=engine_dir)
    try:
        man = json_loads(man_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read: {exc}", source=man_path) from None
    if not isinstance(man, dict) or man.get("format") != ENGINE_FORMAT:
        raise ConfigError(f"format {man.get('format') if isinstance(man, dict) else None!r}, expected "
                          f"{ENGINE_FORMAT!r}", source=man_path, field="format")
    if man.get("backend") in ("cpu", "cuda"):
        return load_engine_dir(engine_dir)
    if man.get("backend") == "trtllm":
        for k in ("block_size", "limits"):
            if k not in man:
                raise ConfigError("missing", source=man_path, field=k)
        try:   # TensorRT-LLM's engine config: pretrained_config + build_config
            cfg = json_loads((engine_dir / "config.json").read_text())
            cfg["pretrained_config"]["vocab_size"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"no TensorRT-LLM engine config with pretrained_config.vocab_size ({exc})",
                              source=engine_dir / "config.json") from None
        check_manifest_fields(man, man_path)
        check_block_size(man, cfg, man_path)
        return cfg, man
    raise ConfigError(f"backend {man.get('backend')!r}: expected 'cpu', 'cuda' or 'trtllm'", source=man_path,
                      field="backend")


def _tokenizer_for(engine_dir: Path, man: dict, tokenizer: str | Path | None, vocab: int):
    """(tokenizer directory, loaded tokenizer) or (None, None) when the engine has none."""
    if tokenizer is not None:
        d = Path(tokenizer)
        if not d.is_dir():
            raise ConfigError("tokenizer directory not found", source=d, field="--tokenizer")
    else:
        d = engine_tokenizer_dir(engine_dir, man)
        if d is None:
            return None, None
    tok = find_tokenizer(d, strict=True)   # files that fail to load: the reason, not "no tokenizer"
    if tok is None:
        raise ConfigError("no usable tokenizer (tokenizer.json, tokenizer.model, vocab.json or tiktoken.model "
                          "loadable by transformers)", source=d, field="--tokenizer")
    if len(tok) > vocab:
        # ids the engine has no row for would be an out-of-range lookup, not an error message
        raise ConfigError(f"the tokenizer has {len(tok)} tokens, the engine's vocabulary {vocab}", source=d,
                          field="--tokenizer")
    return d.resolve(), tok


# ---- the repository ------------------------------------------------------------------------------
def deploy_triton(engine_dir: str | Path, output: str | Path, *, model_name: str | None = None,
                  max_batch_size: int | None = None, decoupled: bool = False, tokenizer: str | Path | None = None,
                  backend: str = "auto", ids_only: bool = False, force: bool = False,
                  kv_cache_free_gpu_mem_fraction: float | None = None, plugin_lib: str | Path | None = None,
                  cuda_graphs: bool = False, target_only: bool = False, command=None) -> RepositoryResult:
    """The repository for ``engine_dir`` at ``output``. ``None`` is an option not given (``model_name``
    "ensemble", ``kv_cache_free_gpu_mem_fraction`` 0.9): an option given where it cannot apply (``--tokenizer``
    or ``--model-name`` with ``--ids-only``, ``--plugin-lib`` or the KV fraction with the python backend; the
    tensorrtllm backend for a CPU or cuda engine, which TensorRT-LLM's executor cannot load) is refused, never
    ignored. ``cuda_graphs``: the python-backend model replays generation steps from CUDA graphs (its
    ``cuda_graph_mode`` parameter; a cuda engine, or a TensorRT engine on the project runtime). ``target_only``: the
    python model serves the engine's target alone, the autoregressive baseline ``bench run`` measures (a cpu or cuda
    engine's target, a TensorRT engine directory's ``baseline/``), so that a client compares the two servers."""
    if ids_only:
        given = [o for o, v in (("--tokenizer", tokenizer), ("--model-name", model_name)) if v is not None]
        if given:
            raise ConfigError(f"--ids-only and {given[0]} contradict each other: --ids-only writes the tensorrt_llm "
                              f"model alone, with no tokenizer and no text ensemble; give one or the other")
    engine_dir = Path(engine_dir)
    # the engine first: a directory that is no engine is named as such, not as an engine the output would overlap
    # (`serve --engine-dir /tmp`: its repository goes to a temporary directory inside /tmp)
    cfg, man = read_engine(engine_dir)
    check_manifest_fields(man, engine_dir / "engine.json", need_limits=True)   # the repository's max_batch_size bound
    refuse_overlap(output, "--output", [("engine directory", engine_dir), ("tokenizer directory", tokenizer),
                                        ("plugin library", plugin_lib)])
    notes = []
    tp = man.get("tp_size", 1)
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise ConfigError(f"must be a positive integer, got {tp!r}", source=engine_dir / "engine.json", field="tp_size")
    path = None   # a TensorRT-LLM engine's runtime path (engine/trtllm/paths.py)
    if man["backend"] == "trtllm":
        from ...engine.trtllm.paths import choose_runtime

        path = choose_runtime(None, (cfg or {}).get("pretrained_config"), man)
    if backend == "auto":
        # the python model on the project runtime where the executor will not run the engine; TensorRT-LLM's
        # executor for the rest
        # executor for the rest; the target alone (baseline/ for a TensorRT engine) only ever runs on the project's
        backend = ("python" if target_only or man["backend"] in ("cpu", "cuda") or path["path"] == "project"
                   else "tensorrtllm")
    if backend not in BACKENDS:
        raise ConfigError(f"must be one of auto, {', '.join(BACKENDS)}, got {backend!r}", field="--backend")
    if backend == "tensorrtllm" and man["backend"] in ("cpu", "cuda"):
        # TensorRT-LLM's executor opens TensorRT-LLM engine files at gpt_model_path: a repository for this engine
        # would fail its load (the python model on the project runtime serves it)
        raise ConfigError(f"a {man['backend']} engine: the tensorrtllm backend runs TensorRT-LLM engines only "
                          f"(`dflash2-trt build --backend trtllm` on a GPU machine); use --backend python or auto "
                          f"for a CPU/cuda engine", source=engine_dir, field="--backend tensorrtllm")
    if backend == "python" and man["backend"] == "trtllm":
        _check_project_runtime_engine(engine_dir, cfg, tp)
    if backend == "python" and plugin_lib is not None:
        what = ("loads TensorRT-LLM's plugin library and the engine directory's own libdflash2_plugins.so itself (the "
                "one the engine was built with)" if man["backend"] == "trtllm"
                else f"serves a {man['backend']} engine (no plugin library to preload)")
        raise ConfigError(f"--plugin-lib applies to the tensorrtllm backend only (launch.sh's LD_PRELOAD); the python "
                          f"backend {what}")
    if man["backend"] == "cpu" and kv_cache_free_gpu_mem_fraction is not None:
        raise ConfigError("--kv-cache-free-gpu-mem-fraction applies to GPU engines (TensorRT-LLM and cuda) only; a cpu "
                          "engine's KV pool, in host memory, holds every request at max_seq_len")
    if target_only and backend != "python":
        raise ConfigError("applies to the python-backend model (--backend python, the project's runtime): the "
                          "tensorrtllm backend serves the engine as TensorRT-LLM's executor runs it (a stock target "
                          "engine, trtllm-build of the HF target, is its autoregressive baseline)", field="--target-only")
    if target_only and man["backend"] == "trtllm":
        from .serving import refuse_target_only_trtllm

        refuse_target_only_trtllm(engine_dir, cfg, man)
    if cuda_graphs and backend != "python":
        raise ConfigError("applies to the python-backend model (--backend python, the project's runtime): the "
                          "tensorrtllm backend's own cuda_graph_mode is not turned on by this project, since it has "
                          "never run with a DFlash2 engine", field="--cuda-graphs")
    if cuda_graphs:
        refuse_graphs(man["backend"], tp)
    if backend == "tensorrtllm" and plugin_lib is not None and not Path(plugin_lib).is_file():
        raise ConfigError(f"{plugin_lib}: no such file", field="--plugin-lib")
    model_name = "ensemble" if model_name is None else model_name
    if kv_cache_free_gpu_mem_fraction is None:
        # the build's (engine.json limits, as `run` and RUN.md take it), else TensorRT-LLM's default
        kv_cache_free_gpu_mem_fraction = (man.get("limits") or {}).get("kv_cache_free_gpu_mem_fraction") or 0.9
        if not isinstance(kv_cache_free_gpu_mem_fraction, (int, float)) or isinstance(kv_cache_free_gpu_mem_fraction,
                                                                                       bool):
            raise ConfigError(f"must be a number, got {kv_cache_free_gpu_mem_fraction!r}",
                              source=engine_dir / "engine.json", field="limits.kv_cache_free_gpu_mem_fraction")
    if backend == "tensorrtllm" and on_context_route((cfg or {}).get("pretrained_config")):
        raise ConfigError("this engine's sliding-window layers take the context route (sliding_path context): they "
                          "read sliding_* inputs that no TensorRT-LLM runtime binds, so the tensorrtllm backend cannot load "
                          "it; --backend python serves it on the project runtime", field="--backend")
    if backend == "tensorrtllm" and path is not None and path["path"] == "project":
        fix = ("`--backend python` (the default for it) serves it on the project runtime (docs/trt-session.md §8"
               + (f"; tp {tp}: its launch.sh runs it as {tp} processes under mpirun)" if tp > 1 else ")"))
        notes.append(f"this engine's runtime path is the project runtime over TensorRT ({'; '.join(path['why'])}): "
                     f"the tensorrtllm backend (TensorRT-LLM's executor) will not run it on stock TensorRT-LLM 1.2; "
                     f"{fix}; `dflash2-trt run` / `bench run` drive it too")
    if not _NAME_RE.match(model_name) or model_name in MODEL_NAMES:
        raise ConfigError(f"{model_name!r} must be a plain model name other than {', '.join(MODEL_NAMES)}",
                          field="--model-name")
    limit = int(man["limits"]["max_batch_size"])
    mbs = limit if max_batch_size is None else int(max_batch_size)
    if not 1 <= mbs <= limit:
        raise ConfigError(f"must be in [1, {limit}] (the engine's max_batch_size), got {mbs}", field="--max-batch-size")
    if not 0 < kv_cache_free_gpu_mem_fraction < 1:   # TensorRT-LLM's KV cache manager checks freeMemFraction < 1
        raise ConfigError(f"must be in (0, 1), got {kv_cache_free_gpu_mem_fraction}",
                          field="--kv-cache-free-gpu-mem-fraction")
    vocab = int(cfg["pretrained_config"]["vocab_size"])
    K = int(man["block_size"]) - 1
    tok_dir, tok = (None, None) if ids_only else _tokenizer_for(engine_dir, man, tokenizer, vocab)
    if tok is None and not ids_only:
        raise ConfigError("has no tokenizer (no tokenizer/ and none in its target directory), so the text "
                          "ensemble cannot be made: give --tokenizer DIR, or --ids-only for a token-id-only "
                          "repository (tensorrt_llm alone)", source=engine_dir)
    refuse_overlap(output, "--output", [("tokenizer directory", tok_dir)])   # the engine's, or its target's
    if backend == "python" or not ids_only:
        refuse_spaced_python_models(output, field="--output")
    engine_abs = engine_dir.resolve()
    eos = [int(e) for e in man.get("eos_token_ids") or ()]
    with AtomicOutputDir(output, force=force) as tmp:
        params = tensorrt_llm_parameters(backend, engine_dir=engine_abs, K=K,
                                         kv_cache_free_gpu_mem_fraction=kv_cache_free_gpu_mem_fraction,
                                         tokenizer_dir=tok_dir, engine_backend=man["backend"],
                                         cuda_graphs=cuda_graphs, target_only=target_only)
        _write_model(tmp, "tensorrt_llm", fill(read_template("tensorrt_llm.pbtxt"), {
            "backend": backend, "max_batch_size": mbs, "decoupled": "true" if decoupled else "false",
            "max_queue_delay_microseconds": 0, "parameters": parameters_block(params)},
            source="templates/tensorrt_llm.pbtxt"),
            MODELS / "tensorrt_llm_python.py" if backend == "python" else None)
        models = ["tensorrt_llm"]
        if tok is not None:
            end_id = eos[0] if eos else (tok.eos_token_id if tok.eos_token_id is not None else -1)
            pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
            common = {"max_batch_size": mbs, "tokenizer_dir": _pbtxt_str(tok_dir), "tokenizer_instances": 1}
            _write_model(tmp, "preprocessing", fill(read_template("preprocessing.pbtxt"), {
                **common, "end_id": end_id, "pad_id": pad_id, "extra_stop_ids": ",".join(map(str, eos[1:])),
                "greedy_below": repr(GREEDY_BELOW), "greedy_request_temperature": repr(GREEDY_REQUEST_TEMPERATURE)},
                source="templates/preprocessing.pbtxt"), MODELS / "preprocessing.py")
            _write_model(tmp, "postprocessing", fill(read_template("postprocessing.pbtxt"), common,
                                                     source="templates/postprocessing.pbtxt"),
                         MODELS / "postprocessing.py")
            _write_model(tmp, model_name, fill(read_template("ensemble.pbtxt"), {
                "ensemble_name": model_name, "max_batch_size": mbs}, source="templates/ensemble.pbtxt"), None)
            models += ["preprocessing", "postprocessing", model_name]
        ranks = backend == "python" and man["backend"] == "trtllm" and tp > 1
        if ranks:
            # a tp TensorRT engine on the project runtime: rank 0 tritonserver, the other ranks followers, under mpirun
            launch = tmp / "launch.sh"
            launch.write_text(fill(read_template("launch_ranks.sh"), {"tp_size": tp, "tp_last": tp - 1},
                                   source="templates/launch_ranks.sh"))
            launch.chmod(0o755)
        if backend == "tensorrtllm":
            lib_name = (man.get("plugin_library") or {}).get("file") or "libdflash2_plugins.so"
            lib = Path(plugin_lib).resolve() if plugin_lib is not None else engine_abs / lib_name
            launch = tmp / "launch.sh"
            launch.write_text(fill(read_template("launch.sh"), {"plugin_lib": lib, "tp_size": tp},
                                   source="templates/launch.sh"))
            launch.chmod(0o755)
        try:
            check_repository(tmp)
        except ConfigError as exc:   # named as the output it would have been, not the temporary directory (gone)
            source = None if exc.source is None else str(exc.source).replace(str(tmp), str(Path(output)))
            raise ConfigError(f"{exc.reason} (as generated: nothing was written)", source=source,
                              field=exc.field) from None
        runtime, runtime_description = _model_runtime(backend, man["backend"])
        (tmp / "dflash2_repository.json").write_text(json.dumps({
            "format": "dflash2-trt triton repository", "backend": backend, "runtime": runtime,
            "runtime_description": runtime_description, "engine_backend": man["backend"],
            "engine_runtime_path": None if path is None else path["path"], "tp_size": tp,
            "launch": "launch.sh" if ranks or backend == "tensorrtllm" else None,
            "ranks": ({"processes": tp, "rank0": "tritonserver",
                       "followers": "python -m dflash2_trt.deploy.triton.follower --repository REPO"} if ranks
                      else None), "decoupled": decoupled,
            "max_batch_size": mbs, "ensemble": model_name if tok is not None else None, "target_only": target_only,
            "engine_dir": str(engine_abs), "tokenizer_dir": None if tok_dir is None else str(tok_dir),
            "models": models, "dflash2_trt": __version__, "python": sys.version.split()[0],
            "command": command or []}, indent=2) + "\n")
    return RepositoryResult(Path(output), backend, runtime, decoupled, mbs, model_name if tok is not None else None,
                            tok_dir, models, notes)


def _model_runtime(backend: str, engine_backend: str) -> tuple[str, str]:
    """``(runtime, description)`` of the tensorrt_llm model: the python model's own (serving.model_runtime), or
    TensorRT-LLM's executor behind the tensorrtllm backend."""
    if backend == "python":
        from .serving import model_runtime

        return model_runtime(engine_backend)
    from ...engine.trtllm.paths import DESCRIPTION, EXECUTOR

    return EXECUTOR, DESCRIPTION[EXECUTOR]


def _check_project_runtime_engine(engine_dir: Path, cfg: dict, tp: int) -> None:
    """What the python model will need to open a TensorRT-LLM engine on the project runtime, checked before anything
    is written (engine/trtllm/session.py: every ``rank{r}.engine``, the tp both files agree on, the limits it reads
    from config.json)."""
    from ...engine.trtllm.session import session_limits

    mapping = ((cfg or {}).get("pretrained_config") or {}).get("mapping") or {}
    mapped = mapping.get("tp_size", 1) if isinstance(mapping, dict) else None
    if mapped != tp or isinstance(mapped, bool):
        raise ConfigError(f"--backend python: engine.json says tp {tp}, config.json's pretrained_config.mapping says "
                          f"{mapped!r}", source=engine_dir / "config.json", field="pretrained_config.mapping.tp_size")
    for r in range(tp):
        if not (engine_dir / f"rank{r}.engine").is_file():
            raise ConfigError(f"--backend python: no rank{r}.engine (the TensorRT engine "
                              f"{'the project runtime opens' if tp == 1 else f'rank {r} of the tp {tp} engine opens'})",
                              source=engine_dir)
    try:
        session_limits(cfg)
    except ConfigError as exc:
        raise ConfigError(f"--backend python: {exc}", source=engine_dir / "config.json") from None
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"--backend python: the project runtime cannot read the engine's limits "
                          f"(pretrained_config.dflash2, build_config: {type(exc).__name__}: {exc})",
                          source=engine_dir / "config.json") from None


def _write_model(repo: Path, name: str, config: str, model_file: Path | None) -> None:
    d = repo / name
    (d / "1").mkdir(parents=True)
    (d / "config.pbtxt").write_text(config)
    if model_file is not None:
        shutil.copyfile(model_file, d / "1" / "model.py")
