"""Reading Hugging Face checkpoints (lazily, strictly) and writing TensorRT-LLM ones."""

from .inventory import (
    Expected,
    InventoryReport,
    check_drafter_checkpoint,
    check_inventory,
    check_target_checkpoint,
    expected_drafter_tensors,
    expected_target_tensors,
)
from .reader import SafetensorsCheckpoint, TensorInfo, has_weights, read_header

__all__ = [
    "Expected", "InventoryReport", "SafetensorsCheckpoint", "TensorInfo", "check_drafter_checkpoint",
    "check_inventory", "check_target_checkpoint", "expected_drafter_tensors", "expected_target_tensors",
    "has_weights", "read_header",
]
