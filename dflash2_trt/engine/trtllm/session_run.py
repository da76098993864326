"""Prompts through a TensorRT engine with the project runtime (:mod:`.session` under
:class:`~dflash2_trt.runtime.Runtime`): ``run`` (:func:`run_items`) and the verify gate (:func:`generate`) on the
engines :mod:`.paths` gives the ``project`` path. The report is ``run``'s for a CPU engine, with per-step acceptance
(the project runtime sees every step, unlike the C++ runner)."""

from __future__ import annotations

import time

from ...runtime import Request, Runtime
from ..common import check_requests, greedy_outputs, run_report, stop_ids
from .ranks import open_project_session


def _requests(items, *, max_new_tokens: int, temperature: float, seed: int, stops) -> list[Request]:
    return [Request(list(it["input_ids"]), it["output_tokens"] or max_new_tokens, temperature=temperature,
                    seed=seed + i, stop_token_ids=tuple(stops), task_id=it["task_id"]) for i, it in enumerate(items)]


def run_items(engine_dir, items: list[dict], *, max_new_tokens: int, temperature: float, seed: int,
              max_batch_size=None, tokenizer=None, trt=None, session_kw=None, progress=None) -> dict:
    """``dflash2-trt run`` on a TensorRT engine through the project runtime (``trt``: the tensorrt module, or its CPU
    stand-in in tests). ``progress(done, total)``: called after each step, by rank 0 only (the rank that prints)."""
    sess, man = open_project_session(engine_dir, trt=trt, **(session_kw or {}))
    try:
        stops = stop_ids(man, sess.vocab_size)
        reqs = _requests(items, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, stops=stops)
        rt = Runtime(sess, max_batch_size=max_batch_size)
        check_requests(rt, items, reqs)   # a request the engine cannot take names its prompts-file line
        t0 = time.perf_counter()
        rt.generate(reqs, progress=progress if getattr(sess, "rank", 0) == 0 else None)
        wall = time.perf_counter() - t0
        report = run_report(engine_dir, reqs, rt, wall, tokenizer, backend="trtllm", runtime="project",
                            block_size=sess.K + 1, tp_size=sess.tp, temperature=temperature)
        if getattr(sess, "graphs", None) is not None:
            report["cuda_graphs"] = sess.graphs.report()
        return report
    finally:
        sess.close()


def generate(engine_dir, prompts, new: int, *, eos=(), trt=None, session_kw=None) -> list[list[int]]:
    """Greedy new tokens per prompt through the project runtime (the verify gate's engine side)."""
    return greedy_outputs(open_project_session(engine_dir, trt=trt, **(session_kw or {}))[0], prompts, new, eos=eos)
