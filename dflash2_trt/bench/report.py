"""The ``dflash2-trt bench run`` report: one JSON document with a stable schema, and its text form.

Top level (``schema_version`` 1; docs/benchmarks.md §2 is the reference)::

    format, schema_version       "dflash2-trt bench report", 1
    backend                      "cpu" | "cuda" | "trtllm"
    engine_dir, target, block_size, draft_len, tp_size
    dataset                      {path, sha256, requests, mean_input_len, mean_output_tokens}
    settings                     {concurrency, num_requests, temperature, seed, stop_on_eos,
                                  stop_token_ids, max_new_tokens, warmup, torch_threads (CPU),
                                  cuda_graphs (cpu, cuda and project-runtime engines)}
    baseline                     {kind, description} | null (no autoregressive run)
    baseline_error               project runtime: why its baseline engine failed after the speculative runs | null
                                 (other backends: absent)
    runs[]                       {concurrency, speculative: RUN, autoregressive: RUN | null,
                                  speedup (spec ÷ AR output tokens/s) | null,
                                  outputs_match (T = 0: every request's tokens equal) | null}
    unavailable[]                RUN fields this backend cannot measure (null in every RUN)
    tool, commands, command_lines, writes, notes
                                 TensorRT-LLM engines: "trtllm-bench" | "gptmanager", the argv of each run,
                                 the same with LD_PRELOAD, the files a --dry-run would write
    projection                   bench project's document | null
    environment                  {dflash2_trt, python, torch, platform, cpu_count}
    wall_s                       the whole command

RUN (:func:`.metrics.run_metrics` defines every figure): requests, input_tokens, output_tokens,
wall_s, requests_per_s, output_tokens_per_s, latency_s / ttft_s / itl_s ({mean, std, p50, p90,
p99, min, max} in seconds; std null where they are read from trtllm-bench's or gptManagerBenchmark's
report), engine_steps, target_tokens, target_tokens_per_emitted_token,
decode_target_tokens_per_emitted_token, acceptance {mean, steps, histogram, per_position,
per_position_conditional}; with ``bench run --cuda-graphs`` (settings.cuda_graphs true) also cuda_graphs
{replayed, captured, eager (this run's steps, summing to engine_steps), failed (why a capture failed, in this run or
an earlier one: graphs stay off after one), simulated}.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
from pathlib import Path

REPORT_FORMAT = "dflash2-trt bench report"
REPORT_SCHEMA = 1
RUN_FIELDS = ("requests", "input_tokens", "output_tokens", "wall_s", "requests_per_s", "output_tokens_per_s",
              "latency_s", "ttft_s", "itl_s", "engine_steps", "target_tokens", "target_tokens_per_emitted_token",
              "decode_target_tokens_per_emitted_token", "acceptance")


def _sha256(path) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def environment() -> dict:
    from .. import __version__

    try:
        import torch

        tv = torch.__version__
    except ImportError:  # pragma: no cover - torch is a dependency
        tv = None
    return {"dflash2_trt": __version__, "python": sys.version.split()[0], "torch": tv,
            "platform": platform.platform(), "cpu_count": os.cpu_count(), "packages": _package_versions()}


# Installed versions a report's numbers may depend on (the tokenizer's ids, TensorRT's kernels); null where absent.
_REPORTED_PACKAGES = ("transformers", "tokenizers", "numpy", "tensorrt", "tensorrt_llm", "nvidia-pytriton")


def _package_versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in _REPORTED_PACKAGES:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def build_report(measured: dict, dataset_path, *, projection: dict | None = None, wall_s: float | None = None) -> dict:
    """The report document from a backend's measured part (``cpu.bench_cpu`` / ``gpu.bench_gpu``)."""
    specs = measured["dataset_requests"]
    doc = {
        "format": REPORT_FORMAT, "schema_version": REPORT_SCHEMA,
        "backend": measured["backend"], "engine_dir": measured["engine_dir"], "target": measured.get("target"),
        "block_size": measured["block_size"], "draft_len": measured["draft_len"], "tp_size": measured["tp_size"],
        "dataset": {"path": str(dataset_path), "sha256": _sha256(dataset_path), "requests": len(specs),
                    "mean_input_len": sum(len(s["input_ids"]) for s in specs) / len(specs),
                    "mean_output_tokens": sum(int(s["output_tokens"]) for s in specs) / len(specs)},
        "settings": measured["settings"], "baseline": measured["baseline"], "runs": measured["runs"],
        "unavailable": list(measured.get("unavailable", [])), "projection": projection,
        "environment": environment(), "wall_s": wall_s if wall_s is not None else measured.get("measure_wall_s"),
    }
    return doc


def _f(x, spec=".1f", scale=1.0) -> str:
    return "-" if x is None else format(x * scale, spec)


def render(report: dict) -> str:
    """A table per concurrency: speculative vs autoregressive."""
    lines = [f"{report['backend']} engine {report['engine_dir']} (block {report['block_size']}, tp {report['tp_size']}), "
             f"{report['dataset']['requests']} requests from {report['dataset']['path']}, "
             f"T = {report['settings']['temperature']}"]
    if report.get("baseline"):
        lines.append(f"baseline: {report['baseline']['description']}")
    head = (f"{'conc':>4} {'mode':<14} {'req/s':>7} {'tok/s':>8} {'lat p50':>8} {'p90':>7} {'p99':>7} "
            f"{'ttft p50':>8} {'accept':>6} {'tgt/tok':>7} {'speedup':>7}")
    lines += [head, "-" * len(head)]
    for run in report["runs"]:
        for mode in ("speculative", "autoregressive"):
            m = run.get(mode)
            if m is None:
                continue
            lat, ttft = m["latency_s"] or {}, m["ttft_s"] or {}
            acc = (m.get("acceptance") or {}).get("mean")
            sp = run["speedup"] if mode == "speculative" else None
            lines.append(f"{run['concurrency']:>4} {mode:<14} {_f(m['requests_per_s'], '.2f'):>7} "
                         f"{_f(m['output_tokens_per_s']):>8} {_f(lat.get('p50'), '.3f'):>8} "
                         f"{_f(lat.get('p90'), '.3f'):>7} {_f(lat.get('p99'), '.3f'):>7} "
                         f"{_f(ttft.get('p50'), '.3f'):>8} {_f(acc, '.2f'):>6} "
                         f"{_f(m['target_tokens_per_emitted_token'], '.2f'):>7} {_f(sp, '.2f'):>7}")
        n = (run.get("speculative") or {}).get("requests")
        if isinstance(n, int) and n < run["concurrency"]:    # the label would overstate what ran
            lines.append(f"     {n} request(s) in this run: at most {n} in flight, not {run['concurrency']}")
        if run.get("outputs_match") is not None:
            lines.append(f"     outputs identical to autoregressive (T = 0): {run['outputs_match']}")
        cut = [(mode, (run.get(mode) or {}).get("chunked_steps")) for mode in ("speculative", "autoregressive")]
        if any(n for _, n in cut):     # a prompt's first token waited for its last chunk (chunked context)
            lines.append("     prompts cut in chunks (max_num_tokens "
                         f"{report['settings'].get('max_num_tokens', '?')}): "
                         + "; ".join(f"{mode} in {n} steps" for mode, n in cut if n is not None))
        graphs = [(mode, (run.get(mode) or {}).get("cuda_graphs")) for mode in ("speculative", "autoregressive")]
        if any(g for _, g in graphs):
            from ..engine.graph_rules import describe

            lines.append("     CUDA graphs: " + "; ".join(f"{mode} {describe(g)}" for mode, g in graphs if g))
    counted = any(((r.get("speculative") or {}).get("acceptance") or {}).get("histogram") for r in report["runs"])
    accept = ("mean tokens accepted per generation step (a request's last step may accept past its end: emitted_mean "
              "in the JSON)" if counted else
              "the acceptance length TensorRT-LLM's benchmark tool reports (its own definition: docs/benchmarks.md)")
    lines.append(f"latencies in seconds; accept = {accept}; tgt/tok = target tokens "
                 "computed per emitted token (prompts included); speedup = speculative / autoregressive tokens/s")
    if report.get("unavailable"):
        lines.append("not measured by this backend: " + ", ".join(report["unavailable"]))
    if report.get("projection"):
        from .projection import render as render_projection

        lines.append("")
        lines.append(render_projection(report["projection"]))
    return "\n".join(lines)
