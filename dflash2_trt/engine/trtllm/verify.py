"""The verify gate on a TensorRT-LLM engine: the fixed prompts through the engine's runtime (TensorRT-LLM's C++
runner, :mod:`.runner`, or the project runtime over TensorRT, :mod:`.session_run`, as :mod:`.paths` decides; GPU
machines) and through the target's own greedy decoding (:mod:`dflash2_trt.engine.verify`).

The two sides need different transformers: the engine side runs where TensorRT-LLM 1.2 imports (its wheel pins
transformers 4.57.x), the reference needs this project's pin (``transformers_support``). With ``python`` (``build
--trtllm-python``) the engine side runs in that interpreter, ``python -m dflash2_trt.engine.run REQUEST OUTPUT``
(:func:`engine_outputs_in`), and only token ids cross over; the reference stays here (docs/trt-session.md §11)."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from ..verify import NEW_TOKENS, VerifyError, check_against_target, fixed_prompts, shape_prompts
from .paths import PROJECT, choose_runtime
from .process import SubprocessRunner, exit_description
from .runner import generate
from .session_run import generate as generate_project
from .toolchain import same_interpreter

CHILD_MODULE = "dflash2_trt.engine.run"   # its engine_side_main: above both backends, so it opens any engine


def engine_outputs(engine_dir, prompts, new: int, *, eos=(), plugin_lib=None,
                   man=None) -> list[list[int]]:   # pragma: no cover - TensorRT on a GPU
    """Greedy new tokens per prompt through a TensorRT-LLM engine directory on the runtime :mod:`.paths` gives it."""
    man = man if man is not None else json.loads((Path(engine_dir) / "engine.json").read_text())
    pre = json.loads((Path(engine_dir) / "config.json").read_text())["pretrained_config"]
    if choose_runtime(None, pre, man)["path"] == PROJECT:
        return generate_project(engine_dir, prompts, new, eos=eos)
    return generate(engine_dir, prompts, new, eos=eos, plugin_lib=plugin_lib)


def engine_outputs_in(python: str, engine_dir, prompts, new: int, *, eos=(), plugin_lib=None, runner=None,
                      kept_log=None) -> list[list[int]]:
    """:func:`engine_outputs` run by another interpreter (TensorRT-LLM's environment): a request file in, the
    token ids out, its output in a log whose end a failure quotes and, where ``kept_log`` is given, keeps there.
    Ctrl-C stops the child first (:class:`~.process.SubprocessRunner`)."""
    runner = runner if runner is not None else SubprocessRunner()
    with tempfile.TemporaryDirectory(prefix="dflash2-verify-") as d:
        req, out, log = Path(d) / "request.json", Path(d) / "outputs.json", Path(d) / "engine.log"
        req.write_text(json.dumps({"engine_dir": str(Path(engine_dir).absolute()), "prompts": [list(map(int, p))
                                   for p in prompts], "new": int(new), "eos": [int(e) for e in eos],
                                   "plugin_lib": str(plugin_lib) if plugin_lib is not None else None}))
        rc = runner([python, "-m", CHILD_MODULE, str(req), str(out)], log=log)
        if rc != 0 or not out.is_file():
            lines = log.read_text(errors="replace").strip().splitlines() if log.is_file() else []
            kept = ""
            if kept_log is not None and log.is_file():
                Path(kept_log).unlink(missing_ok=True)   # a file of its own (never through a link left there)
                shutil.copyfile(log, kept_log)
                kept = f" (its output: {kept_log})"
            raise VerifyError(f"the engine side of the verify gate failed in {python} ({exit_description(rc)}){kept}: "
                              f"{(lines or ['no output'])[-1][:300]}")
        try:
            outs = json.loads(out.read_text())["outputs"]
        except (ValueError, KeyError, TypeError):
            outs = None
    if kept_log is not None and Path(kept_log).is_file() and not Path(kept_log).is_symlink():
        Path(kept_log).unlink()   # an earlier failure's log: this run's engine side answered
    if not isinstance(outs, list) or len(outs) != len(prompts) or not all(isinstance(o, list) for o in outs):
        raise VerifyError(f"the engine side of the verify gate in {python} returned {len(outs)} outputs for "
                          f"{len(prompts)} prompts" if isinstance(outs, list) else
                          f"the engine side of the verify gate in {python} wrote no readable outputs")
    return [[int(t) for t in o] for o in outs]


def verify_trtllm_engine(engine_dir, *, target_dir, target_key=None, plugin_lib=None, new: int = NEW_TOKENS,
                         python: str | None = None, runner=None, kept_log=None) -> dict:
    """The fixed prompts through the built engine (in ``python`` where given and not this interpreter) and through
    the target's own greedy decoding here."""
    t0 = time.perf_counter()
    cfg = json.loads((Path(engine_dir) / "config.json").read_text())
    man = json.loads((Path(engine_dir) / "engine.json").read_text())
    pre, build = cfg["pretrained_config"], cfg["build_config"]
    eos = tuple(int(e) for e in man.get("eos_token_ids") or ())
    prompts = fixed_prompts(target_key, int(pre["vocab_size"]), avoid=(*eos, int(pre["dflash2"]["mask_token_id"])))
    K = int(pre["dflash2"]["block_size"]) - 1
    prompts, new = shape_prompts(prompts, int(build["max_input_len"]), int(build["max_seq_len"]) - 2 * K, new)
    path = choose_runtime(None, pre, man)["path"]
    if python is not None and not same_interpreter(python):
        outs = engine_outputs_in(python, engine_dir, prompts, new, eos=eos, plugin_lib=plugin_lib, runner=runner,
                                 kept_log=kept_log)
    else:
        outs = engine_outputs(engine_dir, prompts, new, eos=eos, plugin_lib=plugin_lib)   # pragma: no cover - GPU
    ties = check_against_target(target_dir, prompts, outs, new, eos, dtype=pre["dtype"])
    return {"passed": True, "backend": "trtllm", "runtime": path, "prompts": len(prompts), "new_tokens": new,
            "tokens": sum(map(len, outs)), "ties": ties, "seconds": round(time.perf_counter() - t0, 3),
            "engine_side": python or sys.executable}
