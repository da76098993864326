"""HF drafter + target -> combined TensorRT-LLM checkpoint (weight maps per family, TP sharding).

Entry point: :func:`convert_pair` (CLI: ``dflash2-trt convert``). Tensor names and splits:
:mod:`.qwen3`, :mod:`.qwen3_5`, :mod:`.dflash2`; config.json schema: :mod:`.schema`.
"""

from .driver import CHUNK_BYTES, TP_SIZES, ConvertResult, convert_pair
from .schema import SCHEMA_VERSION, CheckpointConfig, build_config

__all__ = ["CHUNK_BYTES", "TP_SIZES", "ConvertResult", "convert_pair", "SCHEMA_VERSION", "CheckpointConfig",
           "build_config"]
