"""Python-backend model files of the generated Triton repository (copied to ``<model>/1/model.py``).

They run inside Triton's python-backend stub, not in this package: ``preprocessing.py`` and
``postprocessing.py`` import only numpy, transformers and ``triton_python_backend_utils`` (so they
also run in TensorRT-LLM's own Triton container); ``tensorrt_llm_python.py`` imports ``dflash2_trt``
for the project runtime (over a CPU / cuda engine, or over TensorRT for a TensorRT-LLM engine). Nothing here
imports them.
"""
