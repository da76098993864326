"""``bench project --costs-from``: speedups from a ``bench steps`` report's measured step costs instead of the
roofline model's assumed ones, and the output says which it used."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from dflash2_trt.bench.run import bench_project
from dflash2_trt.cli import main
from dflash2_trt.errors import ConfigError


def _steps(tmp_path, **over):
    doc = {"format": "dflash2-trt bench steps", "schema_version": 1, "target": "qwen3.8-27b", "backend": "cuda",
           "device": "NVIDIA H200", "draft_len": 7, "context_len": 1024, "weights": "random (outputs meaningless)",
           "acceptance": 4.8, "notes": ["a note"],
           "points": [{"concurrency": c, "speculative": {"wall_ms": 100.0 + c, "gpu_busy_ms": 20.0 + c,
                                                         "components_ms": {"gdn": 1.0}, "spans_ms": {"gdn": 2.0}},
                       "target_only": {"wall_ms": 80.0 + c, "gpu_busy_ms": 10.0 + c}} for c in (1, 4, 16, 32)]}
    doc.update(over)
    p = tmp_path / "steps.json"
    p.write_text(json.dumps(doc))
    return p


def test_measured_costs_give_the_speedup_and_say_so(tmp_path):
    doc = bench_project(target="qwen3.8-27b", costs_from=_steps(tmp_path))   # every measured concurrency
    assert [p["concurrency"] for p in doc["gpus"][0]["points"]] == [1, 4, 16, 32]
    assert doc["costs"]["kind"] == "measured" and doc["costs"]["basis"] == "busy" and doc["tau"] == 4.8
    pts = {p["concurrency"]: p for p in doc["gpus"][0]["points"]}
    assert pts[1]["speedup"] == pytest.approx(4.8 * 11.0 / 21.0) and pts[32]["speedup"] == pytest.approx(4.8 * 42 / 52)
    assert doc["gpus"][0]["article"]["concurrency_32"]["projected_speedup"] == pts[32]["speedup"]
    wall = bench_project(target="qwen3.8-27b", costs_from=_steps(tmp_path), cost_basis="wall", acceptance=3.0)
    assert wall["gpus"][0]["points"][0]["speedup"] == pytest.approx(3.0 * 81 / 101)
    code, out = (r := CliRunner().invoke(main, ["bench", "project", "--costs-from", str(_steps(tmp_path))])).exit_code, r.output
    assert code == 0 and out.startswith("costs: measured (busy time per step)")
    r = CliRunner().invoke(main, ["bench", "project", "--acceptance", "4.8", "--gpu", "h200"])
    assert r.exit_code == 0 and r.output.startswith("costs: assumed (roofline model")


def test_the_reports_target_and_a_cpu_reports_wall_time_by_default(tmp_path):
    """`bench project --costs-from steps.json` refused a tiny CPU report until given both --target tiny and
    --cost-basis wall, although the report names its target and a CPU has no kernel times (a new user's review)."""
    cpu = _steps(tmp_path, target="tiny", backend="cpu", device="cpu", acceptance=None,
                 points=[{"concurrency": 1, "speculative": {"wall_ms": 20.0}, "target_only": {"wall_ms": 8.0}}])
    doc = bench_project(costs_from=cpu, acceptance=3.0)
    assert doc["target"]["name"] == "tiny" and doc["costs"]["basis"] == "wall"
    assert doc["gpus"][0]["points"][0]["speedup"] == pytest.approx(3.0 * 8 / 20)
    with pytest.raises(ConfigError, match="concurrency 1: no gpu_busy_ms in the report"):   # asked for: still refused
        bench_project(costs_from=cpu, acceptance=3.0, cost_basis="busy")
    with pytest.raises(ConfigError, match="measured 'tiny', not 'qwen3.8-27b'"):               # insisted on: checked
        bench_project(target="qwen3.8-27b", costs_from=cpu, acceptance=3.0)
    assert bench_project(costs_from=_steps(tmp_path))["costs"]["basis"] == "busy"              # a GPU's: kernel time
    # the roofline model's default target stays the flagship; the H100 (Hopper, where the project measured) is a GPU
    r = CliRunner().invoke(main, ["bench", "project", "--acceptance", "4.8", "--gpu", "h100,h200"])
    assert r.exit_code == 0 and "qwen3.8-27b + drafter" in r.output, r.output
    assert "NVIDIA H100 SXM (3.35 TB/s, 989.4 TFLOP/s bf16 dense)" in r.output


def test_a_file_that_is_not_a_steps_report_is_one_line(tmp_path):
    """Without a target to match, a list, a report without a target or a `bench run` report given to --costs-from
    crashed (AttributeError / TypeError, a review): the format is checked before anything is read from it."""
    for i, doc in enumerate([[], {"format": "x"}, {"format": "dflash2-trt bench report", "target": "tiny",
                                                   "backend": "cpu", "runs": []}]):
        f = tmp_path / f"r{i}.json"
        f.write_text(json.dumps(doc))
        r = CliRunner().invoke(main, ["bench", "project", "--costs-from", str(f), "--acceptance", "3"])
        assert r.exit_code == 1 and r.output == (f"error: {f}: not a `bench steps` report (format 'dflash2-trt bench "
                                                 f"steps', points[])\n"), r.output


@pytest.mark.parametrize("kw,needle", [
    (dict(steps=dict(format="something else")), "not a `bench steps` report"),
    (dict(steps=dict(target="muse-glimmer-30b")), "not 'qwen3.8-27b'"),
    (dict(concurrency="1,64"), "concurrency 64 was not measured"),
    (dict(bandwidth_efficiency=0.6), "apply to the roofline model"),
    (dict(context_len=4096), "--context-len applies to the roofline model"),
    (dict(gpus="b200"), "--gpu applies to the roofline model"),
    (dict(recurrent_verify="intermediate"), "--recurrent-verify applies to the roofline model"),
    (dict(steps=dict(acceptance=9.5)), r"steps\.json: acceptance: must be a number in \[1, draft_len \+ 1 = 8\]"),
    (dict(steps=dict(acceptance="4.8")), r"steps\.json: acceptance: .*got '4\.8' \(or pass --acceptance\)"),
])
def test_what_measured_costs_refuse(tmp_path, kw, needle):
    steps = _steps(tmp_path, **kw.pop("steps", {}))
    with pytest.raises(ConfigError, match=needle):
        bench_project(target="qwen3.8-27b", costs_from=steps, **kw)


def test_a_cpu_report_has_no_kernel_time(tmp_path):
    doc = json.loads(_steps(tmp_path).read_text())
    for p in doc["points"]:
        del p["speculative"]["gpu_busy_ms"]
    (tmp_path / "cpu.json").write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="--cost-basis wall"):
        bench_project(target="qwen3.8-27b", costs_from=tmp_path / "cpu.json")


def test_a_gpu_report_whose_profiler_recorded_nothing_says_so(tmp_path):
    """The first H100 run: CUPTI could not start, so the points have wall times and a profiler_error, no busy time.
    The busy basis names that reason (not 'measure on a GPU'), the wall basis works, and the report's table says why
    its component columns are host spans."""
    from dflash2_trt.bench.steps import render

    doc = json.loads(_steps(tmp_path).read_text())
    why = "the profiler recorded no GPU kernels (CUPTI unavailable?)"
    for p in doc["points"]:
        for k in ("speculative", "target_only"):
            p[k].pop("gpu_busy_ms")
            p[k]["profiler_error"] = why
        p["speculative"].pop("components_ms")
    (tmp_path / "h100.json").write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match=r"no gpu_busy_ms in the report: the profiler recorded no GPU kernels .*"
                                          r"--cost-basis wall or graph") as err:
        bench_project(target="qwen3.8-27b", costs_from=tmp_path / "h100.json")
    assert "measure on a GPU" not in str(err.value)
    wall = bench_project(target="qwen3.8-27b", costs_from=tmp_path / "h100.json", cost_basis="wall")
    assert wall["gpus"][0]["points"][0]["speedup"] == pytest.approx(4.8 * 81 / 101)
    doc.update(backend="cuda", dtype="bfloat16", components=["gdn"], skipped=[])
    table = render(doc)
    assert "spec components (host spans, ms)" in table and f"no kernel times (busy, components): {why}" in table


def test_the_graph_basis_takes_the_replay_time_or_says_why_there_is_none(tmp_path):
    doc = json.loads(_steps(tmp_path).read_text())
    for p in doc["points"]:
        c = p["concurrency"]
        p["speculative"]["graph_ms"], p["target_only"]["graph_ms"] = 30.0 + c, 15.0 + c
    (tmp_path / "g.json").write_text(json.dumps(doc))
    out = bench_project(target="qwen3.8-27b", costs_from=tmp_path / "g.json", cost_basis="graph", acceptance=4.0)
    assert out["costs"]["basis"] == "graph"
    assert out["gpus"][0]["points"][0]["speedup"] == pytest.approx(4.0 * 16 / 31)
    for p in doc["points"]:                     # a step that could not be captured: CUDA's reason is passed on
        del p["speculative"]["graph_ms"]
        p["speculative"]["graph_error"] = "RuntimeError: operation not permitted when stream is capturing"
    (tmp_path / "e.json").write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="its capture failed: RuntimeError: operation not permitted"):
        bench_project(target="qwen3.8-27b", costs_from=tmp_path / "e.json", cost_basis="graph")


def _out_of_memory_from(monkeypatch, steps_mod, level: int, more: str = "") -> None:
    """bench steps' ``measure`` runs out of GPU memory at ``level`` and above (as a smaller GPU does)."""
    import torch

    real = steps_mod.measure

    def measure(engine, concurrency, *a, **k):
        if concurrency >= level:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB" + more)
        return real(engine, concurrency, *a, **k)

    monkeypatch.setattr(steps_mod, "measure", measure)


def test_a_level_out_of_gpu_memory_keeps_the_levels_measured(monkeypatch):
    """bench steps on a GPU smaller than the H200: the level that runs out of memory and the higher ones are named
    with the reason, the levels before it kept; bench project --costs-from then says why a level is missing."""
    import dflash2_trt.bench.steps as steps_mod
    import torch

    _out_of_memory_from(monkeypatch, steps_mod, 4, "\nmore detail")
    doc = steps_mod.measure_steps("tiny", backend="cpu", concurrency="1,4,16", context_len=16, steps=1, warmup=0,
                                  profile_steps=0, graph=False)
    assert [p["concurrency"] for p in doc["points"]] == [1]
    assert [s["concurrency"] for s in doc["skipped"]] == [4, 16]
    assert doc["skipped"][0]["error"] == "out of GPU memory: CUDA out of memory. Tried to allocate 2.00 GiB"
    text = steps_mod.render(doc)
    assert "concurrency 16: not measured (out of GPU memory" in text
    row = text.splitlines()[2].split()          # a CPU point has no GPU busy time: said, not printed as nan
    assert row[0] == "1" and row[3:5] == ["n/a", "n/a"] and "nan" not in text, text
    from dflash2_trt.bench.projection import measured_projection

    with pytest.raises(ConfigError, match=r"concurrency 4 was not measured \(the report has \[1\]; out of GPU memory"):
        measured_projection(doc, tau=2.0, acceptance_info={}, source="steps.json", concurrency=[1, 4])
    monkeypatch.setattr(steps_mod, "measure", lambda *a, **k: (_ for _ in ()).throw(torch.OutOfMemoryError("oom")))
    with pytest.raises(torch.OutOfMemoryError):                 # nothing measured: the error itself
        steps_mod.measure_steps("tiny", backend="cpu", concurrency="1,4", context_len=16, steps=1, warmup=0,
                                profile_steps=0, graph=False)


def test_engines_too_big_for_the_gpu_drop_the_top_level_and_measure_the_rest(monkeypatch):
    """Both engines are sized for the highest level before any is measured: qwen3.8-27b sized for 64 requests (its
    weights, and a KV pool and 64 state slots in each engine) needs more than an H100's 80 GB, and the whole report
    was lost to an out-of-memory error at the build. Now the top level is dropped with the reason and the engines
    are built again for the next."""
    import dflash2_trt.bench.steps as steps_mod
    import torch

    real = steps_mod.TargetOnlyEngine
    sized = []

    def target_only(config, ckpt, limits, **kw):
        sized.append(limits["max_batch_size"])
        if limits["max_batch_size"] > 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.40 GiB\nmore detail")
        return real(config, ckpt, limits, **kw)

    monkeypatch.setattr(steps_mod, "TargetOnlyEngine", target_only)
    said = []
    doc = steps_mod.measure_steps("tiny", backend="cpu", concurrency="1,2,4", context_len=16, steps=1, warmup=0,
                                  profile_steps=0, graph=False, progress=said.append)
    assert sized == [4, 2] and [p["concurrency"] for p in doc["points"]] == [1, 2]
    assert doc["skipped"] == [{"concurrency": 4, "error": "out of GPU memory: CUDA out of memory. Tried to allocate "
                                                          "9.40 GiB (sizing the engines for 4 requests)"}]
    assert doc["limits"]["max_batch_size"] == 2 and any("concurrency 4 not measured" in s for s in said)
    assert "concurrency 4: not measured (out of GPU memory" in steps_mod.render(doc)
    sized.clear()          # levels given out of order: the highest is dropped, not the last given
    doc = steps_mod.measure_steps("tiny", backend="cpu", concurrency="4,1,2", context_len=16, steps=1, warmup=0,
                                  profile_steps=0, graph=False)
    assert sized == [4, 2] and [p["concurrency"] for p in doc["points"]] == [1, 2]
    assert [x["concurrency"] for x in doc["skipped"]] == [4]
    with pytest.raises(torch.OutOfMemoryError):            # even the lowest level does not fit: the error itself
        steps_mod.measure_steps("tiny", backend="cpu", concurrency="4", context_len=16, steps=1, warmup=0,
                                profile_steps=0, graph=False)


def test_an_engine_that_runs_out_of_memory_part_way_frees_its_pools(monkeypatch):
    """The KV and state pools register themselves until released: an engine whose build ran out of GPU memory after
    some of its pools were made (qwen3.8-27b's 48 state pools on an 80 GB H100) has no object to close, and its pools
    stayed registered for the rest of the steps process (~9 GiB carried from the c64 attempt into c32, seen by a
    reviewer's arithmetic of the H100 run). Now the build releases what it made; and where even the lowest level does
    not fit, the combined engine built before the baseline ran out is closed before the error goes on."""
    import dflash2_trt.bench.steps as steps_mod
    import dflash2_trt.engine.standin.engine as engine_mod
    import torch
    from dflash2_trt.trtllm.cpu.attention import KVCachePool
    from dflash2_trt.trtllm.cpu.state import StatePool

    kv0, st0 = set(KVCachePool._registry), set(StatePool._registry)
    made = []

    class Failing(StatePool):
        def __init__(self, *a, **k):
            if len(made) == 1:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")
            super().__init__(*a, **k)
            made.append(self)

    monkeypatch.setattr(engine_mod, "StatePool", Failing)
    with pytest.raises(torch.OutOfMemoryError):
        steps_mod.step_engines("tiny-hybrid", backend="cpu", max_batch=2, context_len=16, dtype="float32")
    assert len(made) == 1                       # the KV pool and a state pool were made before the failure
    assert set(KVCachePool._registry) == kv0 and set(StatePool._registry) == st0
    monkeypatch.setattr(engine_mod, "StatePool", StatePool)

    real = steps_mod.TargetOnlyEngine

    def target_only(*a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.40 GiB")

    monkeypatch.setattr(steps_mod, "TargetOnlyEngine", target_only)
    with pytest.raises(torch.OutOfMemoryError):
        steps_mod.engines_that_fit("tiny-hybrid", [1], backend="cpu", context_len=16, dtype="float32")
    assert set(KVCachePool._registry) == kv0 and set(StatePool._registry) == st0
    assert real is not None


def test_bench_steps_hands_out_its_points_as_they_are_measured():
    """scripts/gpu_e2e.py runs bench steps for two 27-30B targets under a time limit: the report so far after each
    level (its JSON rewritten then), so that a run stopped at the limit keeps the levels it measured."""
    import json

    import dflash2_trt.bench.steps as steps_mod

    seen = []
    doc = steps_mod.measure_steps("tiny", backend="cpu", concurrency="1,2", context_len=16, steps=1, warmup=0,
                                  profile_steps=0, graph=False, partial=lambda d: seen.append(json.loads(json.dumps(d))))
    assert [[p["concurrency"] for p in d["points"]] for d in seen] == [[1], [1, 2]]
    assert all(d["partial"] is True and d["target"] == "tiny" for d in seen) and "partial" not in doc
    assert seen[-1]["points"] == json.loads(json.dumps(doc["points"]))


def test_bench_steps_checks_context_and_acceptance_before_measuring(tmp_path):
    """The default --context-len (1024) used to fail on a tiny target (max_position_embeddings 512) with an error
    naming --max-seq-len, an option bench steps does not have; --acceptance was not checked at all (nan wrote NaN,
    not JSON, into --json; a negative one gave negative speedups)."""
    import dflash2_trt.bench.steps as steps_mod

    doc = steps_mod.measure_steps("tiny", backend="cpu", concurrency="1", steps=1, warmup=0, profile_steps=0,
                                  graph=False)
    assert doc["context_len"] == 512 - 32 - 8
    for bad in (0, 473, 10**9):
        with pytest.raises(ConfigError, match=r"--context-len: must be an integer in \[1, 472\]"):
            steps_mod.measure_steps("tiny", backend="cpu", concurrency="1", context_len=bad, steps=1)
    for bad in (float("nan"), 0.5, -2.0, 9.0):
        with pytest.raises(ConfigError, match=r"--acceptance: must be in \[1, 8\]"):
            steps_mod.measure_steps("tiny", backend="cpu", concurrency="1", context_len=16, acceptance=bad, steps=1)
    out = tmp_path / "s.json"
    r = CliRunner().invoke(main, ["bench", "steps", "--target", "tiny", "--backend", "cpu", "--concurrency", "1",
                                  "--steps", "1", "--acceptance", "nan", "--json", str(out)])
    assert r.exit_code == 1 and r.output.strip().splitlines() == [
        "error: --acceptance: must be in [1, 8] (tokens per step with 7 drafts), got nan"]
    assert not out.exists()


def test_bench_steps_on_the_cpu_refuses_weights_beyond_the_memory_available(monkeypatch):
    """`bench steps --target qwen3.8-27b --backend cpu` drew 54 GiB of random weights in host memory and was ended by
    the kernel's OOM killer (exit 137, no word). The weights' size is known from the configs: refused in one line."""
    import dflash2_trt.bench.steps as steps_mod

    monkeypatch.setattr(steps_mod, "available_memory_bytes", lambda: 1024)
    with pytest.raises(ConfigError, match=r"--backend: tiny's weights at its real widths take .* GiB \(bfloat16\), "
                                          r"more than the 0.0 GiB of memory available here"):
        steps_mod.measure_steps("tiny", backend="cpu", concurrency="1", context_len=16, steps=1)
    r = CliRunner().invoke(main, ["bench", "steps", "--target", "qwen3.8-27b", "--backend", "cpu", "--concurrency", "1"])
    lines = [ln for ln in r.output.strip().splitlines() if ln.strip()]
    assert r.exit_code == 1 and lines[0].startswith("error: --backend: qwen3.8-27b's weights") and len(lines) == 1, \
        r.output


def test_bench_steps_notes_do_not_claim_host_synchronisations():
    """The report's notes say what its times include. The stand-in's paged attention is planned from host inputs and
    a warm step holds no host read of a device value (tests/engine/test_capture_safety.py; docs/gpu.md: "They are
    gone since"), so a note blaming "host synchronisations in the stand-in's paged attention" misreads the times."""
    from dflash2_trt.bench.steps import NOTES, PLUGIN_NOTE

    for note in [*NOTES, *PLUGIN_NOTE.values()]:
        assert "synchronis" not in note, note


def test_bench_steps_json_replaces_its_own_report_only_and_says_so_before_measuring(tmp_path, monkeypatch):
    """`bench steps --json tiny-engine/engine.json` overwrote the engine's manifest without a word (the engine no
    longer opened). It replaces a previous `bench steps` report and refuses any other file, before measuring."""
    import dflash2_trt.bench.steps as steps_mod

    manifest = tmp_path / "engine.json"
    manifest.write_text(json.dumps({"format": "dflash2-trt engine", "backend": "cpu"}))
    proj = tmp_path / "proj.json"
    assert CliRunner().invoke(main, ["bench", "project", "--acceptance", "4.8", "--gpu", "h200", "--concurrency",
                                     "1", "--json", str(proj)]).exit_code == 0
    before = {p: p.read_bytes() for p in (manifest, proj)}

    def measured(*a, **k):
        raise AssertionError("measured before the output was refused")
    monkeypatch.setattr(steps_mod, "measure_steps", measured)
    for p, what in ((manifest, "a 'dflash2-trt engine' file"), (proj, "a `bench project` projection")):
        r = CliRunner().invoke(main, ["bench", "steps", "--target", "tiny", "--backend", "cpu", "--json", str(p)])
        assert r.exit_code == 1 and r.output.strip().splitlines() == [
            f"error: --json: {p} exists and is {what}, not a `bench steps` report (this command replaces only its "
            f"own); pass another path"], r.output
    assert {p: p.read_bytes() for p in before} == before
    own = _steps(tmp_path)                          # a previous bench steps report: replaced
    monkeypatch.setattr(steps_mod, "measure_steps", lambda *a, **k: json.loads(own.read_text()) | {"new": True})
    monkeypatch.setattr(steps_mod, "render", lambda doc: "table")
    r = CliRunner().invoke(main, ["bench", "steps", "--target", "tiny", "--backend", "cpu", "--json", str(own)])
    assert r.exit_code == 0 and f"wrote {own}" in r.output, r.output
    assert json.loads(own.read_text())["new"] is True


def test_bench_project_cost_basis_needs_measured_costs():
    """`bench project --acceptance 3 --cost-basis graph` printed the roofline model: the basis was ignored."""
    r = CliRunner().invoke(main, ["bench", "project", "--acceptance", "3", "--cost-basis", "graph"])
    assert r.exit_code == 1 and r.output.strip().splitlines() == [
        "error: --cost-basis: applies to measured costs only: give --costs-from STEPS.json too"], r.output
    with pytest.raises(ConfigError, match="--cost-basis: applies to measured costs only"):
        bench_project(acceptance=3.0, cost_basis="busy")


def test_host_spans_add_up_to_the_steps_they_were_timed_in(monkeypatch):
    """On a busy machine `bench steps --backend cpu` reported spans of 104 ms against a 39.9 ms step with `rest`
    clamped to 0: the spans come from instrumented steps of their own, after the timed ones. Their rest is now
    what those steps took beyond them (spans_step_ms), and the table says the components add up to those steps."""
    import contextlib
    import time as time_mod

    import dflash2_trt.bench.steps as steps_mod

    real_scopes = steps_mod.component_scopes

    @contextlib.contextmanager
    def busy_while_instrumented(engine):
        """The machine gets busy while the spans are timed: the selector takes 250 ms more, inside its span."""
        cls = engine.net.DFlash2Selector
        propose = cls.propose

        def slow(*a, **k):
            time_mod.sleep(0.25)
            return propose(*a, **k)
        cls.propose = slow
        try:
            with real_scopes(engine) as scopes:
                yield scopes
        finally:
            cls.propose = propose
    monkeypatch.setattr(steps_mod, "component_scopes", busy_while_instrumented)
    doc = steps_mod.measure_steps("tiny", backend="cpu", concurrency="1", context_len=16, steps=1, warmup=1,
                                  profile_steps=1, graph=False)
    sp = doc["points"][0]["speculative"]
    assert sp["spans_ms"]["selector"] >= 250.0      # the spans' steps were not the timed ones (wall_ms: ~10 ms)
    assert sp["spans_step_ms"] >= sp["spans_ms"]["selector"]
    assert sum(sp["spans_ms"].values()) == pytest.approx(sp["spans_step_ms"])   # rest: those steps less the spans
    table = steps_mod.render(doc)
    assert (f"host spans: timed in instrumented steps of their own, which took (ms) c1 {sp['spans_step_ms']:.2f}; "
            f"the components and rest add up to those, not to spec ms") in table


def _graph_probe(monkeypatch, results):
    """CUDA-graph replays on the CPU (a stand-in for ``graph_point``: the capture itself needs a GPU); each call takes
    the next of ``results`` and is logged with the engine it replayed."""
    import dflash2_trt.bench.steps as steps_mod

    log, it = [], iter(results)
    monkeypatch.setattr(steps_mod, "can_graph", lambda engine: True)

    def graph_point(engine, concurrency, context_len, *, steps):
        log.append(("graph", concurrency, "target_only" if engine.K == 0 else "speculative"))
        return next(it)

    monkeypatch.setattr(steps_mod, "graph_point", graph_point)
    return steps_mod, log


def test_the_first_level_is_replayed_before_a_time_limit_can_end_the_sweep(monkeypatch):
    """gpu_e2e ends a target's sweep from ``partial`` when its share of the part is used: the first level's CUDA-graph
    replays come before that call, the other levels' after every eager level (a capture that fails cannot cost them)."""
    steps_mod, log = _graph_probe(monkeypatch, [{"graph_ms": 2.0}, {"graph_ms": 1.0}] * 3)

    def partial(d):
        log.append(("partial", [p["concurrency"] for p in d["points"]]))

    doc = steps_mod.measure_steps("tiny", backend="cpu", concurrency="1,2,4", context_len=16, steps=1, warmup=0,
                                  profile_steps=0, partial=partial, acceptance=3.0)
    assert log == [("graph", 1, "speculative"), ("graph", 1, "target_only"), ("partial", [1]), ("partial", [1, 2]),
                   ("partial", [1, 2, 4]), ("graph", 2, "speculative"), ("graph", 2, "target_only"),
                   ("partial", [1, 2, 4]), ("graph", 4, "speculative"), ("graph", 4, "target_only"),
                   ("partial", [1, 2, 4])]
    assert all(p["speedup_graph"] == 3.0 * 1.0 / 2.0 for p in doc["points"])

    class ShareUsed(Exception):
        pass

    def stop_after_first(d):
        raise ShareUsed
    steps_mod, log = _graph_probe(monkeypatch, [{"graph_ms": 2.0}, {"graph_ms": 1.0}])
    seen = []
    with pytest.raises(ShareUsed):
        steps_mod.measure_steps("tiny", backend="cpu", concurrency="1,2", context_len=16, steps=1, warmup=0,
                                profile_steps=0, partial=lambda d: (seen.append(d), stop_after_first(d)))
    assert seen[0]["points"][0]["speculative"]["graph_ms"] == 2.0       # the kept level has its replay


def test_a_capture_that_fails_at_the_first_level_is_not_tried_again(monkeypatch):
    err = {"graph_error": "operation not permitted when stream is capturing"}
    steps_mod, log = _graph_probe(monkeypatch, [err, err])
    doc = steps_mod.measure_steps("tiny", backend="cpu", concurrency="1,2", context_len=16, steps=1, warmup=0,
                                  profile_steps=0)
    assert [e for e in log if e[0] == "graph"] == [("graph", 1, "speculative"), ("graph", 1, "target_only")]
    assert doc["points"][0]["speculative"]["graph_error"] == err["graph_error"]
    assert "graph_error" not in doc["points"][1]["speculative"]


def test_a_level_out_of_memory_after_a_failed_first_capture_says_so(monkeypatch):
    """The first level's capture comes before the higher eager levels; where it failed and a higher level then runs
    out of memory, the skip names the failed capture as a possible cause."""
    err = {"graph_error": "operation not permitted when stream is capturing"}
    steps_mod, log = _graph_probe(monkeypatch, [err, err])
    _out_of_memory_from(monkeypatch, steps_mod, 4)
    doc = steps_mod.measure_steps("tiny", backend="cpu", concurrency="1,4", context_len=16, steps=1, warmup=0,
                                  profile_steps=0)
    assert doc["skipped"][0]["error"].endswith("(after the first level's CUDA-graph capture failed)")
