"""``bench run`` on a TensorRT engine through the project runtime (the engines TensorRT-LLM's executor cannot run:
``engine/trtllm/paths.py``): the CPU benchmark's closed loop (:func:`.cpu.drive`: C requests in flight, a new one
when one finishes) over :class:`~dflash2_trt.engine.trtllm.session.TrtEngineSession` instead of a CPU engine. Every
step passes through the project runtime, so the report has what the CPU backend's has (acceptance histogram,
per-position acceptance, target tokens per emitted token).

The autoregressive baseline is the engine directory's ``baseline/`` (``build --backend trtllm --baseline``: the
target alone, ``trtllm/network/target_only.py``, built by trtllm-build from the same checkpoint with the same limits
and plugins), driven by the same runtime and the same feed code with K = 0. One engine is on the GPUs at a time:
every concurrency runs on the speculative engine, its session is closed, then every concurrency runs on the
baseline (a tp engine's other ranks are told to open the baseline too: ``ranks.close_session``). At temperature 0
each concurrency reports whether both emitted the same tokens (``outputs_match``). A directory without a baseline
reports none and says how to build one."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from ..chunking import chunked_context_default
from ..engine.common import check_requests, stop_ids
from ..engine.graph_rules import counts_between
from ..engine.trtllm.ranks import close_session, open_project_session
from ..engine.format import load_engine_dir
from ..engine.pretrained import BASELINE_DIR, on_context_route
from ..engine.trtllm.session import baseline_config, has_baseline
from ..errors import ConfigError, DFlash2Error, pending_stop
from ..reference.generate import SEED_MAX
from ..runtime import Runtime
from .common import parse_concurrency
from .common import progress_bar
from .cpu import drive, make_requests
from .dataset import load_bench_requests, prompt_tokenizer_dir
from .metrics import run_metrics

ROUTED_BASELINE = ("on the context route (sliding_path context) the baseline's sliding-window layers take each "
                   "one-token step as a context chunk of one (the attention plugin's context part), where a stock "
                   "target engine would use its generation kernels: the speedup is against this baseline, and what "
                   "those context calls cost next to a generation kernel is not measured (docs/trt-session.md §10)")
BASELINE_PENDING = ("not finished: the report was written after the speculative sweep, and the job ended while the "
                    "baseline engine was opened or run (the speculative runs are complete)")

NO_BASELINE_NOTE = ("no autoregressive baseline: this engine directory has none (build it with `dflash2-trt build "
                    "--backend trtllm --baseline ...`: the target alone, beside the combined engine)")


def _runs(sess, specs, levels, *, temperature, seed, stops, warmup, keep_outputs, graphed, mode, progress):
    """Every concurrency on one session: (metrics per concurrency, the finished requests per concurrency)."""
    if warmup:
        w = make_requests(specs[:1], temperature=temperature, seed=seed, stops=stops)[0]
        w.max_new_tokens = min(w.max_new_tokens, 2)
        Runtime(sess, max_batch_size=1).generate([w])
    metrics, finished = [], []
    for c in levels:
        rt = Runtime(sess, max_batch_size=c)
        reqs = make_requests(specs, temperature=temperature, seed=seed, stops=stops)
        before = sess.graphs.report() if graphed else None
        with progress_bar(progress, len(reqs), f"concurrency {c} {mode}") as bar:     # a bar on a terminal
            wall = drive(rt, reqs, c, on_finish=bar.update)
        m = run_metrics(reqs, wall_s=wall, step_log=rt.step_log, draft_len=sess.K)
        if graphed:
            m["cuda_graphs"] = counts_between(before, sess.graphs.report())
        if keep_outputs:
            m["outputs"] = [{"task_id": r.task_id, "output_ids": list(r.output_ids), "stop_reason": r.stop_reason,
                             "acceptance_lengths": list(r.acceptance_lengths)} for r in reqs]
        metrics.append(m)
        finished.append(reqs)
        print(f"concurrency {c} {mode}: {m['output_tokens_per_s'] or 0:.1f} tokens/s", file=sys.stderr)
    return metrics, finished


def bench_session(engine_dir, dataset, *, concurrency, num_requests: int | None = None, temperature: float = 0.0,
                  seed: int = 0, max_new_tokens: int = 64, stop_on_eos: bool = True, warmup: bool = True,
                  keep_outputs: bool = False, trt=None, cuda_graphs: bool = False, simulate_graphs: bool = False,
                  baseline: bool = True, on_speculative=None, progress: bool = False) -> dict:
    """The report's measured part for a TensorRT engine on the project runtime (``trt``: the tensorrt module, or its
    CPU stand-in in tests). ``cuda_graphs``: generation steps replayed from CUDA graphs (``engine/trtllm/
    session_graphs.py``, each session's graphs kept from one concurrency to the next; each RUN's ``cuda_graphs``
    counts its own steps; ``simulate_graphs``: on the stand-in, for tests). ``baseline``: also the directory's
    baseline engine, when it has one (module docstring); ``on_speculative``: called with the speculative sweep's
    measured part (``baseline_error`` :data:`BASELINE_PENDING`) before the baseline opens (``bench run --json``
    writes it then)."""
    levels = parse_concurrency(concurrency)
    if not isinstance(seed, int) or not 0 <= seed <= SEED_MAX:
        raise ConfigError(f"must be in [0, {SEED_MAX}], got {seed}", field="--seed")
    t_start = time.perf_counter()
    graphed = bool(cuda_graphs or simulate_graphs)
    graph_kw = {"cuda_graphs": cuda_graphs, "simulate_graphs": simulate_graphs} if graphed else {}
    cfg, man = load_engine_dir(engine_dir)
    with_baseline = bool(baseline and has_baseline(man))
    routed = on_context_route((cfg or {}).get("pretrained_config"))
    if with_baseline:
        baseline_config(engine_dir, cfg, man)        # a baseline that cannot run is refused before anything runs
    sess, man = open_project_session(engine_dir, trt=trt, **graph_kw)
    try:
        limit = sess.limits["max_batch_size"]
        too_big = [c for c in levels if c > limit]
        if too_big:
            raise ConfigError(f"concurrency {too_big[0]} exceeds the engine's max_batch_size {limit}",
                              field="--concurrency")
        specs = load_bench_requests(dataset, vocab_size=sess.vocab_size, default_output_tokens=max_new_tokens,
                                    num_requests=num_requests, tokenizer_dir=prompt_tokenizer_dir(engine_dir, man))
        stops = stop_ids(man, sess.vocab_size) if stop_on_eos else ()
        checker = Runtime(sess)
        check_requests(checker, specs, make_requests(specs, temperature=temperature, seed=seed, stops=stops))
        common = {"temperature": temperature, "seed": seed, "stops": stops, "warmup": warmup,
                  "keep_outputs": keep_outputs, "graphed": graphed, "progress": progress}
        spec_m, spec_out = _runs(sess, specs, levels, mode="speculative", **common)
        K, tp, max_num_tokens = sess.K, sess.tp, int(sess.limits["max_num_tokens"])
    except BaseException:
        close_session(sess)          # the other ranks of a tp engine leave with it
        raise
    # one engine on the GPUs at a time: the speculative one goes before the baseline is opened (on every rank)
    close_session(sess, then="baseline" if with_baseline else None)
    sess = None                        # closed: it holds nothing on the device any more
    in_lens = [len(s["input_ids"]) for s in specs]

    def measured(ar_m, ar_out, baseline_error) -> dict:
        runs = []
        for i, c in enumerate(levels):
            row = {"concurrency": c, "speculative": spec_m[i], "autoregressive": None, "speedup": None,
                   "outputs_match": None}
            if ar_m is not None:
                sp, ar = spec_m[i], ar_m[i]
                row["autoregressive"] = ar
                row["speedup"] = (sp["output_tokens_per_s"] / ar["output_tokens_per_s"]
                                  if sp["output_tokens_per_s"] and ar["output_tokens_per_s"] else None)
                row["outputs_match"] = (all(a.output_ids == b.output_ids for a, b in zip(spec_out[i], ar_out[i]))
                                        if temperature == 0 else None)
            runs.append(row)
        notes = ["the project runtime over TensorRT (engine/trtllm/paths.py: the executor cannot run this engine)"]
        if baseline_error is not None:
            notes.append(f"the baseline engine failed after the speculative runs: {baseline_error}")
        if not with_baseline:
            notes.append(NO_BASELINE_NOTE if baseline else "no autoregressive baseline (--no-baseline)")
        elif routed and ar_m is not None:
            notes.append(ROUTED_BASELINE)
        return {
            "backend": "trtllm", "runtime": "project", "engine_dir": str(engine_dir), "target": man.get("target"),
            "block_size": K + 1, "draft_len": K, "tp_size": tp, "dataset_requests": specs,
            "settings": {"concurrency": levels, "num_requests": len(specs), "temperature": temperature, "seed": seed,
                         "stop_on_eos": bool(stop_on_eos), "stop_token_ids": list(stops),
                         "max_new_tokens": max_new_tokens, "warmup": bool(warmup), "torch_threads": None,
                         "cuda_graphs": graphed, "max_num_tokens": max_num_tokens,
                         "chunked_context": chunked_context_default()},
            "baseline": ({"kind": "target-only",
                          "description": "the engine directory's baseline/ (build --baseline: the target alone, "
                                         "dflash2_trt/trtllm/network/target_only.py, built by trtllm-build from the "
                                         "same checkpoint and limits) on the same project runtime over TensorRT, one "
                                         "token per request per step, in-flight batched at the same concurrency"
                                         + ("; " + ROUTED_BASELINE if routed else ""),
                          "sliding_path": "context" if routed else None}
                         if ar_m is not None else None),
            "baseline_error": baseline_error,
            "mean_input_len": sum(in_lens) / len(in_lens), "runs": runs, "unavailable": [], "notes": notes,
            "measure_wall_s": time.perf_counter() - t_start,
        }

    if not with_baseline:
        if baseline:
            print(f"note: {NO_BASELINE_NOTE}", file=sys.stderr)
        return measured(None, None, None)
    if on_speculative is not None:
        # what the sweep measured, kept before the baseline runs: a job that ends inside it (a stop signal, or at
        # tp > 1 a rank's failure, which aborts every rank) leaves this report, saying so
        on_speculative(measured(None, None, BASELINE_PENDING))
    try:
        base, _ = open_project_session(engine_dir, trt=trt, baseline=True, **graph_kw)
        try:
            slots = base.outputs["next_draft_tokens"].shape[-1]      # what the engine itself declares (-1: dynamic)
            if slots not in (0, -1):
                raise ConfigError(f"the baseline engine's next_draft_tokens has {slots} draft slots, expected 0 "
                                  f"(not a target-only engine)", source=Path(engine_dir) / BASELINE_DIR,
                                  field="next_draft_tokens")
            ar_m, ar_out = _runs(base, specs, levels, mode="autoregressive", **common)
        finally:
            close_session(base)
    except Exception as exc:     # noqa: BLE001 - the speculative runs are kept; the CLI then exits 1 naming it
        if pending_stop() is not None:     # a stop signal turned into another error on its way up: it stays a stop
            raise
        error = str(exc) if isinstance(exc, DFlash2Error) else f"{type(exc).__name__}: {exc}"
        print(f"warning: the baseline engine failed; the report keeps the speculative runs: {error}", file=sys.stderr)
        return measured(None, None, error)
    return measured(ar_m, ar_out, None)
