"""Generation steps of a cuda engine replayed from CUDA graphs, one graph per bucket, as TensorRT-LLM's runtime
replays its generation step: ``run --cuda-graphs``. NOT YET RUN ON A GPU: off unless asked for.

A step whose requests are all generating (no context request, spec decoding on) and whose batch shape was seen
before is not executed op by op: its device inputs are copied into the buffers a graph was captured from, and the
graph is replayed. Everything else (context and mixed steps, a first step of a new shape, a step whose capture
failed) runs eagerly, as before. A bucket is

- the batch's device-input shapes and dtypes (the batch size, the token count, the block table's width),
- the host inputs other than the growing or unread ones (``host_past_key_value_lengths``,
  ``host_kv_cache_block_offsets``, ``host_context_lengths``, and on the context route
  ``sliding_host_past_key_value_lengths``: :data:`UNBUCKETED_HOST_INPUTS`; a graph keeps the values its capture
  read, so every other host value must be the captured one),
- the attention's key range, fixed for the graph (:func:`~dflash2_trt.trtllm.cpu.attention.key_range`: the growing
  ``host_past_key_value_lengths`` are read only for it): the longest committed length rounded up to 256 tokens plus
  the step's new tokens, the executor's graph key and capture-time lengths (:meth:`GraphedSteps.key_range`).

TensorRT-LLM's C++ executor does the same with a TensorRT engine (``api_1_2.yaml`` executor_cuda_graphs, recorded
from trtGptModelInflightBatching.cpp and runtimeBuffers.cpp): graphs only for steps without context requests, keyed
by the batch's composition, token count and rounded longest length, each captured after an eager step of its key.

Why that is sound, shown on the CPU (``capture.replay_with_host_inputs_of``, tests/engine/test_capture_safety.py):
a later generation step computed with an earlier step's host inputs gives exactly its own outputs once the key
range is fixed, and a warm step reads no device value on the host and copies nothing to the device. On the CPU
this module runs the same bookkeeping with the replay done eagerly from the frozen buffers (``simulate``: what a
replay computes), which is how the tests hold the token streams to the target's.

A bucket's first step runs eagerly (with the bucket's key range, on a side stream: the warm-up), its second is
captured and replayed, the later ones replayed. All graphs share one memory pool (replays never overlap, and a
step's outputs are copied out after its replay: the logits cloned on the device); the least recently used graph
goes first past ``max_graphs``. A graph keeps references to the stand-in's cached constants it reads. A capture
that fails turns graphs off for the rest of the run (CUDA may be left in a bad state), with CUDA's first error in
``stats``. What the CPU simulation cannot model: the memory pools, the streams, CUDA's own refusals.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict

import torch

from ...errors import ConfigError
from ...trtllm.cpu import attention
# the rules both runners share (this one and the TensorRT session's, engine/trtllm/session_graphs.py)
from ..graph_rules import KV_LENGTH_ROUND_SIZE, UNBUCKETED_HOST_INPUTS, graph_bucket, past_at_capture, refuse_tp
from .engine import StandinEngine, input_memory

__all__ = ["GraphedSteps", "KV_LENGTH_ROUND_SIZE", "UNBUCKETED_HOST_INPUTS", "graph_bucket", "past_at_capture"]


@contextlib.contextmanager
def _side_stream(dev):
    """Run the enclosed work on a side stream of GPU ``dev`` (waited for on both sides), as PyTorch's recipe warms a
    step before a capture; nothing when ``dev`` is None (the CPU simulation)."""
    if dev is None:
        yield
        return
    main, side = torch.cuda.current_stream(dev), torch.cuda.Stream(dev)
    side.wait_stream(main)
    try:
        with torch.cuda.stream(side):
            yield
    finally:
        main.wait_stream(side)


class GraphedSteps:
    """``engine`` (a cuda :class:`StandinEngine`, one rank) with :meth:`step` replaying captured generation steps.
    Every other attribute is the engine's, so the project's :class:`~dflash2_trt.runtime.Runtime` drives it as it
    drives the engine. ``simulate``: on the CPU, replay eagerly from the frozen buffers (tests). ``stats``: steps
    replayed, captured and run eagerly; :meth:`failures`: why a capture failed."""

    def __init__(self, engine: StandinEngine, *, granule: int = KV_LENGTH_ROUND_SIZE, max_graphs: int = 16,
                 simulate: bool = False):
        if engine.device.type != "cuda" and not simulate:
            raise ConfigError(f"CUDA graphs need a cuda engine on a GPU; this one runs on {engine.device}",
                              field="--cuda-graphs")
        refuse_tp(engine.tp)
        self.engine, self.granule, self.max_graphs, self.simulate = engine, int(granule), int(max_graphs), simulate
        self.max_keys = int(engine.limits["max_seq_len"])
        self._graphs: OrderedDict = OrderedDict()       # least recently used first
        self._pool = None                               # one memory pool for every graph (replays never overlap)
        self._stream = None                             # the capture stream, on the engine's device
        self.stats = {"replayed": 0, "captured": 0, "eager": 0}
        self.disabled: str | None = None                # why a capture failed: every later step eager

    def __getattr__(self, name):
        return getattr(self.engine, name)

    # ---- which bucket --------------------------------------------------------------------------------------
    def key_range(self, feed: dict) -> int:
        """The attention key range a graph for ``feed`` is captured with, as TensorRT-LLM's executor sizes its graphs
        (``api_1_2.yaml`` executor_cuda_graphs): the executor sets every request's host_past_key_value_lengths to the
        longest committed length rounded up to ``granule`` (256 there), at most max_seq_len - 1, before the capture,
        and the plugin adds the step's new tokens. Here that range is fixed through ``attention.key_range`` instead
        (the frozen host lengths stay the capture step's own). Capped at max_seq_len, the stand-in's block-table and
        rotary bound, which no request's keys pass."""
        width = int(feed["spec_decoding_position_offsets"].shape[1])
        past = int(feed["host_past_key_value_lengths"].max())
        at_capture = past_at_capture(past, self.max_keys, self.granule)
        return min(at_capture + width, max(self.max_keys, past + width))

    def bucket(self, feed: dict):
        """The bucket of ``feed`` (:func:`graph_bucket`, with the key range), or None when it runs eagerly."""
        return graph_bucket(feed, lambda k: input_memory(k) == "host", self.key_range(feed), UNBUCKETED_HOST_INPUTS)

    # ---- the step the runtime calls -------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, feed: dict) -> dict:
        key = None if self.disabled else self.bucket(feed)
        if key is None:
            self.stats["eager"] += 1
            return self.engine.step(feed)
        entry = self._graphs.get(key)
        if entry is None:
            # the bucket's first step runs eagerly with its key range: the warm-up (the constants a step makes once,
            # on a side stream as PyTorch's recipe warms before a capture). A separate warm-up run would execute the
            # step twice, and a Gated DeltaNet step is not idempotent (it folds its slot's pending records).
            while len(self._graphs) >= self.max_graphs:
                self._graphs.popitem(last=False)
            self._graphs[key] = "warm"
            self.stats["eager"] += 1
            with attention.key_range(key[2]), _side_stream(None if self.simulate else self.engine.device):
                return self.engine.step(feed)
        self._graphs.move_to_end(key)
        if entry == "warm":
            try:
                entry = self._graphs[key] = self._capture(feed, key[2])
            except Exception as e:  # noqa: BLE001 - a step that cannot be captured runs eagerly, its reason kept
                self._graphs.clear()
                cause = e.__context__ or e     # torch's capture_end error hides the first one
                why = f"{type(cause).__name__}: {str(cause).splitlines()[0][:300] if str(cause) else ''}"
                self.disabled = why            # CUDA may be left in a bad state: no further capture
                self.stats["eager"] += 1
                return self.engine.step(feed)
            self.stats["captured"] += 1
        else:
            self.stats["replayed"] += 1
        return self._replay(entry, feed)

    def failures(self) -> list[str]:
        """Why the capture failed (one line; graphs were then off for the rest of the run), or nothing."""
        return [self.disabled] if self.disabled else []

    def report(self) -> dict:
        """The counts and the failure, as the TensorRT session's graphs report them (``run`` / ``bench`` / the model)."""
        return {**self.stats, "failed": self.failures(), "simulated": self.simulate}

    def close(self) -> None:
        """The graphs (and the memory they hold) go before the engine's pools."""
        self._graphs.clear()
        self._pool = self._stream = None
        self.engine.close()

    def _buffers(self, feed: dict) -> dict:
        """What the graph reads: the device inputs in buffers of their own on the engine's device (updated in place
        before each replay), the host inputs frozen at their captured values."""
        dev = self.engine.device
        return {k: v.to(dev, copy=True) if input_memory(k) == "device" else v.clone() for k, v in feed.items()}

    def _capture(self, feed: dict, keys: int) -> dict:
        buf = self._buffers(feed)
        if self.simulate:
            return {"buffers": buf, "keys": keys, "graph": None, "outputs": None, "src": {}}
        from ...trtllm.cpu import functional, tensor

        dev = self.engine.device
        main = torch.cuda.current_stream(dev)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        if self._stream is None:
            self._stream = torch.cuda.Stream(dev)
        graph = torch.cuda.CUDAGraph()
        try:
            # on the engine's device whichever thread steps (a server's worker), in thread-local mode as TensorRT-LLM's
            # executor captures: another thread's CUDA calls do not break it
            with torch.cuda.device(dev), attention.key_range(keys), \
                    torch.cuda.graph(graph, pool=self._pool, stream=self._stream, capture_error_mode="thread_local"):
                outputs = self.engine.run_step(buf)[0]
        finally:
            torch.cuda.set_stream(main)    # a failed capture can leave its own stream current
        # the graph reads the constants the stand-in keeps (made before the capture); its own references keep them
        # alive should a cache drop them
        kept = (list(tensor.cached_scalars().values()), list(functional.cached_constants().values()),
                [t for _, t in functional.cached_big_constants()])
        # a capture records the step without running it: the replay that follows is its one execution
        return {"buffers": buf, "keys": keys, "graph": graph, "outputs": outputs, "kept": kept, "src": {}}

    def _replay(self, entry: dict, feed: dict) -> dict:
        buf, src = entry["buffers"], entry["src"]
        for k, v in feed.items():
            if input_memory(k) != "device":
                continue
            seen = src.get(k)
            if seen is None or seen[0] is not v or seen[1] != v._version:   # else unchanged: already there
                buf[k].copy_(v, non_blocking=True)
                src[k] = (v, v._version)
        if self.simulate:   # what the replay computes: the frozen host values, the buffers' device values
            with attention.sized_as_on_a_device(), attention.key_range(entry["keys"]):
                outs = self.engine.run_step(buf)[0]
        else:
            with torch.cuda.device(self.engine.device):   # on the current stream of the engine's device
                entry["graph"].replay()
            outs = entry["outputs"]
        return {k: v.clone() if k == "logits" else v.to("cpu", copy=True) for k, v in outs.items()}
