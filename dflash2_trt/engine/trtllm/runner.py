"""A TensorRT-LLM engine directory through TensorRT-LLM's C++ runner (``ModelRunnerCpp``, the executor), or, for the
engines the executor cannot run (:mod:`.paths`), through the project runtime over TensorRT (:mod:`.session_run`).

GPU machines only: nothing here runs without TensorRT-LLM, and the whole module is a thin layer over
``tensorrt_llm.runtime.ModelRunnerCpp`` (``from_dir(engine_dir, eagle_choices=..., ...)`` and
``generate(batch_input_ids, max_new_tokens=, end_id=, pad_id=, stop_words_list=, temperature=,
random_seed=, return_dict=True, output_sequence_lengths=True)``; read from
``tensorrt_llm/runtime/model_runner_cpp.py``). The DFlash2 plugins are loaded into the process
first (``ctypes.CDLL(RTLD_GLOBAL)``: the creators register statically), exactly what ``LD_PRELOAD``
does for ``tritonserver``.

The engine is an EAGLE-mode one-engine: every request passes the chain ``eagle_choices``
(``[[0], [0, 0], ..., [0] * K]``); ``tp > 1`` engines need one MPI rank per GPU (``mpirun -n TP``).
"""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

from ... import plugins
from ...errors import ConfigError, MissingDependencyError
from ...reference.generate import parse_prompt_ids
from ...sampling import request_temperature
from ...tokenizer import chat_report, encode_text
from ..common import eagle_choices, read_prompts_file, run_tokenizer, text_origin
from ..format import load_engine_dir
from ...trtllm.register import import_tensorrt_llm, register
from ..graph_rules import refuse_tp
from .paths import PROJECT, choose_runtime
from .session_run import run_items
from .xqa import apply_runtime_env


def _require_trtllm():
    if importlib.util.find_spec("tensorrt_llm") is None:
        raise MissingDependencyError("TensorRT-LLM is not importable: a TensorRT-LLM engine runs on a GPU machine with "
                                     "tensorrt-llm 1.2.x installed (see RUN.md in the engine directory)")


def _runner(engine_dir, *, plugin_lib=None, max_batch_size=None, man=None):   # pragma: no cover - GPU only
    _require_trtllm()
    engine_dir = Path(engine_dir)
    if man is None and (engine_dir / "engine.json").is_file():
        man = json.loads((engine_dir / "engine.json").read_text())
    apply_runtime_env(man)   # before TensorRT-LLM loads: what the engine was built with (xqa.py)
    lib = plugin_lib or (engine_dir / plugins.LIBRARY_NAME)
    plugins.load_library(lib)
    import_tensorrt_llm()   # first import here: its banner to stderr
    register()   # EngineConfig.from_json_file looks the architecture up in MODEL_MAP
    from tensorrt_llm.runtime import ModelRunnerCpp
    cfg = json.loads((engine_dir / "config.json").read_text())
    K = int(cfg["pretrained_config"]["dflash2"]["block_size"]) - 1
    tp = int(cfg["pretrained_config"]["mapping"]["tp_size"])
    import tensorrt_llm

    if tp > 1 and tensorrt_llm.mpi_world_size() != tp:
        raise ConfigError(f"a tp {tp} engine runs with one MPI rank per GPU: mpirun -n {tp} dflash2-trt run ...",
                          source=engine_dir / "config.json", field="pretrained_config.mapping.tp_size")
    runner = ModelRunnerCpp.from_dir(engine_dir=str(engine_dir), rank=tensorrt_llm.mpi_rank(),
                                     eagle_choices=eagle_choices(K), max_batch_size=max_batch_size)
    return runner, cfg


def _decode(runner, prompts, new: int, eos, temperature: float, seed: int) -> list[list[int]]:   # pragma: no cover
    import torch

    eos = tuple(eos)
    end_id = eos[0] if eos else -1
    stop = [[[e] for e in eos[1:]]] * len(prompts) if len(eos) > 1 else None
    res = runner.generate([torch.tensor(p, dtype=torch.int32) for p in prompts], max_new_tokens=new, end_id=end_id,
                          pad_id=end_id if end_id >= 0 else 0, stop_words_list=stop,
                          temperature=request_temperature(temperature),   # never 0 (engine_io.yaml request_temperature)
                          random_seed=seed, return_dict=True, output_sequence_lengths=True)
    return [executor_tokens([int(x) for x in res["output_ids"][i][0][len(p):int(res["sequence_lengths"][i][0])]],
                            new, eos) for i, p in enumerate(prompts)]


def executor_tokens(toks: list[int], new: int, eos) -> list[int]:
    """A request's new tokens as the CPU runtime and ``target_generate`` give them, from what TensorRT-LLM's executor
    returned (``toks``: the output up to its sequence length): cut after the first stop token, and ended with the end
    id (``eos[0]``) where the executor stopped at it, which it leaves out of the sequence (EAGLE decoding's explicit
    EOS stop: deploy/triton/tensorrtllm_backend.yaml ``responses``). Shorter than ``new`` without a stop word at its
    end means it stopped at the end id: ``run`` has refused a prompt + ``new`` over ``max_seq_len`` (trtllm-build adds
    the draft slots to it), so the executor never shortens a request for its length."""
    eos = tuple(eos)
    cut = next((k + 1 for k, x in enumerate(toks) if x in eos), len(toks))
    toks = list(toks[:cut])
    if eos and eos[0] >= 0 and len(toks) < new and not (toks and toks[-1] in eos):
        toks.append(eos[0])
    return toks


def generate(engine_dir, prompts, new: int, *, eos=(), plugin_lib=None, temperature: float = 0.0, seed: int = 0,
             max_batch_size=None) -> list[list[int]]:   # pragma: no cover - GPU only
    """New tokens per prompt (greedy at ``temperature`` 0), cut after the first stop token as the CPU runtime
    and ``target_generate`` do."""
    runner, _ = _runner(engine_dir, plugin_lib=plugin_lib, max_batch_size=max_batch_size)
    return _decode(runner, prompts, new, eos, temperature, seed)


def run_trtllm_engine(engine_dir, man: dict, items: list[dict], *, max_new_tokens: int, temperature: float,
                      seed: int, max_batch_size=None) -> dict:   # pragma: no cover - GPU only
    """``dflash2-trt run`` on a TensorRT-LLM engine: the report ``run`` prints for a CPU engine, without
    per-step acceptance (the C++ runner does not return it per request)."""
    eos = tuple(int(e) for e in man.get("eos_token_ids") or ())
    runner, _ = _runner(engine_dir, max_batch_size=max_batch_size, man=man)
    t0 = time.perf_counter()
    outs: dict[int, list[int]] = {}
    groups: dict[int, list[int]] = {}
    for i, it in enumerate(items):
        groups.setdefault(it["output_tokens"] or max_new_tokens, []).append(i)
    for new, idx in groups.items():
        for i, o in zip(idx, _decode(runner, [items[i]["input_ids"] for i in idx], new, eos, temperature, seed)):
            outs[i] = o
    wall = time.perf_counter() - t0
    reqs = [{"task_id": it["task_id"], "prompt_len": len(it["input_ids"]), "output_ids": outs[i],
             "stop_reason": "stop_token" if outs[i] and outs[i][-1] in eos else "max_new_tokens",
             # ModelRunnerCpp's generate returns no per-step acceptance: unknown (null, printed "-"), not 0.00
             "mean_acceptance": None, "acceptance_lengths": []} for i, it in enumerate(items)]
    n_tok = sum(len(o) for o in outs.values())
    return {"engine_dir": str(engine_dir), "backend": "trtllm", "block_size": man.get("block_size"),
            "tp_size": man.get("tp_size"), "temperature": temperature, "max_batch_size": max_batch_size,
            "requests": reqs, "totals": {"requests": len(reqs), "output_tokens": n_tok, "steps": 0,
                                         "generation_steps": 0, "mean_acceptance": None, "wall_s": wall,
                                         "output_tokens_per_s": n_tok / wall if wall > 0 else None}}


def refuse_graphs_off_the_project_path(asked: bool, path: dict, pretrained: dict) -> bool:
    """``--cuda-graphs`` on a TensorRT engine: the project runtime's graphs (tp 1), or one line saying why not."""
    if not asked:
        return False
    if path["path"] != PROJECT:
        raise ConfigError("applies to the project runtime (--runtime project): the executor's own CUDA-graph mode "
                          "(ModelRunnerCpp.from_dir cuda_graph_mode) is not turned on by this project, since it has "
                          "never run with a DFlash2 engine", field="--cuda-graphs")
    refuse_tp(int((pretrained.get("mapping") or {}).get("tp_size", 1)))
    return True


def run_engine_trtllm(engine_dir, *, prompt_ids=None, prompt=None, prompts_file=None, max_new_tokens: int = 64,
                      temperature: float = 0.0, seed: int = 0, max_batch_size=None, verify: bool = False,
                      runtime: str | None = None, trt=None, cuda_graphs: bool = False,
                      simulate_graphs: bool = False, progress=None, chat=None) -> dict:
    """``run --engine-dir`` on a TensorRT-LLM engine: the engine directory and the prompts are checked here (any
    machine), the decoding needs TensorRT (and TensorRT-LLM's plugins) on a GPU. ``runtime``: ``auto`` (the engine's
    path, :mod:`.paths`), ``project`` (the project runtime over TensorRT, :mod:`.session_run`) or ``executor``
    (TensorRT-LLM's C++ runner). ``trt``: the TensorRT module for the project runtime (tests: its CPU stand-in).
    ``cuda_graphs``: the project runtime replays generation steps from CUDA graphs (:mod:`.session_graphs`;
    ``simulate_graphs``: on the stand-in, for tests). ``progress(done, total)``: the project runtime's, after each
    step (TensorRT-LLM's C++ runner reports none). ``chat``: prompt text through the target's chat template before it
    is encoded, on either runtime path (:class:`~dflash2_trt.tokenizer.ChatFormat`)."""
    cfg, man = load_engine_dir(engine_dir, verify=verify)
    vocab = int(cfg["pretrained_config"]["vocab_size"])
    if prompts_file is not None:
        items = read_prompts_file(prompts_file)
    elif prompt_ids is not None:
        items = [{"task_id": 0, "input_ids": parse_prompt_ids(prompt_ids, vocab), "prompt": None,
                  "output_tokens": None, "where": "--prompt-ids"}]
    else:
        items = [{"task_id": 0, "input_ids": None, "prompt": prompt, "output_tokens": None, "where": "--prompt"}]
    path = choose_runtime(runtime, cfg["pretrained_config"], man)
    tok = run_tokenizer(man, engine_dir, items, chat)
    for it in items:
        if it["input_ids"] is None:
            it["input_ids"] = encode_text(tok, it["prompt"], vocab, chat=chat, **text_origin(it))
    lim = man["limits"]
    for it in items:
        ids, new = it["input_ids"], it["output_tokens"] or max_new_tokens
        if any(not 0 <= i < vocab for i in ids):
            raise ConfigError(f"token id outside the vocabulary [0, {vocab})", source=it["where"])
        if len(ids) > lim["max_input_len"]:
            raise ConfigError(f"{len(ids)} prompt tokens exceed the engine's max_input_len {lim['max_input_len']}",
                              source=it["where"])
        if len(ids) + new > lim["max_seq_len"]:
            raise ConfigError(f"prompt + {new} new tokens exceeds the engine's max_seq_len {lim['max_seq_len']}",
                              source=it["where"])
        if path["path"] != PROJECT and len(ids) > lim["max_num_tokens"]:
            # ModelRunnerCpp runs with chunked context off (its default): its scheduler would stop on a TLLM_CHECK
            raise ConfigError(f"{len(ids)} prompt tokens exceed the engine's max_num_tokens {lim['max_num_tokens']}, "
                              f"which TensorRT-LLM's C++ runner takes whole (chunked context off); the project "
                              f"runtime takes them in chunks: --runtime project", source=it["where"])
    if max_batch_size is not None and max_batch_size > lim["max_batch_size"]:
        raise ConfigError(f"must be in [1, {lim['max_batch_size']}] (the engine's max_batch_size), got {max_batch_size}",
                          field="--max-batch-size")
    graphs = refuse_graphs_off_the_project_path(cuda_graphs or simulate_graphs, path, cfg["pretrained_config"])
    if path["path"] == PROJECT:
        report = run_items(engine_dir, items, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                           max_batch_size=max_batch_size, tokenizer=tok, trt=trt,
                           session_kw={"cuda_graphs": cuda_graphs, "simulate_graphs": simulate_graphs} if graphs
                           else None, progress=progress)
    else:
        _require_trtllm()
        report = run_trtllm_engine(engine_dir, man, items, max_new_tokens=max_new_tokens, temperature=temperature,
                                   seed=seed, max_batch_size=max_batch_size)
        report["runtime"] = "executor"
        if tok is not None:   # each output's text, as run_report gives it on the project runtime
            for r in report["requests"]:
                r["text"] = tok.decode(r["output_ids"])
    report["runtime_path"] = path
    report.update(chat_report(chat))
    return report
