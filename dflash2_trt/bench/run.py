"""``dflash2-trt bench run`` and ``bench project``: dispatch on the engine's backend, build the report,
add the projection, write the JSON and the plot."""

from __future__ import annotations

import time
from pathlib import Path

from ..checkpoint.writer import OutputWriteError
from ..engine.graph_rules import refuse_graphs
from ..errors import ConfigError
from ..overlap import refuse_overlap
from ..sampling import effective_temperature
from .common import STEPS_FORMAT, engine_backend, paired_target, parse_concurrency
from .io import atomic_write_bytes, atomic_write_json, check_output_file
from .plot import pyplot, render_png
from .projection import GPUS, project, published_pair_shapes, tau_from
from .report import build_report
from ..textfiles import json_loads


DEFAULT_PROJECT_CONTEXT = 1024
DEFAULT_PROJECT_TARGET = "qwen3.8-27b"
DEFAULT_COST_BASIS = "busy"


def _default_context(t, wanted: int) -> int:
    """The context of a projection whose ``--context-len`` was not given: ``wanted``, cut to what the target
    takes (its max_position_embeddings), so that a default never fails as if the user had given it."""
    limit = t.max_position_embeddings
    return min(wanted, limit) if limit else wanted


def _projection_for(report_like: dict, gpus, target_key: str, context: int | None, **kw) -> dict:
    t, d = published_pair_shapes(target_key)
    tau, info = tau_from(report=report_like, draft_len=d.block_size - 1, report_source="this run")
    if context is None:
        ds = report_like["dataset"]
        context = _default_context(t, max(1, round(ds["mean_input_len"] + ds["mean_output_tokens"] / 2)))
    doc = project(t, d, [GPUS[g] for g in gpus], concurrency=report_like["settings"]["concurrency"],
                  context=context, tau=tau, acceptance_info=info, **kw)
    mark_kv_capacity(doc, target_key)
    return doc


def mark_kv_capacity(doc: dict, target_key: str) -> None:
    """A roofline projection's capacity check (:func:`kv_capacity`): per GPU ``memory``, per point ``kv_fits``."""
    from ..engine.plan import prepare
    from .steps import config_dirs

    d, t = config_dirs(target_key)
    p = prepare(d, t, target_key=target_key, overrides={"tp_size": 1})   # once, for every GPU
    for entry in doc["gpus"]:   # the model prices any concurrency; whether its KV cache fits is said beside it
        cap = entry["memory"] = kv_capacity(p, GPUS[entry["gpu"]["key"]], doc["context_len"])
        for pt in entry["points"]:
            pt["kv_fits"] = None if cap["most_requests"] is None else pt["concurrency"] <= cap["most_requests"]


def _refuse_project_baseline(baseline_engine_dir) -> None:
    """TensorRT-LLM's tools (trtllm-bench, gptManagerBenchmark) take a stock target engine as the baseline; this
    project's ``baseline/`` (``build --baseline``) declares the DFlash2 engine's inputs and runs on the project runtime
    only: refused by name, not left to fail on the GPU."""
    if baseline_engine_dir is None:
        return
    from ..engine.pretrained import is_target_only

    p = Path(baseline_engine_dir) / "config.json"
    try:
        pre = json_loads(p.read_text()).get("pretrained_config") or {}
    except (OSError, ValueError, AttributeError):
        return                        # the tools' own checks report an unreadable config
    if isinstance(pre, dict) and is_target_only(pre):
        raise ConfigError("is this project's baseline engine (build --baseline): it runs on the project runtime only; "
                          "`bench run --runtime project` compares with it, while --baseline-engine-dir takes a stock "
                          "TensorRT-LLM target engine", source=p, field="pretrained_config.dflash2_engine.network")


def parse_gpus(text, field: str = "--gpu") -> list[str]:
    items = [t.strip().lower() for t in str(text).split(",") if t.strip()]
    bad = [t for t in items if t not in GPUS]
    if not items or bad:
        raise ConfigError(f"unknown GPU {bad[0] if bad else text!r}; known: {', '.join(GPUS)}", field=field)
    if len(set(items)) != len(items):   # as --concurrency: a repeat would project (and print) the same GPU twice
        raise ConfigError(f"a GPU is repeated in {text!r}", field=field)
    return items


def bench_run(engine_dir, dataset, *, backend: str = "auto", concurrency="1,4,16", num_requests=None,
              temperature: float = 0.0, seed: int = 0, max_new_tokens: int = 64, stop_on_eos: bool = True,
              baseline: bool = True, json_out=None, plot_out=None, project_gpus=None,
              project_target: str | None = None, context_len: int | None = None, progress: bool = False,
              keep_outputs: bool = False, baseline_engine_dir=None, benchmark_bin=None, plugin_lib=None,
              dry_run: bool = False, threads: int | None = 1, tool: str | None = None, runtime: str | None = None,
              trt=None, cuda_graphs: bool = False, simulate_graphs: bool = False) -> dict:
    """The bench report of ``engine_dir``. TensorRT-LLM engines on the executor path (``engine/trtllm/paths.py``):
    ``tool`` ``trtllm-bench`` (the default: through :mod:`.trtllm_bench`'s launcher) or ``gptmanager``
    (gptManagerBenchmark, :mod:`.gpu`); on the project-runtime path (``runtime`` auto gives it to the engines the
    executor cannot run, or ``project``): the project runtime over TensorRT (:mod:`.session`; ``trt``: the tensorrt
    module, its CPU stand-in in tests). ``cuda_graphs``: a cuda engine's generation steps, speculative and
    autoregressive alike, replayed from CUDA graphs (:mod:`.cpu`), or a TensorRT engine's on the project runtime
    (:mod:`.session`; ``simulate_graphs``: on the CPU, for tests)."""
    t0 = time.perf_counter()
    if backend not in ("auto", "cpu", "cuda", "trtllm"):
        raise ConfigError(f"must be auto, cpu, cuda or trtllm, got {backend!r}", field="--backend")
    if tool not in (None, "trtllm-bench", "gptmanager"):
        raise ConfigError(f"must be trtllm-bench or gptmanager, got {tool!r}", field="--tool")
    temperature = effective_temperature(temperature, "--temperature")   # below 1e-5: greedy, on both backends
    inputs = [("engine directory", engine_dir), ("dataset", dataset),
              ("baseline engine directory", baseline_engine_dir), ("benchmark binary", benchmark_bin),
              ("plugin library", plugin_lib)]
    refuse_overlap(json_out, "--json", inputs, force=False)      # bench has no --force
    refuse_overlap(plot_out, "--plot", inputs + [("--json report", json_out)], force=False)
    # before the run: the outputs' directories take a file, and an existing file is this command's own previous
    # report or plot (replaced), never another file (an engine's manifest)
    for p, f, kind in ((json_out, "--json", "run"), (plot_out, "--plot", "png")):
        if p is not None:
            check_output_file(p, field=f, replaces=kind)
    if plot_out is not None:
        if Path(plot_out).suffix and Path(plot_out).suffix.lower() != ".png":
            # the plot is PNG bytes whatever the name: out.svg held a PNG
            raise ConfigError(f"writes a PNG image: give a name ending in .png, got {str(plot_out)!r}", field="--plot")
        pyplot()                                      # a missing matplotlib fails before the run, not after
    # options that cannot apply are refused, not ignored: --project '' used to mean "no projection"
    gpus = parse_gpus(project_gpus, "--project") if project_gpus is not None else None
    if project_target is not None and gpus is None:
        raise ConfigError("applies to the projection only: give --project GPUS too", field="--project-target")
    project_target = project_target or DEFAULT_PROJECT_TARGET
    if context_len is not None:
        if gpus is None:
            raise ConfigError("applies to the projection only: give --project GPUS too", field="--context-len")
        if isinstance(context_len, bool) or not isinstance(context_len, int) or context_len < 1:
            raise ConfigError(f"must be an integer >= 1, got {context_len!r}", field="--context-len")
    if gpus is not None:   # the projection's target and context, checked before the measurement, not after it
        paired_target(project_target, field="--project-target")
        limit = published_pair_shapes(project_target)[0].max_position_embeddings
        if context_len is not None and limit and context_len > limit:
            raise ConfigError(f"must be an integer in [1, {limit}] (the target's max_position_embeddings), got "
                              f"{context_len}", field="--context-len")
    kind, man, cfg = engine_backend(engine_dir)
    if gpus is not None and kind not in ("cpu", "cuda"):
        raise ConfigError("the projection is made from a stand-in engine's measured acceptance; for a TensorRT-LLM "
                          "engine run `dflash2-trt bench project --acceptance-from REPORT.json`", field="--project")
    if backend != "auto" and backend != kind:
        raise ConfigError(f"is a {kind} engine (engine.json backend {kind!r}); --backend {backend} was asked",
                          source=engine_dir, field="backend")
    if cuda_graphs:
        refuse_graphs(kind)
    path = None

    def assemble(measured: dict) -> dict:
        """The report document from a backend's measured part."""
        report = build_report(measured, dataset)
        for k in ("tool", "commands", "command_lines", "writes", "notes", "baseline_error"):
            if k in measured:
                report[k] = measured[k]
        if path is not None:
            report["runtime_path"] = path
        report["wall_s"] = time.perf_counter() - t0
        return report

    if kind == "trtllm":
        from ..engine.trtllm.paths import PROJECT, choose_runtime
        from ..engine.trtllm.runner import refuse_graphs_off_the_project_path

        path = choose_runtime(runtime, (cfg or {}).get("pretrained_config"), man)
        if cuda_graphs or simulate_graphs:
            refuse_graphs_off_the_project_path(True, path, (cfg or {}).get("pretrained_config") or {})
    elif runtime not in (None, "auto"):
        raise ConfigError(f"applies to TensorRT-LLM engines only (this is a {kind} engine)", field="--runtime")
    executor_only = "/".join(name for name, value in (
        ("--baseline-engine-dir", baseline_engine_dir is not None), ("--benchmark-bin", benchmark_bin is not None),
        ("--plugin-lib", plugin_lib is not None), ("--dry-run", bool(dry_run)), ("--tool", tool is not None)) if value)
    if kind in ("cpu", "cuda"):
        from .cpu import bench_cpu

        if executor_only:   # named as given: the user asked for these, not for the other four
            raise ConfigError(f"applies to TensorRT-LLM engines only (this is a {kind} engine)", field=executor_only)
        measured = bench_cpu(engine_dir, dataset, concurrency=concurrency, num_requests=num_requests,
                             temperature=temperature, seed=seed, max_new_tokens=max_new_tokens,
                             stop_on_eos=stop_on_eos, baseline=baseline, progress=progress, keep_outputs=keep_outputs,
                             threads=threads, cuda_graphs=cuda_graphs, simulate_graphs=simulate_graphs)
    elif path["path"] == PROJECT:
        from .session import bench_session

        if executor_only:
            raise ConfigError(f"applies to TensorRT-LLM's executor path; this engine runs on the project runtime "
                              f"({'; '.join(path['why'])}), whose baseline is the engine directory's own "
                              f"(build --baseline)", field=executor_only)
        measured = bench_session(engine_dir, dataset, concurrency=concurrency, num_requests=num_requests,
                                 temperature=temperature, seed=seed, max_new_tokens=max_new_tokens,
                                 stop_on_eos=stop_on_eos, keep_outputs=keep_outputs, trt=trt, cuda_graphs=cuda_graphs,
                                 simulate_graphs=simulate_graphs, baseline=baseline, progress=progress,
                                 on_speculative=None if json_out is None else
                                 (lambda m: atomic_write_json(json_out, assemble({**m, "tool": "project-runtime"}))))
        measured["tool"] = "project-runtime"
    else:
        _refuse_project_baseline(baseline_engine_dir)
        man = dict(man)
        try:
            man.setdefault("vocab_size", int(cfg["pretrained_config"]["vocab_size"]))
        except (TypeError, KeyError, ValueError):
            pass
        if (tool or "trtllm-bench") == "trtllm-bench":
            from .trtllm_bench import bench_trtllm_bench

            if benchmark_bin is not None:
                raise ConfigError("names gptManagerBenchmark: it applies to --tool gptmanager", field="--benchmark-bin")
            measured = bench_trtllm_bench(engine_dir, dataset, manifest=man, concurrency=concurrency,
                                          num_requests=num_requests, temperature=temperature,
                                          max_new_tokens=max_new_tokens, stop_on_eos=stop_on_eos,
                                          baseline_engine_dir=baseline_engine_dir if baseline else None,
                                          plugin_lib=plugin_lib, dry_run=dry_run)
        else:
            from .gpu import bench_gpu

            measured = bench_gpu(engine_dir, dataset, manifest=man, concurrency=concurrency, num_requests=num_requests,
                                 temperature=temperature, max_new_tokens=max_new_tokens, stop_on_eos=stop_on_eos,
                                 baseline_engine_dir=baseline_engine_dir if baseline else None, binary=benchmark_bin,
                                 plugin_lib=plugin_lib, dry_run=dry_run)
            measured["tool"] = "gptmanager"
    if path is not None and path["path"] != PROJECT and isinstance(man.get("baseline"), dict):
        measured.setdefault("notes", []).append(
            "this engine directory's baseline/ (build --baseline) runs on the project runtime only: `bench run "
            "--runtime project` compares with it")
    report = assemble(measured)
    if gpus is not None:
        report["projection"] = _projection_for(report, gpus, project_target, context_len)
    png = render_png(report) if plot_out is not None else None   # a plot that fails leaves no report behind
    if json_out is not None:
        atomic_write_json(json_out, report)
    if png is not None:
        try:
            atomic_write_bytes(plot_out, png)
        except OutputWriteError as exc:
            # the measured report is complete: the table is still printed and the report named before this error
            report["plot_error"] = str(exc)
    return report


def bench_project(*, target: str | None = None, gpus=None, concurrency=None, context_len: int | None = None,
                  acceptance: float | None = None, acceptance_from=None, bandwidth_efficiency: float = 1.0,
                  compute_efficiency: float = 1.0, step_overhead_ms: float = 0.0, recurrent_verify: str | None = None,
                  json_out=None, costs_from=None, cost_basis: str | None = None) -> dict:
    """The speedup over autoregressive decoding per concurrency: the roofline model (costs assumed; ``gpus``
    default h200, ``concurrency`` 1,4,16,32, ``recurrent_verify`` replay, ``target`` qwen3.8-27b), or, with
    ``costs_from`` (a ``bench steps`` report), the step times measured there (costs measured; every measured
    concurrency by default; ``target`` default: the report's, and one given must be it). An option only the roofline
    model reads is refused with measured costs, not ignored, and ``cost_basis`` (default busy, wall for a cpu
    backend's report, which has no kernel times) without measured costs."""
    refuse_overlap(json_out, "--json", [("--acceptance-from report", acceptance_from),
                                        ("--costs-from report", costs_from)], force=False)
    if json_out is not None:
        check_output_file(json_out, field="--json", replaces="project")
    if costs_from is not None:
        given = [o for o, v in (("--gpu", gpus), ("--context-len", context_len), ("--recurrent-verify", recurrent_verify))
                 if v is not None]
        if given:
            raise ConfigError(f"{given[0]} applies to the roofline model; measured costs (--costs-from) are the "
                              f"report's GPU, context and recurrent state handling")
    elif cost_basis is not None:
        raise ConfigError("applies to measured costs only: give --costs-from STEPS.json too", field="--cost-basis")
    levels = parse_concurrency("1,4,16,32" if concurrency is None else concurrency)
    g = parse_gpus("h200" if gpus is None else gpus)
    report = None
    if acceptance_from is not None:
        report = read_report(acceptance_from)
    if costs_from is not None:
        return _measured_projection(target, costs_from, cost_basis, report, acceptance, acceptance_from, json_out,
                                    concurrency=None if concurrency is None else levels,
                                    roofline_options=(bandwidth_efficiency, compute_efficiency, step_overhead_ms))
    target = target or DEFAULT_PROJECT_TARGET
    t, d = published_pair_shapes(target)
    if recurrent_verify is not None and "linear" not in t.layer_kinds:
        raise ConfigError(f"applies to targets with Gated DeltaNet (recurrent) layers; {target} has none",
                          field="--recurrent-verify")   # checked, not ignored (it was recorded and changed nothing)
    if context_len is None:
        context_len = _default_context(t, DEFAULT_PROJECT_CONTEXT)
    tau, info = tau_from(acceptance=acceptance, report=report, draft_len=d.block_size - 1, report_source=acceptance_from,
                         target=target)
    doc = project(t, d, [GPUS[k] for k in g], concurrency=levels, context=context_len, tau=tau, acceptance_info=info,
                  bw_eff=bandwidth_efficiency, fl_eff=compute_efficiency, step_overhead_s=step_overhead_ms / 1e3,
                  recurrent=recurrent_verify or "replay")
    mark_kv_capacity(doc, target)
    if json_out is not None:
        atomic_write_json(json_out, doc)
    return doc


def kv_capacity(p, gpu, context: int) -> dict:
    """How many requests of ``context`` tokens a TensorRT-LLM engine of the prepared pair ``p`` (its build config at
    tp 1) keeps in its KV cache on ``gpu`` at once: ``build --dry-run``'s sizing (engine/plan.py :func:`sizing`: the
    ``kv_cache_free_gpu_mem_fraction`` of the memory the weights, the activations' estimate and the reserve leave; a
    request's KV at every attention layer of the target and the drafter, its 2K extra slots, whole blocks, and on a
    hybrid target its recurrent-state slot). ``most_requests`` None where the family has no weight map."""
    from ..engine.plan import GIB, kv_request_bytes, sizing

    z = sizing(p, gpu.memory_bytes / GIB)
    per = (kv_request_bytes(context, z["extra_slots_per_request"], p.cfg.tokens_per_block, z["kv"]["bytes_per_token"])
           + z["recurrent_state_bytes_per_request"])
    budget = z["kv_budget"]
    return {"gpu_memory_bytes": gpu.memory_bytes, "memory_source": gpu.memory_source, "context_len": context,
            "kv_cache_free_gpu_mem_fraction": z["kv_cache_free_gpu_mem_fraction"], "kv_budget": budget,
            "bytes_per_request": per, "most_requests": None if budget is None else budget // per,
            "rule": "build --dry-run's sizing (engine/plan.py sizing), tp 1"}


def _measured_projection(target, costs_from, basis, report, acceptance, acceptance_from, json_out, *, concurrency,
                         roofline_options) -> dict:
    """bench project --costs-from: speedups from a `bench steps` report's measured step times."""
    from .projection import measured_projection

    if roofline_options != (1.0, 1.0, 0.0):
        raise ConfigError("apply to the roofline model; measured costs (--costs-from) take the report's times",
                          field="--bandwidth-efficiency/--compute-efficiency/--step-overhead-ms")
    p = Path(costs_from)
    steps = read_report(p)
    if not isinstance(steps, dict) or steps.get("format") != STEPS_FORMAT:   # before anything is read from it
        raise ConfigError(f"not a `bench steps` report (format {STEPS_FORMAT!r}, points[])", source=p)
    measured = steps.get("target")
    if target is None and isinstance(measured, str):
        target = measured                   # the report names what it measured: --target only to insist on one
    if measured != target:
        raise ConfigError(f"measured {measured!r}, not {target!r}", source=p, field="target")
    if basis is None:                       # a CPU has no kernel times: its report's costs are wall times
        basis = "wall" if steps.get("backend") == "cpu" else DEFAULT_COST_BASIS
    draft_len = steps.get("draft_len")
    if acceptance is None and report is None and steps.get("acceptance"):
        rec = steps["acceptance"]   # the file's value, so a bad one names the file, not --acceptance
        if (isinstance(rec, bool) or not isinstance(rec, (int, float)) or not isinstance(draft_len, int)
                or not 1.0 <= rec <= draft_len + 1):
            top = draft_len + 1 if isinstance(draft_len, int) else "?"
            raise ConfigError(f"must be a number in [1, draft_len + 1 = {top}], got {rec!r} (or pass --acceptance)",
                              source=p, field="acceptance")
        tau, info = float(rec), {"kind": "given", "mean": float(rec),
                                 "source": "the article's, recorded in the steps report"}
    else:
        tau, info = tau_from(acceptance=acceptance, report=report, draft_len=draft_len, report_source=acceptance_from,
                             target=target)
    doc = measured_projection(steps, tau=tau, acceptance_info=info, source=p, concurrency=concurrency, basis=basis)
    if json_out is not None:
        atomic_write_json(json_out, doc)
    return doc


def read_report(path) -> object:
    """A JSON report file's contents; an unreadable or malformed file is one line naming it."""
    p = Path(path)
    try:
        return json_loads(p.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror or exc}", source=p) from None
    except ValueError as exc:
        raise ConfigError(f"invalid JSON ({exc})", source=p) from None
