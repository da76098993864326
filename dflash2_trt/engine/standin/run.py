"""``dflash2-trt run`` on a cpu or cuda engine: the prompts through the project's runtime (in-flight batching),
the report ``run`` prints."""

from __future__ import annotations

import time

from ...reference.generate import parse_prompt_ids
from ...runtime import Request, Runtime
from ...tokenizer import chat_report, encode_text
from ..common import check_requests, read_prompts_file, run_report, run_tokenizer, stop_ids, text_origin
from .engine import open_standin_engine
from .graphs import GraphedSteps


def run_standin_engine(engine_dir, *, prompt_ids=None, prompt=None, prompts_file=None, max_new_tokens: int = 64,
                   temperature: float = 0.0, seed: int = 0, max_batch_size: int | None = None, verify: bool = False,
                   progress=None, cuda_graphs: bool = False, simulate_graphs: bool = False, chat=None) -> dict:
    """Exactly one of ``prompt_ids`` / ``prompt`` / ``prompts_file``, the other options already checked by
    :func:`dflash2_trt.engine.run.run_engine`. ``chat``: prompt text through the chat template
    (:class:`~dflash2_trt.tokenizer.ChatFormat`). ``cuda_graphs``: generation steps replayed from CUDA graphs
    (:mod:`.graphs`; ``simulate_graphs``: the same bookkeeping with eager replays, on the CPU, for tests)."""
    engine, man = open_standin_engine(engine_dir, verify=verify)
    try:
        items = []
        if prompts_file is not None:
            items = read_prompts_file(prompts_file)
        elif prompt_ids is not None:
            items = [{"task_id": 0, "input_ids": parse_prompt_ids(prompt_ids, engine.vocab_size), "prompt": None,
                      "output_tokens": None, "where": "--prompt-ids"}]
        else:
            items = [{"task_id": 0, "input_ids": None, "prompt": prompt, "output_tokens": None, "where": "--prompt"}]
        tok = run_tokenizer(man, engine_dir, items, chat)
        reqs = []
        stops = stop_ids(man, engine.vocab_size)
        for i, it in enumerate(items):
            ids = it["input_ids"]
            if ids is None:
                ids = encode_text(tok, it["prompt"], engine.vocab_size, chat=chat, **text_origin(it))
            reqs.append(Request(list(ids), it["output_tokens"] or max_new_tokens, temperature=temperature,
                                seed=seed + i, stop_token_ids=stops, task_id=it["task_id"]))
        stepper = GraphedSteps(engine, simulate=simulate_graphs) if cuda_graphs or simulate_graphs else engine
        rt = Runtime(stepper, max_batch_size=max_batch_size)
        check_requests(rt, items, reqs)   # a request the engine cannot take names its prompts-file line
        t0 = time.perf_counter()
        rt.generate(reqs, progress=progress)
        wall = time.perf_counter() - t0
        report = run_report(engine_dir, reqs, rt, wall, tok, backend=engine.backend, block_size=engine.K + 1,
                            tp_size=engine.tp, temperature=temperature)
        report.update(chat_report(chat))
        if stepper is not engine:
            report["cuda_graphs"] = stepper.report()
        return report
    finally:
        engine.close()
