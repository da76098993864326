"""dflash2-trt: DFlash2 speculative decoding drafters + targets -> TensorRT-LLM engines."""

__version__ = "0.1.0"
