"""``bench run --tool gptmanager``: TensorRT-LLM's ``gptManagerBenchmark`` on an EAGLE-mode engine.

Which tool (read in TensorRT-LLM 1.2's sources):

- stock ``trtllm-bench throughput --engine_dir`` cannot run it: ``tensorrt_llm/bench/dataclasses/
  configuration.py`` maps the engine's speculative mode through ``SPECULATIVE_MAP``, which holds
  only ``NONE`` and ``MEDUSA`` — an EAGLE engine (mode 32, docs/TRTLLM-ENGINE.md §1) is a KeyError there;
  :mod:`.trtllm_bench`'s launcher adds the mode and is ``bench run``'s default (``--tool trtllm-bench``).
- ``benchmarks/cpp/gptManagerBenchmark`` (the executor API) does: ``--eagle_choices`` (parsed by
  ``parseVectorOfVectors`` from ``[[0],[0,0],...]``) makes an ``EagleConfig`` and sets
  ``DecodingMode::Eagle`` in the executor's ``DecodingConfig``; ``--concurrency C`` keeps C requests
  in flight (``canEnqueue``: sent - finished < C); ``--streaming`` records time to first token and
  inter-token latency; ``--temperature``, ``--eos_id`` (default -1: never stop early),
  ``--max_num_samples``, ``--warm_up``, ``--output_csv``, ``--responses_json``,
  ``--enable_kv_cache_reuse`` and ``--enable_chunked_context`` (both default true; passed as false here, as the
  Triton repository and the hybrid runtime run) are its flags.

What it records (``Recorder``, read in ``benchmarks/cpp/gptManagerBenchmark.cpp``, the revision whose two flags
above default to true): in ``--streaming`` mode no response tokens at all (``recordEnd`` keeps tokens only when not
streaming), so ``--responses_json`` writes ``[]``; and its streaming metrics read every request's inter-token
latency, which is unset for a request with one output token, so such a run throws after the work is done.
Hence: timing runs stream (time to first token, inter-token latency) and write no responses file; with a
baseline engine at temperature 0 each level adds one non-streaming run per engine whose responses are compared
(``outputs_match``: true / false, with the mismatching requests in ``outputs_compared``; null when nothing was
compared, never true by default); requests asking for fewer than 2 output tokens are refused. A request that
stops at EOS after its first token still trips that throw: ``bench run --ignore-eos`` (``--eos_id -1``) avoids it.
Values printed as ``nan`` / ``-nan`` (a 0/0 average) are parsed and reported as null.

Its dataset is NOT trtllm-bench's JSON lines but one JSON document (``utils/utils.cpp:
parseWorkloadJson``, written by ``benchmarks/cpp/utils/utils.py: dataset_dump``)::

    {"metadata": {...}, "samples": [{"input_len", "input_ids", "output_len", "task_id"}, ...]}

A sample's ``task_id >= 0`` makes it a LoRA request (``benchmarkExecutor``: ``if (samples[i].taskId
>= 0) loraConfig = LoraConfig(taskId)``), which an engine without LoRA rejects — silently wrong if
copied from the dataset's ``task_id``; :func:`workload_json` writes -1.

Its report is ``printf("[BENCHMARK] <name>(<unit>) <value>")`` lines (``Recorder::report``);
:func:`parse_benchmark_output` reads them. ``avg_acceptance_rate(tokens/decoding steps)`` is
output tokens / decoding iterations of the whole run (its own definition: it counts every
iteration, so it is close to, not equal to, the CPU report's mean over generation steps); no
per-position histogram, no target-token count. The autoregressive baseline is a target-only
TensorRT-LLM engine run without ``--eagle_choices`` (``--baseline-engine-dir``).

Nothing here imports TensorRT-LLM; the benchmark binary is looked up on ``PATH`` or given, and the
DFlash2 plugin library (``--plugin-lib``, default ``ENGINE_DIR/libdflash2_plugins.so`` where the
GPU build puts it) is preloaded with ``LD_PRELOAD`` (no flag loads a plugin library,
docs/TRTLLM-ENGINE.md §5). The engine directory is passed as ``--engine_dir`` (a TensorRT-LLM engine
directory: its config.json and rank engines, as ``ModelRunnerCpp.from_dir`` reads it).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
from pathlib import Path

from ..errors import ConfigError, MissingDependencyError, raise_if_stop_requested
from ..plugins import LIBRARY_NAME
from ..sampling import request_temperature
from .common import parse_concurrency
from .dataset import load_bench_requests, prompt_tokenizer_dir

BINARY = "gptManagerBenchmark"
UNAVAILABLE = ["input_tokens", "engine_steps", "target_tokens", "target_tokens_per_emitted_token",
               "decode_target_tokens_per_emitted_token", "acceptance.histogram", "acceptance.per_position",
               "acceptance.per_position_conditional", "latency_s.mean (given as avg_sequence_latency)"]

# printf("%.2f") of a 0/0 average or an empty percentile prints nan or -nan (glibc), inf or -inf
_LINE = re.compile(r"^\[BENCHMARK\]\s+([A-Za-z0-9_]+)(?:\(([^)]*)\))?\s+([-+]?(?:[0-9.]+(?:[eE][-+]?[0-9]+)?|nan|inf))\s*$",
                   re.IGNORECASE)
MIN_OUTPUT_TOKENS = 2


def eagle_choices(draft_len: int) -> str:
    """The linear chain of ``draft_len`` drafts in gptManagerBenchmark's format: ``[[0],[0,0],...]``."""
    if draft_len < 1:
        raise ConfigError(f"an EAGLE chain needs >= 1 draft, got {draft_len}", field="draft_len")
    return "[" + ",".join("[" + ",".join(["0"] * d) + "]" for d in range(1, draft_len + 1)) + "]"


def workload_json(specs: list[dict], metadata: dict | None = None) -> dict:
    """gptManagerBenchmark's dataset document from bench requests (``task_id`` -1: no LoRA)."""
    return {"metadata": dict(metadata or {"workload_type": "dflash2-trt bench"}),
            "samples": [{"input_len": len(s["input_ids"]), "input_ids": list(s["input_ids"]),
                         "output_len": int(s["output_tokens"]), "task_id": -1} for s in specs]}


def benchmark_command(*, binary: str, engine_dir, dataset_json, concurrency: int, num_samples: int,
                      draft_len: int | None, temperature: float = 0.0, eos_id: int | None = None,
                      warm_up: int = 2, output_csv=None, responses_json=None, streaming: bool = True) -> list[str]:
    """The argv of one gptManagerBenchmark run (``draft_len`` None: no speculation, the baseline engine).
    Block reuse and chunked context are off (both default on in gptManagerBenchmark; the Triton repository and the
    hybrid runtime turn them off too). ``responses_json`` only holds tokens of a non-streaming run (in streaming
    mode its Recorder keeps no response, and the file is ``[]``)."""
    cmd = [str(binary), "--engine_dir", str(engine_dir), "--api", "executor", "--type", "inflight",
           "--dataset", str(dataset_json), "--max_num_samples", str(num_samples), "--concurrency", str(concurrency),
           "--warm_up", str(warm_up), "--enable_kv_cache_reuse=false", "--enable_chunked_context=false",
           "--log_level", "warning"]
    if streaming:
        cmd.append("--streaming")
    if draft_len is not None:   # EAGLE mode; the temperature always named (unset: 1.0, this engine samples; 0 fails
        cmd += ["--eagle_choices", eagle_choices(draft_len),   # the EAGLE layer)
                "--temperature", repr(float(request_temperature(temperature)))]
    elif temperature > 0:       # the baseline target engine: greedy by default
        cmd += ["--temperature", repr(float(temperature))]
    cmd += ["--eos_id", str(-1 if eos_id is None else int(eos_id))]
    if output_csv is not None:
        cmd += ["--output_csv", str(output_csv)]
    if responses_json is not None:
        cmd += ["--responses_json", str(responses_json)]
    return cmd


def parse_benchmark_output(text: str) -> dict:
    """``{name: value}`` of every ``[BENCHMARK] name(unit) value`` line (the unit dropped; the last value of a
    name that repeats, as ``num_samples`` does). Raises when there is none (the run failed before its report)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if m:
            out[m.group(1)] = float(m.group(3))     # "-nan" -> nan: printed, so measured as not-a-number
    if not out:
        raise ConfigError("no [BENCHMARK] lines in gptManagerBenchmark's output (did it fail? its log says why)",
                          field=BINARY)
    return out


def _dist_ms(vals: dict, stem: str) -> dict | None:
    keys = {"mean": f"avg_{stem}", "p50": f"p50_{stem}", "p90": f"p90_{stem}", "p99": f"p99_{stem}",
            "min": f"min_{stem}", "max": f"max_{stem}"}
    if keys["p50"] not in vals:
        return None
    # std: None, the key every RUN distribution has (the project's own runs compute it, metrics.distribution)
    return {"std": None, **{k: (vals[v] / 1e3 if v in vals else None) for k, v in keys.items()}}


def metrics_from_benchmark(vals: dict, *, num_requests: int) -> dict:
    """A report RUN block from parsed gptManagerBenchmark values (fields it does not measure, and nan values, are
    null)."""
    vals = {k: v for k, v in vals.items() if not math.isnan(v)}
    wall = vals.get("total_latency") and vals["total_latency"] / 1e3
    tok_s = vals.get("token_throughput")
    return {
        "requests": int(vals.get("num_samples", num_requests)), "input_tokens": None,
        "output_tokens": int(round(tok_s * wall)) if tok_s and wall else None, "wall_s": wall,
        "requests_per_s": vals.get("seq_throughput"), "output_tokens_per_s": tok_s,
        "latency_s": _dist_ms(vals, "sequence_latency"), "ttft_s": _dist_ms(vals, "time_to_first_token"),
        "itl_s": _dist_ms(vals, "inter_token_latency"), "engine_steps": None, "target_tokens": None,
        "target_tokens_per_emitted_token": None, "decode_target_tokens_per_emitted_token": None,
        "acceptance": {"mean": vals.get("avg_acceptance_rate"), "steps": None, "histogram": None,
                       "per_position": None, "per_position_conditional": None, "emitted_mean": None},
        "errors": int(vals.get("num_error_samples", 0)),
    }


def find_binary(binary: str | None) -> str:
    path = binary or shutil.which(BINARY)
    if path is None or not (Path(path).is_file() and os.access(path, os.X_OK)):
        raise MissingDependencyError(
            f"{BINARY} not found ({binary or 'not on PATH'}): build TensorRT-LLM 1.2's benchmarks/cpp "
            f"(`python3 scripts/build_wheel.py --benchmarks`) on a GPU machine and pass --benchmark-bin PATH")
    return str(path)


def _responses(path: Path) -> list[list[int]] | None:
    try:
        docs = json.loads(path.read_text())
        return [list(d["response_tokens"]) for d in sorted(docs, key=lambda d: d["response_id"])]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def compare_outputs(spec: list[list[int]] | None, base: list[list[int]] | None, expected: int) -> dict:
    """``{"match": True | False | None, "compared", "mismatched"}`` of two non-streaming runs' responses (in
    request order; both runs enqueue the same warm-up and samples, so response ids line up). ``match`` is None
    when nothing could be compared (a file missing, unreadable or empty), False when a request differs or a run
    returned another number of responses than the ``expected`` requests."""
    if not spec or not base:
        return {"match": None, "compared": 0, "mismatched": []}
    n = min(len(spec), len(base))
    bad = [i for i in range(n) if spec[i] != base[i]]
    ok = not bad and len(spec) == len(base) == expected
    return {"match": ok, "compared": n, "mismatched": bad[:8],
            **({} if len(spec) == len(base) == expected else {"responses": {"speculative": len(spec),
                                                                            "autoregressive": len(base)}})}


def bench_gpu(engine_dir, dataset, *, manifest: dict, concurrency, num_requests: int | None = None,
              temperature: float = 0.0, max_new_tokens: int = 64, stop_on_eos: bool = True,
              baseline_engine_dir=None, binary: str | None = None, plugin_lib: str | None = None,
              workdir=None, dry_run: bool = False, runner=subprocess.run) -> dict:
    """Run gptManagerBenchmark per concurrency (speculative, then the baseline engine if given) and build
    the report's measured part. ``dry_run`` returns the commands without running anything."""
    import tempfile

    levels = parse_concurrency(concurrency)
    if temperature > 0 and baseline_engine_dir is not None:
        raise ConfigError(f"{temperature:g} with a baseline engine: gptManagerBenchmark has no top-k / top-p option, "
                          f"and TensorRT-LLM decodes a request with top_k 0 / top_p 0 (its defaults) greedily "
                          f"whatever the temperature, so the baseline would decode greedily against a sampling "
                          f"speculative run; use --tool trtllm-bench (it samples the baseline with top_p 1.0) or "
                          f"leave out --baseline-engine-dir", field="--temperature")
    K = int(manifest["block_size"]) - 1
    vocab = int(manifest.get("vocab_size") or 2**31 - 1)   # the caller puts config.json's vocab_size here
    specs = load_bench_requests(dataset, vocab_size=vocab, default_output_tokens=max_new_tokens,
                                num_requests=num_requests, tokenizer_dir=prompt_tokenizer_dir(engine_dir, manifest))
    short = [i for i, sp in enumerate(specs) if int(sp["output_tokens"]) < MIN_OUTPUT_TOKENS]
    if short:
        raise ConfigError(f"request {short[0]} asks for {specs[short[0]]['output_tokens']} output token(s): "
                          f"gptManagerBenchmark's streaming metrics throw for a request with fewer than "
                          f"{MIN_OUTPUT_TOKENS} (its inter-token latency is undefined); give each request >= "
                          f"{MIN_OUTPUT_TOKENS}", source=str(dataset), field="output_tokens")
    eos = [int(e) for e in manifest.get("eos_token_ids") or []] if stop_on_eos else []
    exe = (binary or BINARY) if dry_run else find_binary(binary)
    trt_dir = Path(engine_dir)
    if plugin_lib is None:
        own = trt_dir / LIBRARY_NAME
        plugin_lib = str(own) if own.is_file() else None
    if dry_run:
        work = Path(workdir or "WORKDIR")            # nothing is written
    else:
        work = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="dflash2-bench-"))
        work.mkdir(parents=True, exist_ok=True)
    ds_json = work / "workload.json"
    if not dry_run:
        ds_json.write_text(json.dumps(workload_json(specs)))
    env = dict(os.environ)
    if plugin_lib:
        env["LD_PRELOAD"] = ":".join(p for p in (plugin_lib, env.get("LD_PRELOAD")) if p)
    runs, commands = [], []
    compare = temperature == 0 and baseline_engine_dir is not None
    modes = (("speculative", trt_dir, K), ("autoregressive", baseline_engine_dir, None))

    def run(cmd, c, mode, what):
        commands.append(cmd)
        if dry_run:
            return None
        raise_if_stop_requested()   # a stop whose exception was lost does not start the next run
        proc = runner(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-1:] or ["(no output)"]
            raise ConfigError(f"exited {proc.returncode} at concurrency {c} ({mode}{what}): {tail[0]}", field=BINARY)
        return proc

    for c in levels:
        row = {"concurrency": c}
        # timing: streaming (time to first token, inter-token latency); its responses file would be empty
        for mode, edir, dl in modes:
            row[mode] = None
            if edir is None:
                continue
            proc = run(benchmark_command(binary=exe, engine_dir=edir, dataset_json=ds_json, concurrency=c,
                                         num_samples=len(specs), draft_len=dl, temperature=temperature,
                                         eos_id=eos[0] if eos else None, output_csv=work / f"{mode}_c{c}.csv"),
                       c, mode, "")
            if proc is not None:
                row[mode] = metrics_from_benchmark(parse_benchmark_output(proc.stdout), num_requests=len(specs))
        spec, ar = row.get("speculative"), row.get("autoregressive")
        row["speedup"] = (spec["output_tokens_per_s"] / ar["output_tokens_per_s"]
                          if spec and ar and spec["output_tokens_per_s"] and ar["output_tokens_per_s"] else None)
        # outputs: one non-streaming run per engine (the only mode whose responses gptManagerBenchmark records),
        # greedy with a baseline only; null when nothing was compared, never true by default
        outs = {}
        if compare:
            for mode, edir, dl in modes:
                resp = work / f"responses_{mode}_c{c}.json"
                proc = run(benchmark_command(binary=exe, engine_dir=edir, dataset_json=ds_json, concurrency=c,
                                             num_samples=len(specs), draft_len=dl, temperature=temperature,
                                             eos_id=eos[0] if eos else None, responses_json=resp, streaming=False),
                           c, mode, ", outputs check")
                outs[mode] = _responses(resp) if proc is not None else None
        cmp = compare_outputs(outs.get("speculative"), outs.get("autoregressive"), len(specs))
        row["outputs_match"], row["outputs_compared"] = cmp["match"], cmp
        runs.append(row)
    return {
        "backend": "trtllm", "engine_dir": str(engine_dir), "target": manifest.get("target"), "block_size": K + 1,
        "draft_len": K, "tp_size": int(manifest.get("tp_size", 1)), "dataset_requests": specs,
        "settings": {"concurrency": levels, "num_requests": len(specs), "temperature": temperature, "seed": None,
                     "stop_on_eos": bool(stop_on_eos), "stop_token_ids": eos[:1], "max_new_tokens": max_new_tokens,
                     "warmup": True},
        "baseline": ({"kind": "target-only engine", "description": f"TensorRT-LLM engine {baseline_engine_dir} run "
                      f"without speculation by {BINARY}"} if baseline_engine_dir else None),
        "runs": runs, "unavailable": list(UNAVAILABLE), "commands": commands, "workdir": str(work),
    }
