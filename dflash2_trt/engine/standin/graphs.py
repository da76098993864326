"""Generation steps of a cuda engine replayed from CUDA graphs, one graph per bucket, as TensorRT-LLM's runtime
replays its generation step: ``run --cuda-graphs``. NOT YET RUN ON A GPU: off unless asked for.

A step whose requests are all generating (no context request, spec decoding on) and whose batch shape was seen
before is not executed op by op: its device inputs are copied into the buffers a graph was captured from, and the
graph is replayed. Everything else (context and mixed steps, a first step of a new shape, a step whose capture
failed) runs eagerly, as before. A bucket is

- the batch's device-input shapes and dtypes (the batch size, the token count, the block table's width),
- the host inputs other than the three that grow as requests do (``host_past_key_value_lengths``,
  ``host_kv_cache_block_offsets``, ``host_context_lengths``: a graph keeps the values its capture read, so every
  other host value must be the captured one),
- the attention's key range, rounded up to ``granule`` tokens and fixed for the graph
  (:func:`~dflash2_trt.trtllm.cpu.attention.key_range`: the growing ``host_past_key_value_lengths`` are read only
  for it).

Why that is sound, shown on the CPU (``capture.replay_with_host_inputs_of``, tests/engine/test_capture_safety.py):
a later generation step computed with an earlier step's host inputs gives exactly its own outputs once the key
range is fixed, and a warm step reads no device value on the host and copies nothing to the device. On the CPU
this module runs the same bookkeeping with the replay done eagerly from the frozen buffers (``simulate``: what a
replay computes), which is how the tests hold the token streams to the target's.

A bucket's first step runs eagerly (with the bucket's key range: the warm-up), its second is captured and
replayed, the later ones replayed. The step's outputs are the graph's own tensors, copied out after each replay
(the logits cloned on the device). A capture that fails leaves its bucket eager, with CUDA's reason in ``stats``.
"""

from __future__ import annotations

import math

import torch

from ...errors import ConfigError
from ...trtllm.cpu import attention
from .engine import StandinEngine, input_memory

GROWING_HOST_INPUTS = ("host_past_key_value_lengths", "host_kv_cache_block_offsets", "host_context_lengths")


class GraphedSteps:
    """``engine`` (a cuda :class:`StandinEngine`, one rank) with :meth:`step` replaying captured generation steps.
    Every other attribute is the engine's, so the project's :class:`~dflash2_trt.runtime.Runtime` drives it as it
    drives the engine. ``simulate``: on the CPU, replay eagerly from the frozen buffers (tests). ``stats``: steps
    replayed, captured, run eagerly, and the captures that failed (their reasons)."""

    def __init__(self, engine: StandinEngine, *, granule: int = 256, max_graphs: int = 16, simulate: bool = False):
        if engine.device.type != "cuda" and not simulate:
            raise ConfigError(f"CUDA graphs need a cuda engine on a GPU; this one runs on {engine.device}",
                              field="--cuda-graphs")
        if len(engine.local_ranks) != 1:
            raise ConfigError(f"CUDA graphs step one rank per process; this engine steps {len(engine.local_ranks)} "
                              f"ranks as threads", field="--cuda-graphs")
        self.engine, self.granule, self.max_graphs, self.simulate = engine, int(granule), int(max_graphs), simulate
        self.max_keys = int(engine.limits["max_seq_len"])
        self._graphs: dict = {}
        self.stats = {"replayed": 0, "captured": 0, "eager": 0, "failed": {}}

    def __getattr__(self, name):
        return getattr(self.engine, name)

    # ---- which bucket --------------------------------------------------------------------------------------
    def key_range(self, feed: dict) -> int:
        """The attention key range a graph for ``feed`` is captured with: the longest request's committed length plus
        the step's new tokens, rounded up to ``granule`` (at most the engine's max_seq_len)."""
        width = int(feed["spec_decoding_position_offsets"].shape[1])
        need = int(feed["host_past_key_value_lengths"].max()) + width
        return min(math.ceil(need / self.granule) * self.granule, max(self.max_keys, need))

    def bucket(self, feed: dict):
        """The bucket of ``feed``, or None when it runs eagerly (a context request in it, spec decoding off)."""
        if not bool((feed["host_request_types"] == 1).all()) or int(feed["spec_decoding_use"].reshape(-1)[0]) != 1:
            return None
        shapes = tuple(sorted((k, tuple(v.shape), str(v.dtype)) for k, v in feed.items()))
        fixed = tuple(sorted((k, v.numpy().tobytes()) for k, v in feed.items()
                             if input_memory(k) == "host" and k not in GROWING_HOST_INPUTS))
        return shapes, fixed, self.key_range(feed)

    # ---- the step the runtime calls -------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, feed: dict) -> dict:
        key = self.bucket(feed)
        if key is None or key in self.stats["failed"]:
            self.stats["eager"] += 1
            return self.engine.step(feed)
        entry = self._graphs.get(key)
        if entry is None:
            # the bucket's first step runs eagerly with its key range: the warm-up (the constants a step makes once).
            # A separate warm-up run would execute the step twice, and a Gated DeltaNet step is not idempotent (it
            # folds its slot's pending records into the state).
            if len(self._graphs) >= self.max_graphs:
                self._graphs.pop(next(iter(self._graphs)))
            self._graphs[key] = "warm"
            self.stats["eager"] += 1
            with attention.key_range(key[2]):
                return self.engine.step(feed)
        if entry == "warm":
            try:
                entry = self._graphs[key] = self._capture(feed, key[2])
            except Exception as e:  # noqa: BLE001 - a step that cannot be captured runs eagerly, its reason kept
                self._graphs.pop(key, None)
                self.stats["failed"][key] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
                self.stats["eager"] += 1
                return self.engine.step(feed)
            self.stats["captured"] += 1
        else:
            self.stats["replayed"] += 1
        return self._replay(entry, feed)

    def failures(self) -> list[str]:
        """Why captures failed, one line each (their buckets then run eagerly)."""
        return sorted(set(self.stats["failed"].values()))

    def _buffers(self, feed: dict) -> dict:
        """What the graph reads: the device inputs in buffers of their own on the engine's device (updated in place
        before each replay), the host inputs frozen at their captured values."""
        dev = self.engine.device
        return {k: v.to(dev, copy=True) if input_memory(k) == "device" else v.clone() for k, v in feed.items()}

    def _capture(self, feed: dict, keys: int) -> dict:
        buf = self._buffers(feed)
        if self.simulate:
            return {"buffers": buf, "keys": keys, "graph": None, "outputs": None}
        graph = torch.cuda.CUDAGraph()
        with attention.key_range(keys), torch.cuda.graph(graph):
            outputs = self.engine.run_step(buf)[0]
        # a capture records the step without running it: the replay that follows is its one execution
        return {"buffers": buf, "keys": keys, "graph": graph, "outputs": outputs}

    def _replay(self, entry: dict, feed: dict) -> dict:
        buf = entry["buffers"]
        for k, v in feed.items():
            if input_memory(k) == "device":
                buf[k].copy_(v, non_blocking=True)
        if self.simulate:   # what the replay computes: the frozen host values, the buffers' device values
            old = attention.DEVICE_BOUNDS_ON_CPU
            attention.DEVICE_BOUNDS_ON_CPU = True
            try:
                with attention.key_range(entry["keys"]):
                    outs = self.engine.run_step(buf)[0]
            finally:
                attention.DEVICE_BOUNDS_ON_CPU = old
        else:
            entry["graph"].replay()
            outs = entry["outputs"]
        return {k: v.clone() if k == "logits" else v.to("cpu", copy=True) for k, v in outs.items()}
