"""``dflash2-trt bench steps``: one engine step at a target's real widths, measured, with random weights.

The combined engine (draft, verify, accept, commit) and the target-only baseline of a registered target are built
from its published configs (``dflash2_trt/assets/published/``; nothing is downloaded, no checkpoint is written or
read) with every parameter drawn at random on the backend's device: the widths, dtypes and work per step are the
real ones, the tokens are meaningless. ``concurrency`` requests are placed in the generation phase at
``context_len`` committed tokens (``Runtime.adopt``: their KV blocks and state slots reserved, nothing prefilled),
and the same step is timed repeatedly:

- ``wall_ms``: per step, from the feed to the outputs in host memory (what the runtime waits for), synchronised;
- ``gpu_busy_ms`` and ``components_ms`` (CUDA, with the torch profiler): the kernels' own time per step, split into
  ``target_linear`` (the target's matrix multiplies, Gated DeltaNet projections included), ``attention`` (the
  stand-in's paged attention: torch ops, NOT TensorRT-LLM's kernels), ``gdn`` (the DFlash2GatedDeltaNet plugin's
  kernels, forward and commit), ``lm_head`` (the target's LM head: verify logits and the drafter's unary scores),
  ``drafter`` (the drafter's layers and its context commit), ``selector`` (top-k, projection, the scan plugin),
  ``accept`` (the in-engine acceptance) and ``rest`` (embedding, norms, residuals, packing);
- ``spans_ms``: the same components' elapsed time between CUDA events (kernels plus the launch and host gaps
  inside them; the host clock on the CPU), from ``profile_steps`` instrumented steps of their own, after the timed
  ones: ``spans_step_ms`` is those steps' wall time, which the spans and their ``rest`` add up to (not ``wall_ms``:
  on a busy machine the two can differ by far, and the table says so);
- ``ops_per_step``: the torch operators one step dispatches (views included; counted on the calling thread, which is
  every rank at tp 1, the only tp ``bench steps`` builds), and on CUDA ``kernels_per_step`` (the profiler's GPU
  activities: kernels, copies and sets): an eager step pays a launch and the Python around it for each, which is what a TensorRT
  engine (one enqueue) or a CUDA graph removes; the difference between ``wall_ms`` and ``gpu_busy_ms`` is mostly
  this;
- ``graph_ms`` (CUDA): the same step captured once in a CUDA graph and replayed (:func:`graph_replay_ms`): the
  step without the launches and the Python between them. The timed step repeats one feed, so its device work is
  the same every time and a replay is that step; it is a measurement, not how the runtime serves (the runtime's
  steps change shape and host values). A step that cannot be captured (a host synchronisation or a pageable copy
  inside it) gives ``graph_error`` with CUDA's reason instead.

A concurrency that runs out of GPU memory (a GPU smaller than the H200) ends the sweep there: the levels measured
are kept in ``points``, that one and the higher ones are in ``skipped`` with the reason (an out-of-memory error at
the first level is raised: nothing was measured). Both engines are sized for the highest level before any is
measured; engines that do not fit are freed and built again without the highest level, which goes to ``skipped``
(:func:`engines_that_fit`).

The speculative speedup at a mean acceptance length tau is ``tau * t_target_only / t_speculative`` (one
speculative step accepts, and on long outputs emits, tau tokens per request on average; one target-only step one), from the wall times and
from the busy times. This is the stand-in executed eagerly by torch, not a TensorRT engine: its launch overhead and
its attention are not TensorRT-LLM's, which the report says in ``notes``.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from pathlib import Path

import torch

from ..engine.pretrained import engine_pretrained_config
from ..engine.plan import prepare
from ..engine.standin.engine import StandinEngine, limits_from
from ..errors import ConfigError
from ..runtime import Request, Runtime
from ..targets import fixtures_dir, resolve_dirs
from .autoregressive import TargetOnlyEngine
from .common import STEPS_FORMAT, paired_target, parse_concurrency

COMPONENTS = ("target_linear", "attention", "gdn", "lm_head", "drafter", "selector", "accept", "rest")
ARTICLE_ACCEPTANCE = {"qwen3.8-27b": 4.80, "muse-glimmer-30b": 5.70}
"""Mean acceptance lengths the article reports for the published pairs (H200, seven draft tokens)."""
NOTES = [
    "random weights: the widths, dtypes and work per step are the target's, the tokens are meaningless",
    "the network is executed eagerly by the torch stand-in of TensorRT-LLM's API (one kernel launch per op, no "
    "fusion), not by a TensorRT engine",
    "attention is the stand-in's (dense torch ops over the paged pool), not TensorRT-LLM's attention kernels: its "
    "share is reported apart",
    "spans_ms come from instrumented steps of their own, after the timed ones: they and their rest add up to those "
    "steps' time (spans_step_ms), not to wall_ms",
]
PLUGIN_NOTE = {"cuda": "the plugins (dynamic conv, pairwise scan, Gated DeltaNet) run their CUDA kernels (the sources of "
                       "libdflash2_plugins.so)",
               "cpu": "the plugins run their CPU builds (the CPU backend: times are a CPU's, not a GPU's)"}


def config_dirs(target_key: str) -> tuple[Path, Path]:
    """(drafter dir, target dir) of ``target_key``: the published configs shipped in the package for a published
    pair, the shipped trained pair for a tiny target (configs are all that is read)."""
    entry = paired_target(target_key)
    if entry.target_id is not None and entry.drafter_id is not None:
        fx = fixtures_dir()
        d, t = fx / entry.drafter_id.replace("/", "__"), fx / entry.target_id.replace("/", "__")
        if (d / "config.json").is_file() and (t / "config.json").is_file():
            return d, t
    return resolve_dirs(entry)


DEFAULT_CONTEXT = 1024
NEW_TOKENS = 32
TOKENS_PER_BLOCK = 32


def config_probe(target_key: str):
    """``target_key``'s pair prepared from its configs alone (tp 1): what the options are checked against before any
    weight is drawn (:func:`step_shape`, :func:`refuse_host_memory`)."""
    d, t = config_dirs(target_key)
    return prepare(d, t, target_key=target_key, overrides={"tp_size": 1})


def step_shape(probe) -> tuple[int, int]:
    """(K, the longest context :func:`step_engines` can size for the pair ``probe`` (:func:`config_probe`)): its
    ``max_seq_len`` (context + the new tokens + K + 1, rounded up to whole KV blocks) must stay within the target's
    max_position_embeddings."""
    seq = probe.t.max_position_embeddings // TOKENS_PER_BLOCK * TOKENS_PER_BLOCK
    return probe.K, seq - NEW_TOKENS - probe.K - 1


def available_memory_bytes() -> int | None:
    """The host memory the kernel says a new allocation can take without swapping (Linux ``MemAvailable``); None
    where it cannot be read."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def refuse_host_memory(probe, target_key: str, dtype: str) -> None:
    """``--backend cpu`` draws every weight at the target's real widths in host memory: a published 27B pair needs
    tens of GiB, and the kernel's OOM killer would end the process (and maybe others on a shared machine) with no
    word. Refused in one line when the weights alone exceed the memory available."""
    from ..engine.plan import weight_bytes_per_rank

    per_rank = weight_bytes_per_rank(probe.t, probe.d, 1, dtype)
    avail = available_memory_bytes()
    if not per_rank or avail is None:
        return
    need = per_rank[0]["total"]
    if need > avail:
        raise ConfigError(f"{target_key}'s weights at its real widths take {need / 2**30:.1f} GiB ({dtype}), more than "
                          f"the {avail / 2**30:.1f} GiB of memory available here: --backend cpu is for the tiny "
                          f"targets", field="--backend")


def step_engines(target_key: str, *, backend: str, max_batch: int, context_len: int, new_tokens: int = NEW_TOKENS,
                 dtype: str = "bfloat16", seed: int = 0,
                 tokens_per_block: int = TOKENS_PER_BLOCK) -> tuple[StandinEngine, dict]:
    """The combined engine of ``target_key`` with random weights on ``backend``, sized for ``max_batch`` requests
    at ``context_len`` (tp 1), and its limits."""
    d, t = config_dirs(target_key)
    probe = prepare(d, t, target_key=target_key, overrides={"tp_size": 1})
    K = probe.K
    seq = context_len + new_tokens + K + 1
    seq = -(-seq // tokens_per_block) * tokens_per_block
    over = {"tp_size": 1, "dtype": dtype, "max_batch_size": max_batch, "max_input_len": context_len,
            "max_seq_len": seq, "max_num_tokens": max(context_len, max_batch * (K + 1)),
            "tokens_per_block": tokens_per_block}
    prep = prepare(d, t, target_key=target_key, overrides=over)
    pre = engine_pretrained_config(prep.checkpoint_config, prep.cfg, prep.d)
    s = prep.cfg.to_dict()
    build = {k: s[k] for k in ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens",
                               "tokens_per_block", "num_kv_blocks")}
    limits = limits_from(build, pre)
    return StandinEngine(pre, None, limits, backend=backend, weights="random", seed=seed), limits


# ---- component scopes ---------------------------------------------------------------------------------------------
class _Scopes:
    """Labels the network's components while a step runs: each labelled call is timed between CUDA events (or the
    host clock on the CPU) and, under the profiler, recorded as a ``record_function`` range. The outermost label
    wins: the drafter's own linear layers and attention count as ``drafter``."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.active = None
        self.spans: dict[str, list] = defaultdict(list)

    def wrap(self, label, fn):
        def f(*args, **kwargs):
            if self.active is not None:
                return fn(*args, **kwargs)
            self.active = label
            try:
                with torch.profiler.record_function(f"dflash2::{label}"):
                    if self.cuda:
                        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        a.record()
                        out = fn(*args, **kwargs)
                        b.record()
                        self.spans[label].append((a, b))
                    else:
                        t0 = time.perf_counter()
                        out = fn(*args, **kwargs)
                        self.spans[label].append(time.perf_counter() - t0)
                return out
            finally:
                self.active = None
        f.__wrapped__ = fn
        return f

    def totals_ms(self) -> dict:
        if self.cuda:
            torch.cuda.synchronize()
            return {k: sum(a.elapsed_time(b) for a, b in v) for k, v in self.spans.items()}
        return {k: sum(v) * 1e3 for k, v in self.spans.items()}


@contextlib.contextmanager
def component_scopes(engine: StandinEngine):
    """Patch the engine's network package and stand-in so that every component call goes through a
    :class:`_Scopes`; everything is restored on exit."""
    net, api = engine.net, engine.net.api
    scopes = _Scopes(engine.device.type == "cuda")
    patches = []

    def patch(obj, name, label):
        orig = getattr(obj, name)
        patches.append((obj, name, orig, name in vars(obj)))
        setattr(obj, name, scopes.wrap(label, orig))

    patch(net.DFlash2Drafter, "draft_hidden", "drafter")
    patch(net.DFlash2Drafter, "commit", "drafter")
    patch(net.DFlash2Selector, "propose", "selector")
    for fn in ("accept", "accepted_tokens", "acceptance_uniforms"):
        if hasattr(net.combined, fn):
            patch(net.combined, fn, "accept")
    patch(type(api.plugins), "gated_delta_net", "gdn")
    patch(type(api.plugins), "gated_delta_net_commit", "gdn")
    patch(api.functional, "gpt_attention", "attention")
    patch(api.layers.ColumnLinear, "forward", "target_linear")
    patch(api.layers.RowLinear, "forward", "target_linear")
    for m in engine.models:
        if hasattr(m, "lm_head"):
            patch(m.lm_head, "forward", "lm_head")
    try:
        yield scopes
    finally:
        for obj, name, orig, own in reversed(patches):
            if own:
                setattr(obj, name, orig)
            else:
                delattr(obj, name)


def _sync(engine) -> None:
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)


PLUGIN_KERNELS = (("gdn", ("gdn", "deltanet")), ("drafter", ("dynamicconv", "conv")), ("selector", ("pairwise", "scan",
                                                                                                "walk", "lattice")))
"""The plugins' kernels by name (all in namespace dflash2): the component each belongs to. They are launched from
the plugins' CUDA library through ctypes, outside any torch op, so the profiler cannot place them by their caller."""


def plugin_component(kernel_name: str) -> str | None:
    n = kernel_name.lower()
    if "dflash2" not in n:
        return None
    return next((label for label, keys in PLUGIN_KERNELS if any(k in n for k in keys)), "rest")


def _label_of(event) -> str | None:
    while event is not None:
        if event.name.startswith("dflash2::"):
            return event.name.removeprefix("dflash2::")
        event = event.cpu_parent
    return None


def device_events(events) -> list:
    """The GPU activities of a profile (kernels, copies, sets), not the component labels' own ranges."""
    cuda = torch.autograd.DeviceType.CUDA
    return [e for e in events if e.device_type == cuda and not e.name.startswith("dflash2::")
            and not getattr(e, "is_user_annotation", False)]


def _kernel_split_ms(prof, steps: int) -> tuple[float, dict]:
    """(kernel time per step, per component) from a profile of ``steps`` steps taken under component_scopes: every
    kernel the GPU ran counts once; one launched by a torch op goes to the component whose scope encloses that op,
    a plugin kernel (launched from the plugins' library) to its plugin's component (:data:`PLUGIN_KERNELS`)."""
    cuda = torch.autograd.DeviceType.CUDA
    events = prof.events()
    device = device_events(events)
    total = sum(e.time_range.elapsed_us() for e in device)
    per: dict = defaultdict(float)
    linked_plugin: dict = defaultdict(float)
    for e in events:
        if e.device_type == cuda or not getattr(e, "kernels", None):
            continue
        label = _label_of(e) or "rest"
        for k in e.kernels:
            per[label] += k.duration
            pl = plugin_component(k.name)
            if pl:
                linked_plugin[pl] += k.duration
    plugin_all: dict = defaultdict(float)
    for e in device:
        pl = plugin_component(e.name)
        if pl:
            plugin_all[pl] += e.time_range.elapsed_us()
    for pl, v in plugin_all.items():   # the plugin kernels no torch op launched
        per[pl] += max(v - linked_plugin.get(pl, 0.0), 0.0)
    out = {k: per.get(k, 0.0) / steps / 1e3 for k in COMPONENTS if k != "rest"}
    out["rest"] = max(total / steps / 1e3 - sum(out.values()), 0.0)
    return total / steps / 1e3, out


def ops_per_step(engine: StandinEngine, feed: dict) -> int:
    """The torch operators one ``engine.step(feed)`` dispatches (counted below autograd, views included)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.n += 1
            return func(*args, **(kwargs or {}))

    with _Count() as count:
        engine.step(feed)
    _sync(engine)
    return count.n


def graph_replay_ms(engine: StandinEngine, feed: dict, steps: int) -> float:   # pragma: no cover - CUDA only
    """ms per replay of one step of ``feed`` captured in a CUDA graph (torch's recipe: warm on a side stream, capture,
    replay). ``run_step``: the outputs stay where the network computed them."""
    dev = engine.device
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        for _ in range(2):
            engine.run_step(feed)
    torch.cuda.current_stream(dev).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(torch.cuda.current_stream(dev)):      # restored even when the capture fails
        with torch.cuda.graph(graph, stream=torch.cuda.Stream(dev)):
            engine.run_step(feed)
    graph.replay()
    torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    for _ in range(steps):
        graph.replay()
    torch.cuda.synchronize(dev)
    ms = (time.perf_counter() - t0) / steps * 1e3
    del graph
    return ms


@contextlib.contextmanager
def generation_feed(engine: StandinEngine, concurrency: int, context_len: int, token: int = 1):
    """The feed of one generation step of ``concurrency`` requests at ``context_len`` committed tokens (placed with
    ``Runtime.adopt``, released on exit): the step :func:`measure` and :func:`graph_point` time."""
    rt = Runtime(engine, max_batch_size=concurrency)
    reqs = [rt.adopt(Request([token] * context_len, 32, seed=i, task_id=i), token) for i in range(concurrency)]
    try:
        yield rt.step_inputs([], rt.generating)
    finally:
        for r in reqs:
            rt.cancel(r)


def graph_point(engine: StandinEngine, concurrency: int, context_len: int, *, steps: int = 10,
                token: int = 1) -> dict:   # pragma: no cover - CUDA only
    """``{"graph_ms": ...}`` for the step :func:`measure` times, or ``{"graph_error": CUDA's reason}``."""
    with generation_feed(engine, concurrency, context_len, token) as feed:
        try:
            engine.step(feed)
            return {"graph_ms": graph_replay_ms(engine, feed, steps)}
        except Exception as e:  # noqa: BLE001 - why the step cannot be captured is the result
            # torch's graph context ends the capture on the way out, and that error replaces the first: the chain
            chain, x = [], e
            while x is not None and len(chain) < 4:
                chain.append(f"{type(x).__name__}: {x}"[:400])
                x = x.__context__
            return {"graph_error": " <- ".join(reversed(chain))[:1200]}


def measure(engine: StandinEngine, concurrency: int, context_len: int, *, steps: int = 10, warmup: int = 3,
            profile_steps: int = 2, token: int = 1) -> dict:
    """One point: ``concurrency`` requests generating at ``context_len``; see the module docstring."""
    with generation_feed(engine, concurrency, context_len, token) as feed:
        for _ in range(warmup):
            engine.step(feed)
        _sync(engine)
        t0 = time.perf_counter()
        for _ in range(steps):
            engine.step(feed)
        _sync(engine)
        wall = (time.perf_counter() - t0) / steps * 1e3
        point = {"wall_ms": wall, "tokens_per_step": concurrency * (engine.K + 1),
                 "ops_per_step": ops_per_step(engine, feed)}
        with component_scopes(engine) as scopes:
            if engine.device.type == "cuda" and profile_steps:
                from torch.profiler import ProfilerActivity, profile

                try:   # the profiler as a whole: kineto may raise as it starts or stops; the wall times and spans remain
                    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                        for _ in range(profile_steps):
                            engine.step(feed)
                        _sync(engine)
                    kernels = len(device_events(prof.events())) / profile_steps
                    if kernels == 0:
                        # CUPTI could not start (seen on a borrowed H100: CUPTI_ERROR_NOT_INITIALIZED): no kernel
                        # times, so no busy time, split or kernel count (not "0 kernels"); wall times and spans remain
                        point["profiler_error"] = "the profiler recorded no GPU kernels (CUPTI unavailable?)"
                    else:
                        point["kernels_per_step"] = kernels
                        busy, comp = _kernel_split_ms(prof, profile_steps)
                        point["gpu_busy_ms"], point["components_ms"] = busy, comp
                except torch.OutOfMemoryError:
                    raise                   # the level's out-of-memory handling (measure_steps) decides
                except Exception as e:  # noqa: BLE001 - any profiler failure: said, the point kept
                    point["profiler_error"] = f"{type(e).__name__}: {e}"[:300]
                scopes.spans.clear()
            # the spans come from steps of their own (instrumented, after the timed ones): their rest is what those
            # steps took beyond the spans, not wall_ms less the spans (on a busy machine the two differ by far)
            n = max(profile_steps, 1)
            _sync(engine)
            t1 = time.perf_counter()
            for _ in range(n):
                engine.step(feed)
            _sync(engine)
            span_step = (time.perf_counter() - t1) / n * 1e3
            spans = {k: v / n for k, v in scopes.totals_ms().items()}
        spans["rest"] = max(span_step - sum(spans.values()), 0.0)
        point["spans_ms"] = {k: spans.get(k, 0.0) for k in COMPONENTS}
        point["spans_step_ms"] = span_step
        return point


def can_graph(engine: StandinEngine) -> bool:
    """The step can be captured in a CUDA graph (a CUDA engine)."""
    return engine.device.type == "cuda"


def measure_steps(target_key: str, *, backend: str = "cuda", concurrency="1,4,16,32,64",
                  context_len: int | None = None, steps: int = 10, warmup: int = 3, profile_steps: int = 2,
                  acceptance: float | None = None, dtype: str = "bfloat16", progress=None, graph: bool = True,
                  partial=None, checkpoint=None) -> dict:
    """The ``bench steps`` report (see the module docstring). ``context_len``: default 1024, or the longest the target
    takes (:func:`step_shape`) if less. ``acceptance``: in [1, K + 1], as ``bench project --acceptance``.
    ``graph``: also time each step as a CUDA-graph replay (CUDA only; the first level's right after its eager
    measurement, the others after every eager level; after a level whose captures both fail, not tried again).
    ``partial``: called with the report so far (``"partial": True``) after each concurrency is measured and after
    each one's graph replays, so that a run stopped at a time limit keeps its points (it may raise to end the sweep
    there). ``checkpoint``: called with the report so far where it must be kept but the sweep goes on: the first
    level's eager points, before its CUDA-graph captures (a process killed during those keeps them)."""
    levels = sorted(parse_concurrency(concurrency))   # ascending: a level out of memory ends the sweep there
    probe = config_probe(target_key)
    K, max_context = step_shape(probe)
    if context_len is None:
        context_len = min(DEFAULT_CONTEXT, max_context)
    if isinstance(context_len, bool) or not isinstance(context_len, int) or not 1 <= context_len <= max_context:
        raise ConfigError(f"must be an integer in [1, {max_context}] (the target's max_position_embeddings less "
                          f"{NEW_TOKENS} new tokens and K + 1 = {K + 1}, in whole KV blocks), got {context_len!r}",
                          field="--context-len")
    if acceptance is not None and (isinstance(acceptance, bool) or not isinstance(acceptance, (int, float))
                                   or not 1.0 <= acceptance <= K + 1):   # NaN fails too: no NaN in the --json
        raise ConfigError(f"must be in [1, {K + 1}] (tokens per step with {K} drafts), got {acceptance!r}",
                          field="--acceptance")
    if backend == "cpu":
        refuse_host_memory(probe, target_key, dtype)
    say = progress or (lambda s: None)
    t0 = time.perf_counter()
    spec, ar, limits, levels, build_skipped, built_at = engines_that_fit(target_key, levels, backend=backend,
                                                                         context_len=context_len, dtype=dtype, say=say)
    try:
        build_s = built_at - t0
        tau = acceptance if acceptance is not None else ARTICLE_ACCEPTANCE.get(target_key)
        points, skipped = [], list(build_skipped)

        def report(points, skipped, is_partial=False) -> dict:
            dev = spec.device
            doc = {
                "format": STEPS_FORMAT, "schema_version": 1, "target": target_key, "backend": backend,
                "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
                "torch": torch.__version__, "dtype": spec.config["dtype"], "draft_len": spec.K,
                "context_len": context_len, "limits": limits, "weights": "random (outputs meaningless)",
                # how the target's sliding-window layers took the steps (engine/pretrained.py resolve_sliding_path)
                "sliding_path": (spec.config.get("dflash2_engine") or {}).get("sliding_path", "generation"),
                "acceptance": tau, "steps": steps, "warmup": warmup, "profile_steps": profile_steps,
                "build_s": build_s, "points": points, "skipped": skipped, "components": list(COMPONENTS),
                "notes": NOTES + [PLUGIN_NOTE[backend]],
                "wall_s": time.perf_counter() - t0,
            }
            if is_partial:
                doc["partial"] = True
            return doc

        graphing = graph and can_graph(spec)
        early_capture_failed = False

        def replay(pt) -> bool:
            """``pt``'s CUDA-graph replays, both engines even if one fails; False once both captures failed (the same
            capture would fail again: said once) or the probe itself raised (the eager table is kept)."""
            try:
                for key, eng in (("speculative", spec), ("target_only", ar)):
                    say(f"[steps] concurrency {pt['concurrency']}: {key}, CUDA-graph replay")
                    pt[key].update(graph_point(eng, pt["concurrency"], context_len, steps=steps))
            except BaseException as e:  # noqa: BLE001 - the eager table is kept whatever the probe does
                if isinstance(e, KeyboardInterrupt):
                    raise
                pt["graph_probe_error"] = f"{type(e).__name__}: {e}"[:600]
                return False
            if tau and "graph_ms" in pt["speculative"] and "graph_ms" in pt["target_only"]:
                pt["speedup_graph"] = tau * pt["target_only"]["graph_ms"] / pt["speculative"]["graph_ms"]
            return not all("graph_error" in pt[k] for k in ("speculative", "target_only"))

        for i, c in enumerate(levels):
            try:
                say(f"[steps] concurrency {c}: speculative")
                sp = measure(spec, c, context_len, steps=steps, warmup=warmup, profile_steps=profile_steps)
                say(f"[steps] concurrency {c}: target only")
                base = measure(ar, c, context_len, steps=steps, warmup=warmup, profile_steps=profile_steps)
            except torch.OutOfMemoryError as e:
                # a GPU with less memory (an H100's 80 GB against the H200's 141) runs out at the high levels: the
                # levels measured so far are kept, this one and the higher ones are named with the reason
                if not points:
                    raise
                why = f"out of GPU memory: {str(e).splitlines()[0]}"[:300] + (
                    " (after the first level's CUDA-graph capture failed)" if early_capture_failed else "")
                skipped = [{"concurrency": x, "error": why} for x in levels[i:]] + list(build_skipped)
                say(f"[steps] concurrency {c}: {why}; concurrency {', '.join(map(str, levels[i:]))} not measured")
                break
            pt = {"concurrency": c, "speculative": sp, "target_only": base}
            if tau:
                pt["speedup_wall"] = tau * base["wall_ms"] / sp["wall_ms"]
                if sp.get("gpu_busy_ms") and base.get("gpu_busy_ms"):
                    pt["speedup_busy"] = tau * base["gpu_busy_ms"] / sp["gpu_busy_ms"]
            points.append(pt)
            # the first level's replays at once, before ``partial`` (which may end the sweep at a time limit): every
            # run that measures a level has a graph figure (the first GPU runs' steps never reached theirs). The
            # price: a capture that fails here may leave torch's allocator holding memory (or routing to the graph's
            # pool) for the higher levels, which then may run out of memory: their skip says so
            if i == 0 and graphing:
                if checkpoint is not None:
                    checkpoint(report(points, skipped, True))
                graphing = replay(pt)
                early_capture_failed = not graphing
            if partial is not None:
                partial(report(points, skipped, True))
        if len(skipped) > len(build_skipped) and torch.cuda.is_available():
            torch.cuda.empty_cache()    # here, not in the except: its traceback held the failed level's tensors
        # the other levels' CUDA-graph replays after every eager point is measured (a capture that fails cannot cost
        # those eager points), and after the first failure no more
        for pt in points[1:] if graphing else ():
            if not replay(pt):
                break
            if partial is not None:
                partial(report(points, skipped, True))
        return report(points, skipped)
    finally:
        spec.close()
        if ar is not None:
            ar.close()


def engines_that_fit(target_key: str, levels: list[int], *, backend: str, context_len: int, dtype: str,
                     say=lambda s: None):
    """(combined engine, target-only engine on its weights, limits, the levels they serve, the levels dropped, when
    the combined engine was built): both sized for the highest level of ``levels``. Both engines hold a KV pool and
    state slots for that many requests beside the weights: a published 27B pair sized for 64 requests needs more
    than an H100's 80 GB. An engine that runs out of GPU memory is freed, the highest level is dropped (listed with
    the reason, as a level that runs out while measured is) and both are built again for the next; out of memory
    at the lowest level is raised."""
    import gc

    levels, dropped = list(levels), []
    while True:
        spec = ar = None
        try:
            say(f"[steps] {target_key}: combined engine with random weights on {backend}, sized for {max(levels)} "
                f"requests")
            spec, limits = step_engines(target_key, backend=backend, max_batch=max(levels), context_len=context_len,
                                        dtype=dtype)
            built_at = time.perf_counter()
            say("[steps] target-only engine on the same weights")
            ar = TargetOnlyEngine(spec.config, None, limits, backend=backend, weights=spec.parameters())
            return spec, ar, limits, levels, dropped, built_at
        except torch.OutOfMemoryError as e:
            if len(levels) == 1:
                for eng in (spec, ar):      # the combined engine built before the baseline ran out: freed first
                    if eng is not None:
                        eng.close()
                raise
            why = f"out of GPU memory: {str(e).splitlines()[0]}"[:300]
        for eng in (spec, ar):
            if eng is not None:
                eng.close()
        spec = ar = None
        gc.collect()                  # the weights of the engine built (tens of GB) before the next is drawn
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        top = max(levels)
        levels.remove(top)
        dropped.insert(0, {"concurrency": top, "error": f"{why} (sizing the engines for {top} requests)"})
        say(f"[steps] {target_key}: {why} sizing the engines for {top} requests; concurrency {top} not measured")


def _cell(value, width: int) -> str:
    """A table cell: ``value`` to 2 decimals, or ``n/a`` where it was not measured (GPU busy time on the CPU)."""
    return f"{'n/a' if value is None else format(value, '.2f'):>{width}}"


def render(doc: dict) -> str:
    lines = [f"BENCH STEPS {doc['target']} on {doc['device']} ({doc['backend']} backend, {doc['dtype']}, K "
             f"{doc['draft_len']}, context {doc['context_len']}, {doc['weights']})"]
    hdr = f"{'conc':>5} {'spec ms':>8} {'AR ms':>7} {'spec busy':>9} {'AR busy':>8}"
    if doc.get("acceptance"):
        hdr += f" {'speedup@' + format(doc['acceptance'], 'g'):>11} {'(busy)':>7}"
    busy = all(p["speculative"].get("components_ms") for p in doc["points"])
    lines.append(hdr + f"  spec components ({'busy' if busy else 'host spans'}, ms): " + " ".join(doc["components"]))
    for p in doc["points"]:
        sp, ar = p["speculative"], p["target_only"]
        row = (f"{p['concurrency']:>5} {sp['wall_ms']:>8.2f} {ar['wall_ms']:>7.2f} {_cell(sp.get('gpu_busy_ms'), 9)} "
               f"{_cell(ar.get('gpu_busy_ms'), 8)}")
        if doc.get("acceptance"):
            row += f" {_cell(p.get('speedup_wall'), 11)} {_cell(p.get('speedup_busy'), 7)}"
        comp = sp.get("components_ms") or sp["spans_ms"]
        lines.append(row + "  " + " ".join(f"{comp.get(k, 0.0):.2f}" for k in doc["components"]))
    if not busy and doc["points"]:   # the spans are not from the steps of the spec ms column: say which they add up to
        lines.append("host spans: timed in instrumented steps of their own, which took (ms) " + ", ".join(
            f"c{p['concurrency']} {_cell(p['speculative'].get('spans_step_ms'), 0).strip()}" for p in doc["points"])
            + "; the components and rest add up to those, not to spec ms")
    launches = [(p["concurrency"], p["speculative"].get("ops_per_step"), p["speculative"].get("kernels_per_step"),
                 p["target_only"].get("ops_per_step")) for p in doc["points"]]
    lines.append("ops per step (spec / target only; kernels, CUDA): " + ", ".join(
        f"c{c} {o} / {a}" + (f" ({k:g} kernels)" if k is not None else "") for c, o, k, a in launches))
    graphs = [(p["concurrency"], p["speculative"].get("graph_ms"), p["target_only"].get("graph_ms"))
              for p in doc["points"] if "graph_ms" in p["speculative"]]
    if graphs:
        lines.append("CUDA-graph replay ms (spec / target only): " + ", ".join(
            f"c{c} {g:.2f} / {'n/a' if a is None else format(a, '.2f')}" for c, g, a in graphs))
    prof = [p[k]["profiler_error"] for p in doc["points"] for k in ("speculative", "target_only")
            if "profiler_error" in p[k]]
    if prof:
        lines.append(f"no kernel times (busy, components): {prof[0]}")
    errors = [p[k]["graph_error"] for p in doc["points"] for k in ("speculative", "target_only")
              if "graph_error" in p[k]]
    if errors:
        lines.append(f"CUDA-graph capture failed: {errors[0]}")
    for sk in doc.get("skipped") or []:
        lines.append(f"concurrency {sk['concurrency']}: not measured ({sk['error']})")
    lines += ["notes:"] + [f"  - {n}" for n in doc["notes"]]
    return "\n".join(lines)
