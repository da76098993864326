"""What a runner that replays an engine's generation steps from CUDA graphs keys and sizes them by: the rules of
TensorRT-LLM's C++ executor for a TensorRT engine (``trtllm/cpu/api_1_2.yaml`` executor_cuda_graphs, recorded from
trtGptModelInflightBatching.cpp and runtimeBuffers.cpp), shared by the cuda backend's runner
(``engine/standin/graphs.py``) and the TensorRT session's (``engine/trtllm/session_graphs.py``)."""

from __future__ import annotations

import math

from ..errors import ConfigError

KV_LENGTH_ROUND_SIZE = 256
"""TensorRT-LLM's executor captures a new graph when the batch's longest committed length crosses a multiple of this
(``api_1_2.yaml`` executor_cuda_graphs kv_length_round_size, runtimeBuffers.h)."""

UNBUCKETED_HOST_INPUTS = ("host_past_key_value_lengths", "host_kv_cache_block_offsets", "host_context_lengths",
                          "sliding_host_past_key_value_lengths")
"""Host inputs a bucket does not fix: the growing lengths (read only for the key range, which the bucket fixes; the
context route's too: its key range and window switch are sized at capture,
:func:`~.trtllm.session_graphs.size_for_capture`), the block table's host copy (read only for checks), the context lengths (read only for context requests)."""


def past_at_capture(past: int, max_seq_len: int, granule: int = KV_LENGTH_ROUND_SIZE) -> int:
    """What TensorRT-LLM's executor writes into every request's host_past_key_value_lengths before it captures a
    graph (``api_1_2.yaml`` executor_cuda_graphs): the longest committed length ``past`` rounded up to ``granule``, at
    most ``max_seq_len - 1``. The graph's key (with the batch's shapes) and its launches' size."""
    return min(max_seq_len - 1, math.ceil(past / granule) * granule)


def graph_bucket(feed: dict, is_host, past_key: int, unbucketed=None):
    """The bucket of a step's ``feed`` (flat, by engine input name), or None when the step runs eagerly: only a step
    without context requests and with spec decoding on is graphed (the executor's rule). The bucket is every input's
    shape and dtype, the values of the host inputs other than ``unbucketed`` (default :data:`UNBUCKETED_HOST_INPUTS`;
    ``is_host(name)``: a graph keeps the values its capture read), and ``past_key``."""
    if unbucketed is None:
        unbucketed = UNBUCKETED_HOST_INPUTS
    if not bool((feed["host_request_types"] == 1).all()) or int(feed["spec_decoding_use"].reshape(-1)[0]) != 1:
        return None
    shapes = tuple(sorted((k, tuple(v.shape), str(v.dtype)) for k, v in feed.items()))
    fixed = tuple(sorted((k, v.numpy().tobytes()) for k, v in feed.items() if is_host(k) and k not in unbucketed))
    return shapes, fixed, past_key


def refuse_graphs(engine_backend: str, tp: int = 1, *, field: str = "--cuda-graphs") -> None:
    """One line where CUDA graphs cannot apply, for every command that offers them: a cpu engine (a stand-in on the
    CPU has no graph to capture), a tp engine (its ranks step apart)."""
    if engine_backend == "cpu":
        raise ConfigError("CUDA graphs replay the steps of a cuda engine or of a TensorRT engine on the project runtime; "
                          "this is a cpu engine", field=field)
    refuse_tp(tp, field=field)


def refuse_tp(tp: int, *, field: str = "--cuda-graphs") -> None:
    if tp != 1:
        raise ConfigError(f"CUDA graphs serve tp 1 engines; this one is tp {tp}", field=field)


COUNTS = ("replayed", "captured", "eager")
"""A runner's step counts (both runners: replayed + captured + eager = steps)."""


def counts_between(before: dict, after: dict) -> dict:
    """What a runner's graphs did between two of its reports (one ``bench run`` RUN): the counts' differences, the
    failure (graphs stay off after one) and whether it was simulated."""
    return {**{k: after[k] - before[k] for k in COUNTS}, "failed": after["failed"], "simulated": after["simulated"]}


def describe(report: dict) -> str:
    """A runner's report in words, for ``run``, ``bench run`` and the Triton model's log."""
    return (f"{report['replayed']} steps replayed, {report['captured']} captured, {report['eager']} eager"
            + (" (simulated on the CPU)" if report.get("simulated") else "")
            + "".join(f"; a capture failed, later steps eager: {why}" for why in report["failed"]))
