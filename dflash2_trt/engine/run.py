"""``dflash2-trt run``: prompts through an engine directory. The options are checked here; a cpu or cuda engine runs
with the project's runtime (:mod:`.standin.run`, in-flight batching), a TensorRT-LLM engine through TensorRT-LLM's C++
runner or the project runtime over TensorRT, whichever its runtime path is (:mod:`.trtllm.runner`,
:mod:`.trtllm.paths`; GPU machines)."""

from __future__ import annotations

from ..errors import ConfigError
from ..reference.generate import SEED_MAX
from ..sampling import effective_temperature
from ..tokenizer import chat_label
from .standin.run import run_standin_engine
from .format import engine_backend
from .graph_rules import describe, refuse_graphs
from .trtllm.runner import run_engine_trtllm


def run_engine(engine_dir, *, prompt_ids=None, prompt=None, prompts_file=None, max_new_tokens: int = 64,
               temperature: float = 0.0, seed: int = 0, max_batch_size: int | None = None, verify: bool = False,
               progress=None, runtime: str | None = None, trt=None, cuda_graphs: bool = False, chat=None) -> dict:
    given = sum(x is not None for x in (prompt_ids, prompt, prompts_file))
    if given != 1:
        raise ConfigError("give exactly one of --prompt-ids, --prompt, --prompts", field="--prompt-ids")
    if max_new_tokens < 1:
        raise ConfigError(f"must be >= 1, got {max_new_tokens}", field="--max-new-tokens")
    temperature = effective_temperature(temperature, "--temperature")   # below 1e-5: greedy
    if not 0 <= seed <= SEED_MAX:
        raise ConfigError(f"must be in [0, {SEED_MAX}], got {seed}", field="--seed")
    if max_batch_size is not None and max_batch_size < 1:
        raise ConfigError(f"must be >= 1, got {max_batch_size}", field="--max-batch-size")
    backend = engine_backend(engine_dir)
    if cuda_graphs:
        refuse_graphs(backend)
    if backend == "trtllm":   # a GPU machine: the C++ executor or the project runtime over TensorRT
        return run_engine_trtllm(engine_dir, prompt_ids=prompt_ids, prompt=prompt, prompts_file=prompts_file,
                                 max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                                 max_batch_size=max_batch_size, verify=verify, runtime=runtime, trt=trt,
                                 cuda_graphs=cuda_graphs, progress=progress, chat=chat)
    if runtime not in (None, "auto"):
        raise ConfigError("applies to TensorRT-LLM engines (this is a stand-in engine: the project's runtime runs it)",
                          field="--runtime")
    return run_standin_engine(engine_dir, prompt_ids=prompt_ids, prompt=prompt, prompts_file=prompts_file,
                          max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                          max_batch_size=max_batch_size, verify=verify, progress=progress, cuda_graphs=cuda_graphs,
                          chat=chat)


def _mean(value) -> str:
    """A mean acceptance as ``run`` prints it: ``-`` where there was no generation step (JSON: null), as ``bench run``
    prints it."""
    return "-" if value is None else f"{value:.2f}"


def render(report: dict) -> str:
    lines = []
    for r in report["requests"]:
        chunks = r.get("context_chunks") or 0   # more than 1: the prompt was cut (chunked context)
        lines.append(f"[{r['task_id']}] prompt {r['prompt_len']} tokens{f' in {chunks} chunks' if chunks > 1 else ''} -> "
                     f"{len(r['output_ids'])} new "
                     f"({r['stop_reason']}), mean acceptance {_mean(r['mean_acceptance'])} "
                     f"over {len(r['acceptance_lengths'])} steps")
        lines.append("  ids: " + ",".join(map(str, r["output_ids"])))
        if "text" in r:
            lines.append("  text: " + r["text"])
    t = report["totals"]
    cut = t.get("chunked_steps")
    lines.append(f"{t['requests']} request(s), {t['output_tokens']} tokens in {t['steps']} engine steps "
                 f"(max batch {report['max_batch_size']}{f'; a prompt cut in chunks in {cut}' if cut else ''}), "
                 f"mean acceptance {_mean(t['mean_acceptance'])}, {t['output_tokens_per_s'] or 0:.1f} tokens/s")
    pool = report.get("kv_pool") or {}
    if pool.get("rule") == "free GPU memory":
        lines.append(f"KV pool: {pool['num_kv_blocks']:,} blocks of {pool['every_request_blocks']:,} for every request "
                     f"at max_seq_len ({pool['fraction']:g} of the {pool['free_bytes'] / 2**30:.2f} GiB free once the "
                     f"weights and state slots were in, as TensorRT-LLM sizes its pool; requests beyond it wait)")
    if pool.get("token_capacity") is not None and pool["token_capacity"] < pool["max_seq_len"]:
        lines.append(f"KV pool: {pool['num_kv_blocks']:,} blocks hold {pool['token_capacity']:,} tokens, less than "
                     f"max_seq_len {pool['max_seq_len']:,}: a longer request (prompt + new tokens + draft slots) is "
                     f"refused")
    if report.get("cuda_graphs"):
        lines.append("CUDA graphs: " + describe(report["cuda_graphs"]))
    if report.get("chat_template"):
        lines.append(f"prompt text as a user message through the target's {chat_label(report['chat_template'])}")
    return "\n".join(lines)


def engine_outputs(engine_dir, prompts, new: int, *, eos=(), plugin_lib=None) -> list[list[int]]:
    """Greedy new tokens per prompt through an engine directory as ``run`` opens it (the engine side of a verify gate):
    a TensorRT-LLM engine on its runtime path, a cpu or cuda engine with the project runtime."""
    import json
    from pathlib import Path

    man = json.loads((Path(engine_dir) / "engine.json").read_text())
    if man.get("backend") == "trtllm":
        from .trtllm.verify import engine_outputs as trtllm_outputs

        return trtllm_outputs(engine_dir, prompts, new, eos=eos, plugin_lib=plugin_lib, man=man)
    from .common import greedy_outputs
    from .standin.engine import open_standin_engine

    return greedy_outputs(open_standin_engine(engine_dir)[0], prompts, new, eos=eos)


def engine_side_main(argv=None) -> int:
    """``python -m dflash2_trt.engine.run REQUEST OUTPUT``: :func:`engine_outputs` of the request file's engine and
    prompts, written whole to OUTPUT as ``{"outputs": [[ids...], ...]}`` (the engine side of ``build
    --trtllm-python``'s verify gate, run in TensorRT-LLM's environment: engine/trtllm/verify.py engine_outputs_in)."""
    import json
    import sys
    from pathlib import Path

    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print("usage: python -m dflash2_trt.engine.run REQUEST.json OUTPUT.json", file=sys.stderr)
        return 2
    if Path(args[1]).exists() or Path(args[1]).resolve() == Path(args[0]).resolve():
        print(f"error: OUTPUT {args[1]} exists (or is REQUEST): it writes a new file only", file=sys.stderr)
        return 2
    req = json.loads(Path(args[0]).read_text())
    outs = engine_outputs(req["engine_dir"], req["prompts"], int(req["new"]), eos=tuple(req["eos"]),
                          plugin_lib=req.get("plugin_lib"))
    part = Path(args[1]).with_name(Path(args[1]).name + ".part")   # whole or absent: read after this exits
    part.write_text(json.dumps({"outputs": outs}))
    part.replace(args[1])
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(engine_side_main())
