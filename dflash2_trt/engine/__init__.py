"""Engines: the engine directory format, the two backends that write it, and the commands above them.

- :mod:`.format` the engine directory (``engine.json``, its schema, the load and hash checks);
  :mod:`.common`, :mod:`.pretrained` (the engine's ``pretrained_config``), :mod:`.checkpoint` (the kept
  converted checkpoint) and :mod:`.verify` (the verify gate's prompts, reference and comparison) are shared by
  both backends.
- :mod:`.cpu` the CPU backend: build, open (the CPU engine), verify, run.
- :mod:`.trtllm` the TensorRT-LLM backend: toolchain probe, plugin library, trtllm-build command and build, the
  runtime's config rules, the C++ runner, verify.
- :mod:`.plan` (``prepare``, sizing, ``build --dry-run``), :mod:`.build` and :mod:`.run` (the commands) sit above
  the backends and choose one. A backend never imports them; nothing here imports the package's ``__init__``.
"""
