"""Which runtime drives a TensorRT engine of this project, and why (``build --dry-run``, engine.json, RUN.md, ``run``,
``bench run``).

Two runtimes can execute the rank engines trtllm-build writes:

- ``executor``: TensorRT-LLM's C++ executor (``ModelRunnerCpp``, the ``tensorrtllm`` Triton backend, trtllm-bench,
  gptManagerBenchmark). It runs an EAGLE one-engine model on stock 1.2 when nothing in the engine trips its checks.
- ``project``: this project's runtime (:class:`~dflash2_trt.runtime.Runtime`: paged KV blocks, in-flight batching,
  the EAGLE feed) binding the engine through TensorRT's Python API (:mod:`.session`). It needs no executor check to
  pass: the engine drafts, verifies, accepts and commits in-graph, and the runtime only moves sequence lengths.

A target takes ``project`` when the stock executor refuses it (each reason read in TensorRT-LLM's sources):

- a recurrent (hybrid) target: ``TrtGptModelInflightBatching`` refuses speculative decoding and context/generation
  fusion for a model it treats as recurrent (docs/hybrid-runtime.md R3/R4; the executor runs it only rebuilt with
  ``scripts/patch_trtllm_recurrent_spec.py``, which stays an option, never compiled here);
- per-layer attention windows that differ (Muse Glimmer's sliding layers, or a drafter keeping its own window): a
  "variable window" model, whose EAGLE KV rewind the executor refuses (docs/TRTLLM-ENGINE.md §3). TensorRT-LLM's
  attention plugin does not apply a window in speculative-decoding steps (:mod:`.windows`), so where the target's can
  bind its sliding layers take the context route (``sliding_path: context``: each step's new tokens as a context
  chunk, through a second set of request inputs that only the project runtime binds); a drafter's window that can
  bind is refused; where none can, every window is max_seq_len and the model is not variable-window.

Otherwise ``executor`` (the project runtime can drive those engines too: ``run --runtime project``).
"""

from __future__ import annotations

from ...trtllm.backend import load_network
from ..pretrained import on_context_route

PROJECT, EXECUTOR = "project", "executor"
RUNTIMES = ("auto", PROJECT, EXECUTOR)

DESCRIPTION = {
    PROJECT: "the project runtime over TensorRT (dflash2_trt.runtime.Runtime binding the rank engine through "
             "TensorRT's Python API: engine/trtllm/session.py)",
    EXECUTOR: "TensorRT-LLM's C++ executor (ModelRunnerCpp, the tensorrtllm Triton backend, trtllm-bench, "
              "gptManagerBenchmark)",
}


def runtime_path(pre: dict, *, drafter_window: str | None = None, max_seq_len: int | None = None) -> dict:
    """``{"path": "project" | "executor", "why": [...], "description", "limits": [...]}`` for the engine whose
    ``pretrained_config`` is ``pre`` (the drafter window and max_seq_len default to ``pre["dflash2_engine"]``'s)."""
    net = load_network("cpu")
    cfg = net.api.PretrainedConfig.from_dict(pre)
    eng = pre.get("dflash2_engine") or {}
    drafter_window = drafter_window or eng.get("drafter_window", "model")
    max_seq_len = int(max_seq_len or eng.get("max_seq_len") or pre.get("max_position_embeddings"))
    why = []
    kinds = net.hf_layer_types(cfg)
    if "linear_attention" in kinds:
        n = sum(1 for k in kinds if k == "linear_attention")
        why.append(f"recurrent target ({n} Gated DeltaNet layers): the stock executor refuses speculative decoding for "
                   f"a model it treats as recurrent (TrtGptModelInflightBatching, docs/hybrid-runtime.md R3/R4); it "
                   f"runs there only rebuilt with scripts/patch_trtllm_recurrent_spec.py [never compiled]")
    windows = net.kv_layer_windows(cfg, drafter_window, max_seq_len)
    routed = net.sliding_context(cfg)
    if routed:
        why.append("the context route (sliding_path context): the target's sliding-window layers read a second set of "
                   "request inputs that the stock executor does not bind (TllmRuntime: \"Input tensor '...' not "
                   "found\")" + (f", and the per-layer windows {sorted(set(windows))} make a variable-window model"
                                  if len(set(windows)) > 1 else "") + " (facts/attention_window.yaml context_route)")
    elif len(set(windows)) > 1:
        why.append(f"variable window: the per-layer attention windows {sorted(set(windows))} make a variable-window "
                   f"model, whose EAGLE KV rewind the stock executor refuses (\"Rewinding KV cache blocks for "
                   f"variable SWA models isn't supported\", docs/TRTLLM-ENGINE.md §3)")
    path = PROJECT if why else EXECUTOR
    if path == EXECUTOR:
        why.append("nothing in the engine trips the stock executor's checks (not recurrent, one attention window); "
                   "the project runtime can drive it too (run --runtime project)")
    limits = []
    tp = int(pre["mapping"]["tp_size"])
    if path == PROJECT and tp > 1:
        limits.append(f"tp {tp}: one process per rank, `mpirun -n {tp} dflash2-trt run ...` (each rank its "
                      f"rank engine on its GPU, TensorRT-LLM's all-reduce workspace; rank 0 reports: "
                      f"docs/trt-session.md §4); verified only with the CPU stand-in of TensorRT under real MPI, never yet run on GPUs")
    n_target = net.num_kv_layers_of(cfg)
    target_windows = set(windows[:n_target])
    if routed and any(w < max_seq_len for w in target_windows):
        limits.append(f"the target's sliding layers apply their window ({min(target_windows)}) through TensorRT-LLM's "
                      f"paged context FMHA, each step's new tokens a context chunk (facts/attention_window.yaml "
                      f"context_route [read, not run]): exact where the SM 90 sliding-window paged-KV kernel exists "
                      f"and the plugin does not fall back to unfused MHA (TensorRT-LLM logs \"Fall back to unfused MHA "
                      f"for ...\"), which only a GPU run shows")
    unrouted = windows[n_target:] if routed else windows
    if any(w < max_seq_len for w in unrouted):
        whose = "the drafter's window" if routed else "a window"
        limits.append(f"{whose} below max_seq_len ({min(unrouted)}) is not applied by TensorRT-LLM's attention plugin "
                      f"in speculative-decoding steps (facts/attention_window.yaml [read, not run]): past it this engine "
                      f"is not the model; a build at a max_seq_len where the window cannot bind is exact (build "
                      f"--dry-run says which)")
    return {"path": path, "description": DESCRIPTION[path], "why": why, "limits": limits, "context_route": routed}


def choose_runtime(requested: str | None, pre: dict, manifest: dict | None = None) -> dict:
    """The runtime ``run`` / ``bench run`` / the verify gate use: the one asked for, else the engine's own
    (engine.json ``runtime_path``, else computed from its config)."""
    requested = requested or "auto"
    if requested not in RUNTIMES:
        from ...errors import ConfigError

        raise ConfigError(f"must be one of {', '.join(RUNTIMES)}, got {requested!r}", field="--runtime")
    # an engine on the context route: only the project runtime binds its sliding layers' inputs
    routed = on_context_route(pre)
    info = (manifest or {}).get("runtime_path")
    if not info:
        try:
            info = runtime_path(pre)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:   # not a DFlash2 engine config
            info = {"path": EXECUTOR, "description": DESCRIPTION[EXECUTOR], "limits": [],
                    "why": [f"the engine config does not say what the decision needs ({type(exc).__name__}: {exc}); "
                            f"the executor's tools read it themselves"]}
            if routed:
                info = dict(info, path=PROJECT, description=DESCRIPTION[PROJECT],
                            why=[f"the context route (sliding_path context); the rest of the engine config does not "
                                 f"say what the decision needs ({type(exc).__name__}: {exc})"])
    if requested == EXECUTOR and routed:
        from ...errors import ConfigError

        raise ConfigError("this engine's sliding-window layers take the context route (sliding_path context): they "
                          "read sliding_* inputs that TensorRT-LLM's executor does not bind (it would stop with \"Input "
                          "tensor 'sliding_host_request_types' not found\"); run it with --runtime project (or auto)",
                          field="--runtime")
    if requested != "auto":
        info = dict(info, path=requested, description=DESCRIPTION[requested],
                    why=[f"asked for (--runtime {requested})"] + list(info.get("why") or []))
    return info
