"""Make TensorRT-LLM know the DFlash2 architectures, then run its own ``trtllm-build``.

TensorRT-LLM resolves a checkpoint's or engine's ``config.json`` through ``tensorrt_llm.models.MODEL_MAP``
keyed by ``architecture`` (``PretrainedConfig.from_dict``: trtllm-build's config parsing, and
``EngineConfig.from_json_file`` under ``ModelRunnerCpp.from_dir``); ``--model_cls_file`` does not register
the class there, so the checkpoint's ``DFlash2Qwen3ForCausalLM`` (and the other two, ``convert/schema.py``
ARCHITECTURES) is a KeyError before any network is built. :func:`register` adds them, all mapping to the
network's ``DFlash2ForCausalLM``; :func:`main` registers and then hands the command line, unchanged, to
``tensorrt_llm.commands.build.main`` (what the ``trtllm-build`` console script runs)::

    python -m dflash2_trt.trtllm.register --checkpoint_dir ... --model_cls_file .../model.py ...

Another program that loads a DFlash2 engine with TensorRT-LLM calls ``register()`` first (``RUN.md`` shows it).
"""

from __future__ import annotations

import sys

from ..convert.schema import ARCHITECTURES


def import_tensorrt_llm():
    """``import tensorrt_llm`` with its version banner (printed to stdout on import) sent to stderr: a command's
    stdout stays its own (``run --json``; the ranks > 0 of a tp engine print nothing). An import that fails is one
    line (``transformers_support.tensorrt_llm_import_failure``), not TensorRT-LLM's traceback."""
    import contextlib

    from ..errors import MissingDependencyError
    from ..transformers_support import tensorrt_llm_import_failure

    try:
        with contextlib.redirect_stdout(sys.stderr):
            import tensorrt_llm
    except ImportError as exc:
        raise MissingDependencyError(tensorrt_llm_import_failure(exc)) from None
    return tensorrt_llm


def architectures() -> tuple[str, ...]:
    """The ``architecture`` values a DFlash2 checkpoint / engine config can carry."""
    return tuple(ARCHITECTURES.values())


def register(model_map=None, model_cls=None) -> dict:
    """Put every DFlash2 architecture into ``model_map`` (default: ``tensorrt_llm.models.MODEL_MAP``) as
    ``model_cls`` (default: the network's ``DFlash2ForCausalLM`` on the TensorRT-LLM backend: the very class object
    ``trtllm/model.py`` exposes, both take ``load_network("trtllm")``). An existing entry for one of these names
    that is another class is an error (someone else's model under our name)."""
    if model_map is None:
        from tensorrt_llm.models import MODEL_MAP as model_map   # noqa: N811 - TensorRT-LLM's name
    if model_cls is None:
        from .backend import load_network

        model_cls = load_network("trtllm").DFlash2ForCausalLM
    for arch in architectures():
        have = model_map.get(arch)
        if have is not None and have is not model_cls and getattr(have, "__name__", None) != model_cls.__name__:
            raise RuntimeError(f"tensorrt_llm.models.MODEL_MAP[{arch!r}] is already {have!r}")
        model_map[arch] = model_cls
    return model_map


def main(argv: list[str] | None = None) -> None:   # pragma: no cover - needs TensorRT-LLM (GPU machines)
    try:
        from tensorrt_llm.commands import build
    except ImportError as exc:
        from ..transformers_support import tensorrt_llm_import_failure

        sys.exit(f"error: {tensorrt_llm_import_failure(exc)}")
    register()
    sys.argv = ["trtllm-build", *(sys.argv[1:] if argv is None else argv)]
    build.main()


if __name__ == "__main__":   # pragma: no cover
    main()
