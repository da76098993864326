"""Support package of ``scripts/trtllm_conformance.py`` (see that script's docstring for what is real, what is
stubbed and why): :mod:`.fake_trt` (a ``tensorrt`` module over TensorRT-RTX with contract-checking plugin
placeholders) and :mod:`.harness` (the import shell around the real ``tensorrt_llm`` sources and the
trtllm-build network-definition path)."""
