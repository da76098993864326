"""The cuda engine backend's own pieces: the CUDA build of the DFlash2 plugins behind a C ABI (:mod:`.plugin_lib`).
The network's TensorRT-LLM names on a GPU are the stand-in's (:mod:`dflash2_trt.trtllm.cpu`), run on CUDA tensors."""
