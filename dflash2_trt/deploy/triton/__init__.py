"""Triton Inference Server: the model repository (``repository.py``, ``templates/``, ``models/``), the
CPU engine behind the ``tensorrt_llm`` tensors (``serving.py``), the bundled server (``server.py``)
and a bounded load client (``load.py``). Importing this package imports no Triton code."""
