"""CUDA graphs of a TensorRT engine's generation steps on the project runtime: ``run`` / ``bench run --cuda-graphs``
on an engine of the project path. NOT YET RUN ON A GPU (no TensorRT here): off unless asked for.

What TensorRT-LLM's C++ executor does with its own CUDA-graph mode (``ExtendedRuntimePerfKnobConfig.cuda_graph_mode``;
facts in ``trtllm/cpu/api_1_2.yaml`` ``executor_cuda_graphs``, from trtGptModelInflightBatching.cpp and
runtimeBuffers.cpp), done by :class:`~.session.TrtEngineSession`:

- only a step without context requests is graphed;
- its key: every input's shape and dtype, the host inputs' values but the growing or unread ones
  (:data:`~dflash2_trt.engine.graph_rules.UNBUCKETED_HOST_INPUTS`), and the longest committed length rounded up
  to 256 (the executor's key is the batch's composition, token count and that length; the host values are added here
  because the EAGLE inputs of this engine live on the host and a graph keeps what its capture read);
- a step whose key has no graph runs eagerly (``execute_async_v3``), then the same step is captured for the later
  steps of its key: every request's ``host_past_key_value_lengths`` set to the rounded length first, so that the
  attention's launches cover them, as ``prepareBuffersForCudaGraph`` does (the capture records, it does not run);
- a step whose key has a graph: its inputs are copied into the persistent buffers (their addresses are the graph's),
  and the graph is launched on the session's stream;
- a graph is used only with the addresses it was captured with (an output buffer that grew since drops it); the
  least recently used goes first past ``cache_size`` graphs (the executor keeps min(max batch, its
  ``cuda_graph_cache_size``, at least 1) per buffer set); a capture that fails turns graphs off for the session, with
  the first error kept.

The executor's own mode (``ModelRunnerCpp.from_dir(cuda_graph_mode=...)``) is not turned on by this project on the
executor path: it has never run with a DFlash2 engine.

``stats``, as the cuda backend's runner counts them (``replayed + captured + eager`` = steps): a step launched from
a graph is ``replayed``; the eager step a capture follows is ``captured``; every other step is ``eager``.

One difference from the executor: the rounded length is capped at the project runtime's max_seq_len - 1, the
executor's at trtllm-build's (which adds the draft slots); no committed length reaches either.

``simulate`` (tests, any machine): a capture records the bound addresses and the host inputs' values (what
``enqueueV3`` reads on the host while capturing), and a replay executes the engine once more on those addresses with
those host values put back for the call (what a launched graph computes: the device inputs as they are now, the host
values as they were). So the stand-in execution API (``testing/tensorrt_standin.py``) holds the session's bookkeeping
(keys, the frozen host values, the stable addresses) to the tokens of eager steps. What it cannot show: that CUDA and
TensorRT accept the capture (the stand-in's execution synchronises and reads on the host, so a real capture of it
fails, and the session then runs eagerly).
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from ...errors import ConfigError
from ..graph_rules import KV_LENGTH_ROUND_SIZE, graph_bucket, past_at_capture, refuse_tp


CURRENT_IN_SIMULATION = ("host_kv_cache_block_offsets",)
"""Host inputs a simulated replay leaves as the step bound them: the block table's host copy, which the stand-in
checks against the device table at every execution (a check a launched graph does not make). No generation launch
reads it: the executor's graphs, keyed without it, are replayed for other requests' block tables."""


def size_for_capture(bound: dict, past: int) -> None:
    """The executor's ``prepareBuffersForCudaGraph``: every request's host_past_key_value_lengths set to the key's
    rounded length before the capture, so that the attention's launches cover every later step of the key. On the
    context route the sliding layers' calls are context parts, whose key range is the max of their
    host_past_key_value_lengths as given (no draft width added): those are set to the rounded length plus the step's
    new tokens (every request of a graphed step is a generation request, K + 1 each). Their window then applies in
    the graph when that bound passes it, which is sound: a later step of the key has no key farther than its bound, so
    where the bound is within the window no key falls outside it (facts/attention_window.yaml context_route)."""
    t = bound.get("host_past_key_value_lengths")
    if t is not None and t.numel():
        t.fill_(past)
    s, n = bound.get("sliding_host_past_key_value_lengths"), bound.get("sliding_host_context_lengths")
    if s is not None and s.numel():
        s.fill_(past + int(n.max()))


class SessionGraphs:
    """The graphs of one :class:`~.session.TrtEngineSession` (module docstring). ``stats``: steps replayed, captured
    (the eager step a capture follows) and eager; ``disabled``: why a capture failed."""

    def __init__(self, session, *, simulate: bool = False, cache_size: int = 16):
        if session.device.type != "cuda" and not simulate:
            raise ConfigError(f"CUDA graphs need the session on a GPU; it runs on {session.device}",
                              field="--cuda-graphs")
        refuse_tp(session.tp)
        if not isinstance(cache_size, int) or cache_size < 1:
            raise ConfigError(f"must be an integer >= 1, got {cache_size!r}", field="cuda_graph_cache_size")
        self.session, self.simulate, self.cache_size = session, simulate, cache_size
        self.max_seq_len = int(session.limits["max_seq_len"])
        self.granule = KV_LENGTH_ROUND_SIZE        # the executor's; tests set a small one to cross its boundaries
        self.dropped = 0                           # graphs dropped because a buffer they use moved
        self._graphs: OrderedDict = OrderedDict()
        self._pool = None
        self.stats = {"replayed": 0, "captured": 0, "eager": 0}
        self.disabled: str | None = None

    def key(self, feed: dict, is_host):
        """The step's key, or None when it runs eagerly."""
        if self.disabled:
            return None
        past = int(feed["host_past_key_value_lengths"].max()) if feed["host_past_key_value_lengths"].numel() else 0
        return graph_bucket(feed, is_host, past_at_capture(past, self.max_seq_len, self.granule))

    def lookup(self, key, addresses: dict):
        """The graph of ``key`` captured with these ``addresses``, or None (a graph of other addresses is dropped)."""
        entry = None if key is None else self._graphs.get(key)
        if entry is not None and entry["addresses"] != addresses:
            del self._graphs[key]
            self.dropped += 1
            entry = None
        if entry is None:
            return None
        self._graphs.move_to_end(key)
        self.stats["replayed"] += 1
        return entry

    def capture(self, key, bound: dict, addresses: dict, is_host, run) -> None:
        """After a step that ran eagerly: capture the same step for ``key``'s later ones (``run(addresses)`` enqueues
        it), or count the step as eager (no key, graphs off, the capture failed)."""
        if key is None or self.disabled:
            self.stats["eager"] += 1
            return
        size_for_capture(bound, key[2])
        while len(self._graphs) >= self.cache_size:
            self._graphs.popitem(last=False)
        entry = {"addresses": dict(addresses), "graph": None}
        if self.simulate:
            entry["host"] = {n: t.clone() for n, t in bound.items() if is_host(n)}
        else:
            try:
                entry["graph"] = self._capture_cuda(addresses, run)
            except Exception as e:  # noqa: BLE001 - a step that cannot be captured: graphs off, the reason kept
                cause = e.__context__ or e
                self.disabled = f"{type(cause).__name__}: {str(cause).splitlines()[0][:300] if str(cause) else ''}"
                self._graphs.clear()
                self.stats["eager"] += 1
                return
        self._graphs[key] = entry
        self.stats["captured"] += 1

    def _capture_cuda(self, addresses: dict, run):
        s = self.session
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        # thread-local capture mode, as the executor's CudaGraphExecutor captures; on the session's stream. The outer
        # stream context puts the caller's current stream back also when the capture fails: torch's graph context
        # leaves its capture stream current when capture_end raises (steps.graph_replay_ms does the same)
        with torch.cuda.stream(torch.cuda.current_stream()):
            with torch.cuda.graph(graph, pool=self._pool, stream=s.stream, capture_error_mode="thread_local"):
                if not run(addresses):
                    raise RuntimeError("TensorRT's execute_async_v3 failed while capturing")
        return graph

    def replay(self, entry: dict, bound: dict, run) -> None:
        """Launch ``entry``'s graph (or, simulated, execute with its addresses and its captured host values)."""
        if not self.simulate:
            entry["graph"].replay()            # on the current stream: the session's
            return
        frozen = {n: v for n, v in entry["host"].items() if n not in CURRENT_IN_SIMULATION}
        saved = {n: bound[n].clone() for n in frozen}
        try:
            for n, v in frozen.items():
                bound[n].copy_(v)
            if not run(entry["addresses"]):
                raise RuntimeError("TensorRT's execute_async_v3 failed (TensorRT's log says why)")
        finally:
            for n, v in saved.items():
                bound[n].copy_(v)

    def report(self) -> dict:
        return {**self.stats, "failed": [self.disabled] if self.disabled else [], "simulated": self.simulate}
