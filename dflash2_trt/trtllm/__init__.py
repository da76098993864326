"""TensorRT-LLM side of dflash2-trt: engine build and run."""
