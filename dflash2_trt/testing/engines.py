"""Shared helpers of the engine tests: build CPU engines of a pair once per settings, run prompts through the CPU
runtime, load a pair's shipped prompts, and dress a CPU engine as a TensorRT-LLM engine directory whose rank engine is
the CPU stand-in of TensorRT (:func:`standin_trt_engine_dir`)."""

from __future__ import annotations

import json


def shipped_prompts(pair, n: int = 12) -> list[list[int]]:
    ps = json.loads((pair.drafter_dir.parent / "prompts.json").read_text())["prompts"]
    return [list(p) for p in ps[:n]]


class EngineCache:
    """``get(block, tp=1, **overrides)`` -> the directory of a CPU engine of ``pair`` built once per settings."""

    def __init__(self, pair, target_key: str, tmp_path_factory, **build_kw):
        self.pair, self.target_key, self.tmp = pair, target_key, tmp_path_factory
        self.build_kw = build_kw
        self._cache: dict = {}

    def __call__(self, block, tp=1, **over):
        from ..engine.build import build_engine

        key = (block, tp, tuple(sorted(over.items())))
        if key not in self._cache:
            out = self.tmp.mktemp(self.target_key) / f"b{block}-tp{tp}"
            build_engine(self.pair.drafter_dir, self.pair.target_dir, out, tp_size=tp, target_key=self.target_key,
                         overrides={"block_size": block, "tokens_per_block": 16, **over}, **self.build_kw)
            self._cache[key] = out
        return self._cache[key]


class ReferenceRuns:
    """``get(block)`` -> the reference speculative loop's run of every prompt at that block size, computed once per
    block size: an engine's rank count does not change what the reference does, so the tp variants share it."""

    def __init__(self, pair, prompts, new: int, stop_token_ids=(2,)):
        self.pair, self.prompts, self.new, self.stop = pair, prompts, new, tuple(stop_token_ids)
        self._cache: dict = {}

    def __call__(self, block):
        from ..reference.loop import load_pair, speculative_generate

        if block not in self._cache:
            target, drafter = load_pair(self.pair.target_dir, self.pair.drafter_dir, block_size=block)
            self._cache[block] = [speculative_generate(target, drafter, p, max_new_tokens=self.new,
                                                       stop_token_ids=self.stop) for p in self.prompts]
        return self._cache[block]


def run_prompts(engine_dir, prompts, *, new: int, max_batch: int = 4, temperature: float = 0.0, seeds=None,
                patch=None):
    """Every prompt through a fresh CPU engine + runtime; returns (requests, runtime). ``patch(runtime, engine)``
    may alter them before the run (negative controls)."""
    from ..engine.standin.engine import open_standin_engine
    from ..runtime import Request, Runtime

    eng, man = open_standin_engine(engine_dir)
    try:
        rt = Runtime(eng, max_batch_size=max_batch)
        if patch is not None:
            patch(rt, eng)
        reqs = [Request(list(p), new, temperature=temperature, seed=(seeds[i] if seeds else i),
                        stop_token_ids=tuple(man["eos_token_ids"]), task_id=i) for i, p in enumerate(prompts)]
        rt.generate(reqs)
        return reqs, rt
    finally:
        eng.close()


def run_with_step_spy(engine, requests, on_step):
    """Run ``requests`` through the CPU runtime on an open CPU ``engine`` with ``on_step(inputs)`` called on every
    step's flat feed before the engine sees it; ``on_step`` may return a replacement feed (or None to keep it).
    Returns the finished requests; the engine's own ``step`` is restored afterwards."""
    from ..runtime import Runtime

    orig = engine.step

    def spy(inputs):
        new = on_step(inputs)
        return orig(inputs if new is None else new)

    engine.step = spy
    try:
        return Runtime(engine).generate(requests)
    finally:
        engine.step = orig


def baseline_engine_config(cfg: dict) -> dict:
    """The config.json trtllm-build writes for ``build --baseline`` (as far as the runtime reads it:
    ``trtllm_engine_config(target_only=True)``), from a cpu engine's config.json ``cfg``: its pretrained config marked
    target-only (``baseline_pretrained_config``), its limits."""
    from types import SimpleNamespace

    from ..engine.pretrained import baseline_pretrained_config
    from ..engine.trtllm.command import trtllm_engine_config

    pre = baseline_pretrained_config(cfg["pretrained_config"])
    lim = cfg["build_config"]
    settings = SimpleNamespace(block_size=int(pre["dflash2"]["block_size"]), dtype=pre["dtype"],
                               **{k: int(lim[k]) for k in ("max_batch_size", "max_input_len", "max_seq_len",
                                                            "max_num_tokens", "tokens_per_block")})
    return trtllm_engine_config(pre, settings, target_only=True)


def standin_session(engine_dir, *, device="cpu", **kw):
    """The project runtime's TensorRT session (engine/trtllm/session.py) over a rank engine that is the CPU stand-in of
    TensorRT running the CPU engine at ``engine_dir``; ``kw`` go to :class:`TrtEngineSession`."""
    from pathlib import Path

    from ..engine.trtllm.session import TrtEngineSession
    from . import tensorrt_standin

    cfg = json.loads((Path(engine_dir) / "config.json").read_text())
    blob = tensorrt_standin.standin_engine(cfg, executor={"kind": "cpu-engine", "engine_dir": str(engine_dir)})
    return TrtEngineSession(blob, cfg, trt=tensorrt_standin, device=device, **kw)


def standin_trt_engine_dir(cpu_dir, out, *, baseline: bool = False):
    """A TensorRT-LLM engine directory at ``out`` as `build --backend trtllm` leaves it (engine.json backend trtllm with
    its runtime_path, config.json, rank{r}.engine for every rank, the plugin library, RUN.md), rank r's engine being
    the CPU stand-in of TensorRT (:mod:`.tensorrt_standin`) running rank r of the CPU engine at ``cpu_dir`` (so its
    tokens are that engine's; a tp engine's ranks step together only as ``mpirun`` processes, engine/trtllm/ranks.py).
    The plugin library is a placeholder: only the stand-in, which loads none, can run this directory. ``baseline``:
    also ``baseline/`` as `build --baseline` writes it (config.json as trtllm-build writes it for the target-only
    network, rank engines running the CPU engine's target alone: bench/autoregressive.py)."""
    import shutil
    from pathlib import Path

    from ..engine.format import file_sha256
    from ..engine.trtllm.build import engine_files, hash_tree, run_md
    from ..engine.trtllm.paths import runtime_path
    from . import tensorrt_standin

    d = Path(out)
    shutil.copytree(cpu_dir, d)
    cfg = json.loads((d / "config.json").read_text())
    for r in range(int(cfg["pretrained_config"]["mapping"]["tp_size"])):
        (d / f"rank{r}.engine").write_bytes(tensorrt_standin.standin_engine(
            cfg, executor={"kind": "cpu-engine", "engine_dir": str(Path(cpu_dir).resolve()), "rank": r}))
    (d / "libdflash2_plugins.so").write_bytes(b"\x7fELF")
    man = json.loads((d / "engine.json").read_text())
    if baseline:
        from ..engine.pretrained import BASELINE_DIR

        base = baseline_engine_config(cfg)
        pre = base["pretrained_config"]
        b = d / BASELINE_DIR
        b.mkdir()
        (b / "config.json").write_text(json.dumps(base, indent=4))
        for r in range(int(pre["mapping"]["tp_size"])):
            (b / f"rank{r}.engine").write_bytes(tensorrt_standin.standin_engine(
                base, executor={"kind": "cpu-engine", "engine_dir": str(Path(cpu_dir).resolve()), "rank": r}))
        man["baseline"] = {"dir": BASELINE_DIR, "network": "TargetOnlyForCausalLM",
                           "files": hash_tree(d, file_sha256, BASELINE_DIR)}
    else:
        man["baseline"] = None
    man.update(backend="trtllm", runtime_path=runtime_path(cfg["pretrained_config"]), plugin_library={
        "file": "libdflash2_plugins.so"}, versions={"dflash2_trt": "test"}, limits=dict(man["limits"]))
    (d / "RUN.md").write_text(run_md(man, d))
    man["files"] = engine_files(d, file_sha256)          # baseline/ apart, as the build records it
    (d / "engine.json").write_text(json.dumps(man))
    return d
