"""The engine flow on a GPU: the cuda backend end to end, and the engine step at real widths (issue: the combined
engine runs on the GPU). Run through ``scripts/gpu_check.sh --e2e OUT_DIR`` or directly::

    python scripts/gpu_e2e.py --out OUT_DIR [--parts lossless,steps] [--context-len 1024] [--budget SECONDS]

Parts (each in its own process group with its own time limit, so one failure leaves the others' results; with
``--budget`` the parts share that many seconds, lossless at most half of them):

- ``lossless``: for the shipped tiny pairs (``tiny``, ``tiny-hybrid``, ``tiny-muse``) in float32 and bfloat16:
  ``build --backend cuda`` (the verify gate on in float32), then 32 requests (the 16 shipped prompts, twice, 40 and
  24 new tokens) at concurrency 1 and 16 through the project's runtime on the cuda engine, every output compared
  token for token with the HF target's own greedy decoding on the same GPU in the same dtype; in float32 at the
  highest level also with generation steps replayed from CUDA graphs (``run --cuda-graphs``), with how many steps
  were replayed, captured and run eagerly, and why a capture failed. On a GPU the six cells (target x dtype) run
  as processes at once (``--lossless-jobs``): the tiny pairs' steps are bound by the host, not by the GPU.
- ``steps``: ``bench steps`` for qwen3.8-27b and muse-glimmer-30b (random weights, context ``--context-len``,
  concurrency 1/4/16/32/64): ms per step, speculative and target-only, per component; each target in a process of
  its own with its share of the part's time (``--no-isolate``: one process), its log ``steps-<target>.log``.

Writes ``OUT_DIR/<part>.json``, ``OUT_DIR/<part>.txt`` (the tables) and ``OUT_DIR/<part>.log``; prints the tables.
Needs a CUDA GPU, a CUDA build of torch, nvcc, and transformers as the project pins it (the script names what is
missing). Exit status: 0 when every part ran and every output matched (or differed only at a tie: the table's
`ties`), 1 otherwise, 2 without a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

PROCESS_START = time.perf_counter()   # a part's (or a target child's) limit counts from its start, imports included
REPO = Path(__file__).resolve().parents[1]
PARTS = ("lossless", "steps")
FAMILIES = (("tiny", "qwen3"), ("tiny-hybrid", "qwen3_5"), ("tiny-muse", "muse_glimmer"))
STEP_TARGETS = ("qwen3.8-27b", "muse-glimmer-30b")
# the script's own test on a machine without a GPU runs the same parts on the cpu backend (DFLASH2_E2E_BACKEND=cpu)
BACKEND = os.environ.get("DFLASH2_E2E_BACKEND", "cuda")
DEVICE = "cuda" if BACKEND == "cuda" else "cpu"


def log(msg: str) -> None:
    print(msg, flush=True)


def requirements() -> list[str]:
    """What this machine lacks for the parts (empty: nothing)."""
    missing = []
    try:
        import torch
        if not torch.cuda.is_available():
            missing.append("a CUDA GPU visible to torch")
    except ImportError:
        missing.append("torch (a CUDA build)")
    try:
        from importlib.metadata import version

        import transformers  # noqa: F401
        v = tuple(int(x) for x in version("transformers").split(".")[:2])
        if v < (5, 24):
            missing.append(f"transformers >= 5.24 (found {version('transformers')}; carry a wheel)")
    except ImportError:
        missing.append("transformers >= 5.24")
    from dflash2_trt.trtllm.cuda.plugin_lib import nvcc_path
    try:
        nvcc_path()
    except Exception as e:  # noqa: BLE001
        missing.append(str(e))
    return missing


# ---- lossless --------------------------------------------------------------------------------------------------
def lossless_cells(dtypes=("float32", "bfloat16"), targets=None) -> list[tuple[str, str, str]]:
    """The table's (target, family, dtype) cells in the table's order (``targets``: only these)."""
    return [(key, family, dtype) for key, family in FAMILIES if targets is None or key in targets for dtype in dtypes]


def part_lossless(out: Path, levels=(1, 16), dtypes=("float32", "bfloat16"), save=None, jobs: int = 1,
                  targets=None) -> dict:
    """The lossless table (see the module docstring); ``save`` (if given) receives the document of the rows so far
    after each row (``partial``: true), so that a part stopped at its limit keeps them. ``jobs`` > 1: the cells run
    as that many processes at once (:func:`lossless_concurrent`): the tiny pairs' steps are expected to be bound by
    the host, leaving a GPU mostly idle under one of them (not yet measured on a GPU)."""
    cells = lossless_cells(dtypes, targets)
    if jobs > 1:
        return lossless_concurrent(out, cells, levels, dtypes[0], save, jobs)
    import tempfile

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for key, family, dtype in cells:
            def keep(cell_rows, _done=list(rows)):
                if save is not None:
                    save(lossless_doc(_done + cell_rows, partial=True))
            rows += lossless_cell(key, family, dtype, levels, Path(tmp), graphs=dtype == dtypes[0], keep=keep)
    return lossless_doc(rows)


def lossless_cell(key: str, family: str, dtype: str, levels, tmp: Path, graphs: bool, keep=None) -> list[dict]:
    """One cell of the table: build ``key``'s engine in ``dtype`` under ``tmp``, decode the 32 requests at each
    concurrency of ``levels`` and compare with the HF target's greedy decoding; its rows (one per level), each also
    given to ``keep`` (the rows so far) as it is done. ``graphs``: the highest level again from CUDA graphs."""
    from dflash2_trt.assets import trained_pair
    from dflash2_trt.engine.build import build_engine
    from dflash2_trt.engine.standin.engine import open_standin_engine
    from dflash2_trt.engine.verify import VerifyError, check_against_target, reference_outputs
    from dflash2_trt.runtime import Request, Runtime
    from dflash2_trt.testing.engines import shipped_prompts

    rows: list[dict] = []
    pair = trained_pair(family)
    prompts = shipped_prompts(pair, 16)
    jobs = [(p, 40 if i % 2 == 0 else 24) for i, p in enumerate(prompts + prompts)]
    t0 = time.perf_counter()
    eng_dir = tmp / f"{key}-{dtype}"
    res = build_engine(pair.drafter_dir, pair.target_dir, eng_dir, backend=BACKEND, target_key=key,
                       dtype=dtype, verify=dtype == "float32",
                       overrides={"max_batch_size": 16, "tokens_per_block": 16})
    build_s = time.perf_counter() - t0
    log(f"lossless {key:12s} {dtype:9s} built in {build_s:.1f} s (verify gate: "
        f"{(res.manifest.get('verify') or {}).get('passed')})")
    eos = tuple(res.manifest["eos_token_ids"])
    t_ref = time.perf_counter()
    refs40 = reference_outputs(pair.target_dir, prompts, 40, eos, dtype=dtype, device=DEVICE)
    log(f"lossless {key:12s} {dtype:9s} the HF target's references in {time.perf_counter() - t_ref:.1f} s")
    want = [r if n == 40 else r[:24] for (_, n), r in zip(jobs, refs40 + refs40)]
    for conc in levels:
        eng, man = open_standin_engine(eng_dir)
        try:
            rt = Runtime(eng, max_batch_size=conc)
            reqs = [Request(list(p), n, stop_token_ids=eos, task_id=i, seed=i)
                    for i, (p, n) in enumerate(jobs)]
            t1 = time.perf_counter()
            rt.generate(reqs)
            wall = time.perf_counter() - t1
            mixed = sum(1 for s in rt.step_log if s["context"] and s["generation"])
            steps = rt.step_count
        finally:
            eng.close()
        same = [r.output_ids == w for r, w in zip(reqs, want)]
        bad = [i for i, ok in enumerate(same) if not ok]
        acc = [a for r in reqs for a in r.acceptance_lengths]
        row = {"target": key, "dtype": dtype, "concurrency": conc, "requests": len(reqs),
               "identical": len(reqs) - len(bad), "mismatched": bad[:8],
               "first_mismatch": _first_diff(reqs[bad[0]].output_ids, want[bad[0]]) if bad else None,
               "mean_acceptance": sum(acc) / len(acc) if acc else 0.0, "steps": steps,
               "mixed_steps": mixed, "tokens": sum(len(r.output_ids) for r in reqs),
               "wall_s": wall, "build_s": build_s,
               "verify_gate": (res.manifest.get("verify") or {}).get("passed") if conc == levels[0]
               else None}
        if graphs and conc == levels[-1]:
            try:
                row["cuda_graphs"] = g = graphed_run(eng_dir, jobs, eos, conc, want)
                log(f"lossless {key:12s} {dtype:9s} c{conc:<3d} CUDA graphs: {g['identical']}/{len(jobs)} "
                    f"identical, {g['replayed']} replayed, {g['captured']} captured, {g['eager']} eager, "
                    f"{g['tokens'] / g['wall_s']:.0f} tok/s"
                    f"{' failed: ' + '; '.join(g['failed']) if g['failed'] else ''}")
            except Exception:  # noqa: BLE001 - the rows of the other pairs still count
                row["cuda_graphs"] = {"error": traceback.format_exc()[-2000:], "identical": 0}
                log(f"lossless {key:12s} CUDA graphs run failed:\n{row['cuda_graphs']['error']}")
        if dtype == "float32" and conc == levels[-1]:   # strict identity: no dtype ties to allow for
            try:
                row["chunked"] = c = chunked_run(pair, eng_dir, eos, dtype)
                log(f"lossless {key:12s} {dtype:9s} chunked context c{c['concurrency']} at max_num_tokens "
                    f"{c['max_num_tokens']}: {c['identical']}/{c['requests']} identical, "
                    f"{c['cut_steps']} steps cut a prompt")
            except Exception:  # noqa: BLE001 - as above
                row["chunked"] = {"error": traceback.format_exc()[-2000:], "identical": 0}
                log(f"lossless {key:12s} chunked context run failed:\n{row['chunked']['error']}")
        if bad and conc == levels[0]:
            row["diagnosis"] = [near_tie(pair.target_dir, dtype, jobs[i][0], reqs[i].output_ids, want[i])
                                for i in bad[:4]]
        # each difference judged by the build gate's rule (engine/verify.py): a rounding tie of the
        # target's own logits, or a real difference; the strict count above stays what it is
        row["ties_only"], row["differ"], row["tie_details"] = 0, [], []
        for i in bad:
            try:
                ties = check_against_target(pair.target_dir, [jobs[i][0]], [reqs[i].output_ids],
                                            jobs[i][1], eos, dtype=dtype, device=DEVICE)
            except VerifyError as exc:
                row["differ"].append({"request": i, "error": str(exc)})
                continue
            row["ties_only"] += 1
            if len(row["tie_details"]) < 4:
                row["tie_details"].append({"request": i, "ties": ties})
        rows.append(row)
        log(f"lossless {key:12s} {dtype:9s} c{conc:<3d} {row['identical']}/{row['requests']} identical, "
            f"mean acceptance {row['mean_acceptance']:.2f}, {steps} steps ({mixed} mixed), "
            f"{row['tokens'] / wall:.0f} tok/s")
        if keep is not None:
            keep(list(rows))
    return rows


def cell_name(key: str, dtype: str) -> str:
    return f"{key}-{dtype}"


def lossless_concurrent(out: Path, cells, levels, graphs_dtype: str, save, jobs: int) -> dict:
    """The cells as child processes, ``jobs`` at a time (``--one lossless-cell``), each ending with this process
    (PR_SET_PDEATHSIG) if it is killed outright. Each child writes ``OUT/lossless-cells/<target>-<dtype>.json`` (its
    rows, after each level) and ``.log``; as each ends, its log is copied into this part's output and the table is
    saved from every cell's rows so far. SIGTERM (the part's limit) stops the cells and saves that table, naming the
    cells stopped, before this process ends; an exception here stops the cells too."""
    import signal

    from dflash2_trt.children import die_with_parent, stop

    device_info()          # torch imported and the device named now: a stop's save only reads JSON and writes
    rowdir = out / "lossless-cells"
    rowdir.mkdir(parents=True, exist_ok=True)
    pending = list(cells)
    running: dict = {}
    failed: list[dict] = []

    def collect(partial: bool, stopped=()) -> dict:
        rows = []
        for key, _family, dtype in cells:
            try:
                rows += json.loads((rowdir / f"{cell_name(key, dtype)}.json").read_text())["rows"]
            except (OSError, ValueError, KeyError):
                pass
        doc = lossless_doc(rows, partial=partial, jobs=jobs)
        if stopped or (partial and pending):
            doc["cells_stopped"] = list(stopped)
            doc["cells_not_started"] = [cell_name(k, d) for k, _f, d in pending]
            doc["table"] += (f"\nstopped at the limit: {', '.join(stopped) or '-'}; not started: "
                             f"{', '.join(doc['cells_not_started']) or '-'}")
        if failed:
            doc["cell_failures"] = failed
            doc["all_identical"] = doc["all_identical_or_ties"] = False
            doc["table"] += "".join(f"\ncell {f['target']} {f['dtype']}: exit {f['exit']}: {f['last_line']}"
                                    for f in failed)
        return doc

    def stop_cells() -> list[str]:
        live = [name for name, (proc, _c, _f) in running.items() if proc.poll() is None]
        for name in live:                   # all told at once, then each given what is left of 2 s
            running[name][0].terminate()
        for name in live:
            stop(running[name][0], ((signal.SIGTERM, 2), (signal.SIGKILL, None)))
        return live

    def on_term(signum, frame):
        stopped = stop_cells()
        if save is not None:
            save(collect(partial=True, stopped=stopped))
        os._exit(128 + signum)

    # the cores shared out: torch's CPU threads per process (its default is every core: six processes would each
    # spin that many threads over the same cores)
    threads = str(max(1, usable_cpus() // jobs))
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", threads)}
    old = signal.signal(signal.SIGTERM, on_term)
    try:
        while pending or running:
            while pending and len(running) < jobs:
                key, family, dtype = cell = pending[0]
                name = cell_name(key, dtype)
                fh = open(rowdir / f"{name}.log", "w")
                argv = [sys.executable, __file__, "--out", str(rowdir), "--one", "lossless-cell", "--cell",
                        f"{key}:{dtype}", "--lossless-levels", ",".join(str(c) for c in levels)]
                if dtype == graphs_dtype:
                    argv.append("--cell-graphs")
                proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=env,
                                        preexec_fn=die_with_parent())
                running[name] = (proc, cell, fh)
                pending.pop(0)
                log(f"lossless {key:12s} {dtype:9s} started (pid {proc.pid}, {len(running)} running)")
            time.sleep(0.2)
            for name in [n for n, (p, _, _) in running.items() if p.poll() is not None]:
                proc, (key, _family, dtype), fh = running.pop(name)
                fh.close()
                text = (rowdir / f"{name}.log").read_text(errors="replace")
                log(f"---- lossless cell {name}: exit {proc.returncode} ----\n{text.rstrip()}")
                if proc.returncode != 0:
                    last = (text.strip().splitlines() or ["(no output)"])[-1]
                    failed.append({"target": key, "dtype": dtype, "exit": proc.returncode, "last_line": last[-300:]})
                if save is not None:
                    save(collect(partial=bool(pending or running)))
    finally:
        signal.signal(signal.SIGTERM, old)
        stop_cells()        # after an exception here: no cell keeps the GPU for the parts after this one
    return collect(partial=False)


def usable_cpus() -> int:
    """The CPUs this process may run on (a container's limit, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def run_cell(args) -> int:
    """``--one lossless-cell --cell TARGET:DTYPE``: one cell of the table in this process; its rows to
    ``OUT/<target>-<dtype>.json`` after each level."""
    import tempfile

    key, _, dtype = args.cell.partition(":")
    family = dict(FAMILIES).get(key)
    if family is None or not dtype:
        log(f"gpu_e2e: --cell must be TARGET:DTYPE with TARGET one of {', '.join(k for k, _ in FAMILIES)}, "
            f"got {args.cell!r}")
        return 2
    path = Path(args.out) / f"{cell_name(key, dtype)}.json"

    def keep(rows):
        write_replacing(path, json.dumps({"rows": rows}, indent=2, default=str))

    with tempfile.TemporaryDirectory() as tmp:
        lossless_cell(key, family, dtype, tuple(int(x) for x in args.lossless_levels.split(",")), Path(tmp),
                      graphs=args.cell_graphs, keep=keep)
    return 0


_DEVICE_INFO: dict = {}


def device_info() -> dict:
    """The device's name and torch's version, looked up once."""
    if not _DEVICE_INFO:
        import torch

        _DEVICE_INFO.update(device=torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu", torch=torch.__version__)
    return _DEVICE_INFO


def lossless_doc(rows: list[dict], partial: bool = False, jobs: int = 1) -> dict:
    """The lossless part's document and table from its rows (``jobs``: cells that ran at once)."""
    def extra_runs_ok(r: dict) -> bool:    # the CUDA-graph run and the chunked run, where a row has them
        g, c = r.get("cuda_graphs"), r.get("chunked")
        # a chunked run that cut no prompt tested nothing (a chunk unit of 256 where the sliding-window rule applies)
        return ((g is None or g.get("identical") == r["requests"])
                and (c is None or (c.get("identical") == c.get("requests") and c.get("cut_steps", 0) > 0)))

    ok = all(r["identical"] == r["requests"] and extra_runs_ok(r) for r in rows)
    doc = {**device_info(), "backend": BACKEND, "rows": rows, "all_identical": ok,
           "all_identical_or_ties": all(r["identical"] + r["ties_only"] == r["requests"] for r in rows),
           "partial": partial, "concurrent_cells": jobs}
    lines = [f"LOSSLESS on {doc['device']} ({BACKEND} backend vs the HF target's greedy decoding on the same device)"
             + (f" (partial: {len(rows)} rows so far)" if partial else "")
             + (f" ({jobs} cells at once: their tok/s share the GPU and the CPUs)" if jobs > 1 else ""),
             f"{'target':12s} {'dtype':9s} {'conc':>4} {'identical':>10} {'ties':>4} {'differ':>6} {'mean acc':>8}"
             f" {'steps':>5} {'mixed':>5} {'tok/s':>7}  verify gate"]
    for r in rows:
        lines.append(f"{r['target']:12s} {r['dtype']:9s} {r['concurrency']:>4} {r['identical']:>4}/{r['requests']:<5}"
                     f" {r['ties_only']:>4} {len(r['differ']):>6}"
                     f" {r['mean_acceptance']:>8.2f} {r['steps']:>5} {r['mixed_steps']:>5}"
                     f" {r['tokens'] / r['wall_s']:>7.0f}  {r['verify_gate']}")
    for r in rows:
        for key, label in (("cuda_graphs", "CUDA graphs"), ("chunked", "chunked")):
            e = r.get(key)
            if not e:
                continue
            head = f"{label:11s} {r['target']:12s} {r['dtype']:9s} c{e.get('concurrency', r['concurrency']):<3d}"
            if "error" in e:
                lines.append(f"{head} the run failed: {e['error'].strip().splitlines()[-1]}")
            elif key == "cuda_graphs":
                lines.append(f"{head} {e['identical']}/{r['requests']} identical, {e['replayed']} replayed / "
                             f"{e['captured']} captured / {e['eager']} eager, {e['tokens'] / e['wall_s']:.0f} tok/s "
                             f"(eager {r['tokens'] / r['wall_s']:.0f})"
                             + (f", capture failed: {'; '.join(e['failed'])}" if e["failed"] else ""))
            else:
                lines.append(f"{head} {e['identical']}/{e['requests']} identical (prompts of "
                             f"{min(e['prompt_tokens'])}-{max(e['prompt_tokens'])} tokens) at max_num_tokens "
                             f"{e['max_num_tokens']}, {e['cut_steps']} of {e['steps']} steps cut a prompt")
    doc["table"] = "\n".join(lines)
    return doc


def graphed_run(eng_dir, jobs, eos, conc: int, want) -> dict:
    """The same requests with generation steps replayed from CUDA graphs (``run --cuda-graphs``; on the cpu backend of
    the script's own test, the runner's simulated replays)."""
    from dflash2_trt.engine.standin.engine import open_standin_engine
    from dflash2_trt.engine.standin.graphs import GraphedSteps
    from dflash2_trt.runtime import Request, Runtime

    eng, _ = open_standin_engine(eng_dir)
    try:
        g = GraphedSteps(eng, simulate=DEVICE != "cuda")
        reqs = [Request(list(p), n, stop_token_ids=eos, task_id=i, seed=i) for i, (p, n) in enumerate(jobs)]
        t0 = time.perf_counter()
        Runtime(g, max_batch_size=conc).generate(reqs)
        wall = time.perf_counter() - t0
    finally:
        eng.close()
    bad = [i for i, (r, w) in enumerate(zip(reqs, want)) if r.output_ids != w]
    return {"identical": len(reqs) - len(bad), "mismatched": bad[:8], "replayed": g.stats["replayed"],
            "captured": g.stats["captured"], "eager": g.stats["eager"], "failed": g.failures(), "wall_s": wall,
            "tokens": sum(len(r.output_ids) for r in reqs)}


def chunked_run(pair, eng_dir, eos, dtype: str, conc: int = 4, new: int = 24) -> dict:
    """Chunked context forced (the project runtime's, facts/context_chunking.yaml): 16 prompts of two shipped prompts
    each (every one longer than a chunk unit) at a step budget of the generation requests' tokens plus one unit, so a
    new prompt beside them is cut; held to the HF target's greedy decoding of the same prompts on the same device."""
    from dflash2_trt.engine.standin.engine import open_standin_engine
    from dflash2_trt.engine.verify import reference_outputs
    from dflash2_trt.runtime import Request, Runtime
    from dflash2_trt.runtime.runtime import context_chunk_unit
    from dflash2_trt.testing.engines import shipped_prompts

    short = shipped_prompts(pair, 16)
    prompts = [short[i] + short[(i + 1) % len(short)] for i in range(len(short))]
    want = reference_outputs(pair.target_dir, prompts, new, eos, dtype=dtype, device=DEVICE)
    eng, _ = open_standin_engine(eng_dir)
    try:
        unit = context_chunk_unit(eng.limits, eng.max_attention_window, eng.limits["max_num_tokens"])
        budget = conc * (eng.K + 1) + unit
        rt = Runtime(eng, max_batch_size=conc, max_num_tokens=budget, chunked_context=True)
        reqs = [Request(list(p), new, stop_token_ids=eos, task_id=i, seed=i) for i, p in enumerate(prompts)]
        rt.generate(reqs)
    finally:
        eng.close()
    bad = [i for i, (r, w) in enumerate(zip(reqs, want)) if r.output_ids != w]
    return {"concurrency": conc, "max_num_tokens": budget, "requests": len(reqs), "identical": len(reqs) - len(bad),
            "mismatched": bad[:8], "first_mismatch": _first_diff(reqs[bad[0]].output_ids, want[bad[0]]) if bad else None,
            "prompt_tokens": [len(p) for p in prompts], "steps": rt.step_count,
            "cut_steps": sum(1 for s in rt.step_log if s.get("cut"))}


_TARGETS: dict = {}


def near_tie(target_dir, dtype: str, prompt, got, want) -> dict:
    """At the first token where the engine and the HF target part: the HF target's own two best logits there (in
    ``dtype`` and in float32, on the GPU), so a difference is shown to be a near-tie of that dtype's rounding (the
    engine verifies K + 1 tokens per pass, the reference one: other matrix shapes, other bf16 roundings) or not."""
    import torch

    from dflash2_trt.reference.loop import load_target

    pos = _first_diff(got, want)["position"]
    ids = torch.tensor([list(prompt) + list(want[:pos])], device=DEVICE)
    out = {"position": pos, "engine": got[pos] if pos < len(got) else None,
           "target": want[pos] if pos < len(want) else None}
    for dt in (dtype, "float32"):
        key = (str(target_dir), dt)
        if key not in _TARGETS:
            _TARGETS[key] = load_target(target_dir, check_values=False, dtype=getattr(torch, dt), device=DEVICE)
        with torch.no_grad():
            logits = _TARGETS[key](ids).logits[0, -1].float()
        top = torch.topk(logits, 2)
        out[dt] = {"top2": [[int(i), float(v)] for v, i in zip(top.values, top.indices)],
                   "margin": float(top.values[0] - top.values[1]),
                   "engine_token_logit": float(logits[out["engine"]]) if out["engine"] is not None else None}
    return out


def _first_diff(got, want):
    from dflash2_trt.engine.verify import first_difference

    pos = first_difference(got, want)
    return {"position": pos, "engine": got[pos] if pos < len(got) else None,
            "target": want[pos] if pos < len(want) else None}


# ---- steps -----------------------------------------------------------------------------------------------------
class TargetShareUsed(Exception):
    """A target of the steps part used its share of the part's time (part_steps): its levels so far are kept."""


SHARE_RESERVE_S = 10.0   # of the part's limit, kept back from the targets' shares (the last save, the engines' release)


CHILD_EXIT_S = SHARE_RESERVE_S   # a child's hard stop comes this long before the end of its share + the reserve
CHILD_TICK_S = 10.0              # the part's steps.json follows a target child's levels this often


def part_steps(out: Path, context_len: int, concurrency: str, targets, steps: int = 8, save=None,
               limit: float | None = None, isolate: bool = False) -> dict:
    """``bench steps`` for each of ``targets``; ``save`` (if given) receives the document so far after each measured
    concurrency (the target in progress with the points it has, ``partial``: true). A target that fails is named in
    ``errors`` with its error, keeps the points it measured before (its report, ``partial``: true, in ``reports`` and
    ``steps-<target>.json``), and the next target is measured. With the part's ``limit`` (seconds), each target gets
    an equal share of what is left when it starts (a target that ends early leaves its time to the next): one that
    uses its share stops after its level in progress (its eager levels: the error says so, the levels kept; its
    CUDA-graph replays: they stop, the report keeps its eager table), so the first target cannot take the second's
    time (the first GPU run lost muse-glimmer-30b's steps to qwen3.8-27b's). ``isolate``: each target in a process
    of its own (:func:`steps_in_child`), so that what one leaves in the process (a CUDA-graph capture that failed can
    leave torch's allocator routing to its pool, so that cached blocks are no longer released; a sticky CUDA error)
    cannot cost the next target its memory or its run (``save`` then follows the child's levels every 10 s)."""
    from dflash2_trt.bench.steps import measure_steps, render

    docs, errors, stopped = [], [], []
    part_start = PROCESS_START if limit is not None else time.perf_counter()

    def doc_of(reports, partial=False):
        table = "\n\n".join([render(d) for d in reports] + [f"{e['target']}: FAILED: {e['error']}" for e in errors]
                             + [f"{e['target']}: stopped: {e['reason']}" for e in stopped])
        return {"reports": reports, "table": table, "partial": partial, "errors": list(errors),
                "stopped_at_share": list(stopped)}

    for idx, t in enumerate(targets):
        last: list = []            # the target's report so far (after each measured concurrency)
        deadline = share = None
        if limit is not None:
            share = max((limit - (time.perf_counter() - part_start) - SHARE_RESERVE_S) / (len(targets) - idx), 0.0)
            deadline = time.perf_counter() + share

        def checkpoint(d, last=last):
            last[:] = [d]
            if save is not None:
                save(doc_of(docs + [d], partial=True))

        def keep(d, deadline=deadline, share=share):
            checkpoint(d)
            if deadline is not None and time.perf_counter() > deadline:
                raise TargetShareUsed(f"its share of the part's time ({share:.0f} s) was used up; the levels "
                                      f"measured before are kept")

        doc = None
        if isolate:
            report, child_errors, child_stopped = steps_in_child(
                out, t, context_len, concurrency, steps, share,
                on_tick=None if save is None else (lambda r: save(doc_of(docs + [r], partial=True))))
            errors.extend(child_errors)
            stopped.extend(child_stopped)
            if report is not None:
                log(render(report))
        else:
            try:
                doc = measure_steps(t, backend=BACKEND, concurrency=concurrency, context_len=context_len, steps=steps,
                                    warmup=2, profile_steps=1, progress=log, partial=keep, checkpoint=checkpoint)
            except TargetShareUsed as e:
                # the plan, not a failure: the levels measured are kept and the part's status stays green
                log(f"[steps] {t}: {e}")
                stopped.append({"target": t, "reason": str(e), "points_kept": len(last[0]["points"]) if last else 0})
            except Exception as e:  # noqa: BLE001 - one target's failure must not cost the next target its numbers
                log(traceback.format_exc())
                errors.append({"target": t, "error": f"{type(e).__name__}: {e}"[:600],
                               "points_kept": len(last[0]["points"]) if last else 0})
            if doc is not None:
                log(render(doc))
            report = doc if doc is not None else (last[0] if last else None)   # a failed one: what it measured before
        if report is not None:
            docs.append(report)
            write_replacing(out / f"steps-{t}.json", json.dumps(report, indent=2))
        if save is not None:
            save(doc_of(docs, partial=t != targets[-1]))
        # the target's engines (tens of GB) before the next target's are drawn; here, not in the except, whose
        # traceback still held a failed target's (a child took its memory with it)
        if not isolate:
            free_gpu_memory()
    return doc_of(docs)


def steps_in_child(out: Path, target: str, context_len: int, concurrency: str, steps: int,
                   share: float | None, on_tick=None) -> tuple[dict | None, list[dict], list[dict]]:
    """One target's steps in a child process (``--one steps-target``; its log ``steps-<target>.log``), stopped at its
    ``share`` of the part's time (SIGTERM, then SIGKILL): (its report or None, its errors, its stop at its share as
    planned: ``part_steps``'s ``stopped_at_share``). The child writes
    ``steps-<target>.json`` after each measured concurrency and its outcome (errors) at the end; a child that was
    stopped or crashed keeps the levels it wrote, and its error names its exit status and log. ``on_tick``: called
    every few seconds while it runs with its report so far (the part's ``steps.json`` follows the child's levels)."""
    from dflash2_trt.children import die_with_parent, run_limited

    outcome = out / f".steps-{target}.outcome.json"
    for stale in (outcome, out / f"steps-{target}.json"):     # a report of an earlier run is not this child's
        stale.unlink(missing_ok=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--out", str(out), "--one", "steps-target",
           "--targets", target, "--context-len", str(context_len), "--concurrency", concurrency,
           "--steps", str(steps)]
    wait = None
    if share is not None:
        wait = max(share + SHARE_RESERVE_S - CHILD_EXIT_S, 1.0)   # the child keeps its own reserve inside this
        cmd += ["--part-limit", str(wait)]
    log(f"[steps] {target} in a child process" + ("" if wait is None else f" (limit {wait:.0f} s)"))
    def tick() -> None:
        try:
            report = json.loads((out / f"steps-{target}.json").read_text())
        except (OSError, ValueError):
            return
        on_tick(report)

    rc = run_limited(cmd, wait if wait is not None else 7 * 24 * 3600.0, out / f"steps-{target}.log",
                     own_group=False, preexec_fn=die_with_parent(),
                     tick=None if on_tick is None else (CHILD_TICK_S, tick))
    try:
        report = json.loads((out / f"steps-{target}.json").read_text())
    except (OSError, ValueError):
        report = None
    stopped = []
    try:
        child = json.loads(outcome.read_text())
        errors, stopped = child["errors"], child.get("stopped_at_share", [])
        outcome.unlink()
    except (OSError, ValueError, KeyError, TypeError):
        why = "stopped at its share of the part's time" if rc == 124 else f"exit status {rc}"
        errors = [{"target": target, "error": f"the child measuring it ended without its outcome ({why}; "
                                              f"steps-{target}.log)",
                   "points_kept": len(report["points"]) if report else 0}]
        if report is not None:
            report["partial"] = True
    return report, errors, stopped


def run_steps_target(args) -> int:
    """The child of :func:`steps_in_child`: one target's steps in this process, ``steps-<target>.json`` after each
    measured concurrency, the outcome at the end."""
    out = Path(args.out)
    target = args.targets

    def save(doc: dict) -> None:
        if doc["reports"]:
            write_replacing(out / f"steps-{target}.json", json.dumps(doc["reports"][-1], indent=2, default=str))

    doc = part_steps(out, args.context_len, args.concurrency, [target], args.steps, save=save,
                     limit=getattr(args, "part_limit", None))
    write_replacing(out / f".steps-{target}.outcome.json",
                    json.dumps({"errors": doc["errors"], "stopped_at_share": doc["stopped_at_share"]}, default=str))
    return 1 if doc["errors"] else 0


# ---- driver ----------------------------------------------------------------------------------------------------
def run_part(name: str, args) -> int:
    out = Path(args.out)
    t0 = time.perf_counter()

    def save(doc: dict) -> None:   # the part's JSON and table so far, each replaced whole
        doc["seconds"] = time.perf_counter() - t0
        write_replacing(out / f"{name}.json", json.dumps(doc, indent=2, default=str))
        write_replacing(out / f"{name}.txt", doc["table"] + "\n")

    try:
        if name == "lossless":
            doc = part_lossless(out, tuple(int(x) for x in args.lossless_levels.split(",")),
                                tuple(args.lossless_dtypes.split(",")), save=save, jobs=args.lossless_jobs,
                                targets=args.lossless_targets.split(","))
            # a bf16 output that differs only at a tie of the target's own logits (the build gate's rule) is no
            # failure: the table counts it apart (the first H100 run exited 1 on bf16 ties alone)
            ok = doc["all_identical_or_ties"]
        else:
            doc = part_steps(out, args.context_len, args.concurrency, args.targets.split(","), args.steps, save=save,
                             limit=getattr(args, "part_limit", None), isolate=getattr(args, "isolate", False))
            ok = not doc["errors"]
    except Exception:  # noqa: BLE001 - the failure is the result
        tb = traceback.format_exc()
        log(tb)
        # the rows or reports saved before the failure stay in <part>.json beside the error
        try:
            kept = json.loads((out / f"{name}.json").read_text())
        except (OSError, ValueError):
            kept = {}
        write_replacing(out / f"{name}.json", json.dumps({**kept, "error": tb, "seconds": time.perf_counter() - t0},
                                                         indent=2, default=str))
        return 1
    save(doc)
    if name == "lossless" and (out / "lossless-cells").is_dir():
        import shutil

        shutil.rmtree(out / "lossless-cells")    # every cell's rows are in lossless.json, its log in lossless.log
    return 0 if ok else 1


def free_gpu_memory() -> None:
    """Collect what only a reference cycle keeps alive and hand the allocator's cached blocks back (CUDA)."""
    import gc

    import torch

    gc.collect()
    if DEVICE == "cuda":
        torch.cuda.empty_cache()


def write_replacing(path: Path, text: str) -> None:
    """``path`` replaced whole by ``text`` (the package's atomic write: beside it, then renamed)."""
    from dflash2_trt.bench.io import atomic_write_text

    atomic_write_text(path, text)


def default_jobs() -> int:
    """Cells of the lossless table run at once: all six on a GPU machine with the cores for them, one on the cpu
    backend (its rehearsal here has two cores and no idle device)."""
    if BACKEND != "cuda":
        return 1
    return max(1, min(len(FAMILIES) * 2, usable_cpus() // 2))


def part_limits(parts: list[str], part_timeout: float, budget: float | None, spent: float) -> float:
    """The next part's limit: ``part_timeout``, and with a ``budget`` for all the parts no more than what is left of
    it, the lossless part (when steps follows) no more than half of it, so that the steps get at least the other
    half and whatever lossless leaves."""
    if budget is None:
        return part_timeout
    left = budget - spent - 6           # the part's stop (5 s) and this driver's own exit
    cap = budget / 2 if parts[0] == "lossless" and len(parts) > 1 else left
    return max(1.0, min(part_timeout, left, cap))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="directory for the JSON, tables and logs (created)")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    p.add_argument("--context-len", type=int, default=1024)
    p.add_argument("--concurrency", default="1,4,16,32,64")
    p.add_argument("--targets", default=",".join(STEP_TARGETS))
    p.add_argument("--part-timeout", type=int, default=300, help="seconds per part at most")
    p.add_argument("--budget", type=float, default=None,
                   help="seconds for all the parts together: each part gets at most what is left, lossless at most "
                        "half when steps follows (steps then gets the rest)")
    p.add_argument("--lossless-levels", default="1,16", help="lossless: concurrency levels")
    p.add_argument("--lossless-dtypes", default="float32,bfloat16", help="lossless: engine dtypes")
    p.add_argument("--lossless-targets", default=",".join(k for k, _ in FAMILIES), help="lossless: tiny pairs")
    p.add_argument("--lossless-jobs", type=int, default=None,
                   help="lossless: cells (target x dtype) run at once as processes [default: 6 on a GPU machine "
                        "with 12+ cores, else half its cores; 1 on the cpu backend]")
    p.add_argument("--steps", type=int, default=8, help="steps: timed steps per point")
    p.add_argument("--one", help=argparse.SUPPRESS)   # run one part in this process (the driver's children)
    p.add_argument("--cell", help=argparse.SUPPRESS)  # --one lossless-cell: TARGET:DTYPE
    p.add_argument("--cell-graphs", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--part-limit", type=float, default=None, help=argparse.SUPPRESS)  # the child's own limit
    p.add_argument("--no-isolate", dest="isolate", action="store_false",
                   help="steps: measure the targets one after another in one process (default: each in its own)")
    args = p.parse_args(argv)
    if args.lossless_jobs is None:
        args.lossless_jobs = default_jobs()
    if args.lossless_jobs < 1:
        p.error(f"--lossless-jobs must be >= 1, got {args.lossless_jobs}")
    bad = [t for t in args.lossless_targets.split(",") if t not in dict(FAMILIES)]
    if bad:
        p.error(f"--lossless-targets: unknown {', '.join(bad)}; expected some of {', '.join(k for k, _ in FAMILIES)}")
    if args.budget is not None and not args.budget > 0:
        p.error(f"--budget must be a positive number of seconds, got {args.budget}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(REPO))
    if args.one == "lossless-cell":
        return run_cell(args)
    if args.one == "steps-target":
        return run_steps_target(args)
    if args.one:
        return run_part(args.one, args)
    missing = requirements() if BACKEND == "cuda" else []
    if missing:
        log("gpu_e2e: this machine lacks: " + "; ".join(missing))
        return 2
    parts = [x for x in args.parts.split(",") if x]
    unknown = [x for x in parts if x not in PARTS]
    if unknown:
        log(f"gpu_e2e: unknown part(s) {unknown}; expected {', '.join(PARTS)}")
        return 2
    from dflash2_trt.children import die_with_parent, run_limited

    worst = 0
    start = PROCESS_START      # the budget counts from this process's start: its imports (torch, transformers) too
    for i, name in enumerate(parts):
        cmd = [sys.executable, __file__, "--out", str(out), "--one", name, "--context-len", str(args.context_len),
               "--concurrency", args.concurrency, "--targets", args.targets, "--lossless-levels", args.lossless_levels,
               "--lossless-dtypes", args.lossless_dtypes, "--lossless-jobs", str(args.lossless_jobs),
               "--lossless-targets", args.lossless_targets,
               "--steps", str(args.steps)] + ([] if args.isolate else ["--no-isolate"])
        limit = part_limits(parts[i:], args.part_timeout, args.budget, time.perf_counter() - start)
        cmd += ["--part-limit", str(limit)]
        log(f"== {name} (limit {limit:.0f} s)")
        t0 = time.perf_counter()
        # in this driver's process group (a stop aimed at the driver, run_all's or ``timeout``'s, reaches the part
        # and its cells too), ending with the driver if that is killed outright; at its limit SIGTERM (a lossless
        # part then saves its table and stops its cells), SIGKILL 5 s later
        rc = run_limited(cmd, limit, out / f"{name}.log", own_group=False, preexec_fn=die_with_parent())
        log(f"== {name}: exit {rc} in {time.perf_counter() - t0:.0f} s")
        txt = out / f"{name}.txt"
        log(txt.read_text() if txt.is_file() else (out / f"{name}.log").read_text()[-3000:])
        worst = max(worst, 1 if rc else 0)
    return worst


if __name__ == "__main__":
    sys.exit(main())
