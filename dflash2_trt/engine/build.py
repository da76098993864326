"""``dflash2-trt build``: an engine directory from one of the backends: the stand-in backends ``cpu`` and
``cuda`` (:mod:`.standin.build`: weights the project's runtime runs with the torch stand-in, on the CPU or on a GPU
with the plugins' CUDA kernels) or the TensorRT-LLM backend (:mod:`.trtllm.build`: rank engines from
``trtllm-build``); each module describes its layout, and all write the directory format of
:mod:`.format`. All start from :func:`dflash2_trt.engine.plan.prepare` (configs, pairing, settings:
``build_configs/NAME.yaml`` + overrides) and end with the verify gate (:mod:`.verify`) when it is on; this
module checks the outputs, decides ``verify="auto"`` (:func:`dflash2_trt.engine.plan.verify_default`) and
hands the prepared build to the backend.
"""

from __future__ import annotations

from pathlib import Path

from ..checkpoint.writer import check_output_dir, recover_swapped
from ..errors import ConfigError
from ..overlap import refuse_overlap
from .standin.build import build_standin
from .standin.engine import engine_device
from .format import BuildResult
from .plan import check_checkpoint_options, check_disk, prepare, verify_default
from .trtllm.build import build_trtllm
from .trtllm.command import default_checkpoint_dir

def build_engine(drafter_dir, target_dir, output, *, backend: str = "cpu", tp_size: int | None = None, dtype=None,
                 target_key: str | None = None, overrides: dict | None = None, sets: dict | None = None,
                 force: bool = False, command: list[str] | None = None, verify: bool | str = False,
                 checkpoint_dir=None, reconvert: bool = False, keep_checkpoint: bool = True, progress=None,
                 toolchain=None, runner=None, verifier=None, disk_check: bool = True,
                 baseline: bool = False) -> BuildResult:
    """Build an engine directory with ``backend`` (``cpu``, ``cuda`` or ``trtllm``).

    Settings: ``build_configs/<target_key>.yaml`` (or defaults from the checkpoint configs), then
    ``overrides`` (named options, ``None`` = not given), ``tp_size``/``dtype`` and ``sets`` (``--set``),
    all validated together. ``verify``: True, False or ``"auto"`` (on when the target is small:
    :data:`dflash2_trt.engine.verify.AUTO_MAX_TARGET_BYTES`, and on the TensorRT-LLM backend at tp 1).
    ``checkpoint_dir``: keep (and reuse, when its manifest matches) the converted checkpoint there; the CPU
    engine then links its files. ``toolchain``/``runner``/``verifier``: injectable machine access for the
    TensorRT-LLM branch (:mod:`.trtllm.build`; ``verifier`` also for the CPU one). ``disk_check``: refuse in one line,
    before anything is converted, when a file system the build writes to lacks the room for the checkpoint and the
    engines (:func:`~dflash2_trt.engine.plan.check_disk`). ``baseline`` (trtllm only): also the target alone in
    ``baseline/``, ``bench run``'s autoregressive baseline on the project runtime (:func:`check_baseline_backend`)."""
    check_build_outputs(drafter_dir, target_dir, output, checkpoint_dir=checkpoint_dir,
                        default_checkpoint=backend == "trtllm" and checkpoint_dir is None and keep_checkpoint)
    if output is not None and not Path(output).is_symlink():
        recover_swapped(output)   # an engine a killed --force run moved aside is put back (and named) first
    over = dict(overrides or {})
    if tp_size is not None:
        over["tp_size"] = int(tp_size)
    if dtype is not None:
        over["dtype"] = dtype
    prep = prepare(drafter_dir, target_dir, target_key=target_key, overrides=over, sets=sets)
    if backend not in ("cpu", "cuda", "trtllm"):
        raise ConfigError(f"unknown backend {backend!r}; expected cpu, cuda or trtllm", field="--backend")
    check_baseline_backend(backend, baseline)
    check_checkpoint_options(backend, keep_checkpoint=keep_checkpoint, reconvert=reconvert,
                             checkpoint_dir=checkpoint_dir)
    if backend == "cuda":
        engine_device("cuda")   # no GPU: one line now, before anything is converted
    if disk_check and output is not None and not prep.blockers and not (backend == "trtllm" and prep.trtllm_blockers):
        check_output_dir(output, force)   # its refusal first: the disk is checked for a build that will go ahead
        check_disk(prep, backend=backend, output=output, checkpoint_dir=checkpoint_dir, keep_checkpoint=keep_checkpoint,
                   reconvert=reconvert, baseline=baseline)
    # the engine carries the target's tokenizer files (run --prompt, serve, deploy triton read them): files that do not
    # load here are said after the build, not found by the engine's first text prompt (a fuzzing review); not refused:
    # an engine for token ids needs none, and the machine that serves it may have what they need (sentencepiece, ...)
    from ..tokenizer import find_tokenizer

    try:
        find_tokenizer(target_dir, strict=True)
        tokenizer_note = None
    except ConfigError as exc:
        tokenizer_note = (f"{exc}: the engine carries them as they are; run --prompt, serve and deploy triton need "
                          f"them to load (token ids work without)")
    if verify == "auto":
        verify = verify_default(prep, backend)
    if backend == "trtllm":
        res = build_trtllm(prep, output, force=force, command=command, verify=verify, checkpoint_dir=checkpoint_dir,
                           reconvert=reconvert, keep_checkpoint=keep_checkpoint, progress=progress,
                           toolchain=toolchain, runner=runner, verifier=verifier, baseline=baseline)
    else:
        res = build_standin(prep, output, force=force, command=command, verify=verify, checkpoint_dir=checkpoint_dir,
                            reconvert=reconvert, progress=progress, verifier=verifier, backend=backend)
    if tokenizer_note is not None:
        res.notes.append(tokenizer_note)
    return res


def check_baseline_backend(backend: str, baseline: bool) -> None:
    """``--baseline`` builds a TensorRT engine of the target alone; a cpu or cuda engine needs none (``bench run``
    builds its baseline from the engine's own checkpoint at load time): refused there, not ignored."""
    if baseline and backend != "trtllm":
        raise ConfigError(f"applies to --backend trtllm (a {backend} engine's `bench run` builds the target-only "
                          f"baseline from the engine's own checkpoint)", field="--baseline")


def check_build_outputs(drafter_dir, target_dir, output, *, checkpoint_dir=None, default_checkpoint=False) -> None:
    """The overlap rule (:mod:`dflash2_trt.overlap`) for a build: ``--output`` and ``--checkpoint-dir`` (and the
    TensorRT-LLM backend's default ``OUTPUT.checkpoint``) are not, do not contain and do not lie inside the
    drafter or target directory, nor each other. Raises before anything is written or deleted."""
    inputs = [("drafter directory", drafter_dir), ("target directory", target_dir)]
    refuse_overlap(output, "--output", inputs)
    ckpt, option = checkpoint_dir, "--checkpoint-dir"
    if ckpt is None and default_checkpoint and output is not None:
        ckpt, option = default_checkpoint_dir(output), "--checkpoint-dir (default: OUTPUT.checkpoint)"
    if ckpt is not None:
        refuse_overlap(ckpt, option, inputs + ([("engine output directory", output)] if output is not None else []))
        from .checkpoint import refuse_foreign_checkpoint_dir

        refuse_foreign_checkpoint_dir(ckpt)   # the dry run says it too, not only the build
