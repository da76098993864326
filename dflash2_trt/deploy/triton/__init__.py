"""Triton Inference Server: the model repository (``repository.py``, ``templates/``, ``models/``) and
the CPU engine behind the ``tensorrt_llm`` tensors (``serving.py``). Importing this package imports
no Triton code."""
