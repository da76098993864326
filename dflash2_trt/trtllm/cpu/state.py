"""Recurrent-state pools of the CPU backend (the stand-in for TensorRT-LLM's ``RnnStateManager`` buffers).

TensorRT-LLM (``batch_manager/rnnStateManager.cpp``) keeps, per recurrent layer, an fp32 state and a conv
state for every sequence slot, hands the engine their addresses (``rnn_state_ptr_<L>``, ``conv_state_ptr_<L>``,
int64 host inputs) and each request's slot (``slot_mapping``). Here one :class:`StatePool` per layer and rank
holds ``rnn [slots, Hv, Dk, Dv]`` float32 and ``conv [slots, K - 1, C]`` in the activation dtype. On the CPU
the pointer inputs carry the pool's handle (both the same), which the CPU plugin layer resolves; on a GPU they
carry the two tensors' device addresses, which the plugin's CUDA kernels dereference as TensorRT-LLM's do
(:meth:`StatePool.pointer_inputs`).
"""

from __future__ import annotations

import itertools
import threading

import torch


class StatePool:
    _registry: dict[int, "StatePool"] = {}
    _ids = itertools.count(1)
    _lock = threading.Lock()

    def __init__(self, slots: int, num_v_heads: int, head_k_dim: int, head_v_dim: int, conv_kernel: int,
                 conv_dim: int, dtype: torch.dtype, device="cpu"):
        self.rnn = torch.zeros(slots, num_v_heads, head_k_dim, head_v_dim, dtype=torch.float32, device=device)
        self.conv = torch.zeros(slots, conv_kernel - 1, conv_dim, dtype=dtype, device=device)
        with StatePool._lock:
            self.handle = next(StatePool._ids)
            StatePool._registry[self.handle] = self

    @classmethod
    def from_handles(cls, rnn_ptr, conv_ptr) -> "StatePool":
        a, b = int(torch.as_tensor(rnn_ptr).reshape(-1)[0]), int(torch.as_tensor(conv_ptr).reshape(-1)[0])
        if a != b or a not in cls._registry:
            raise ValueError(f"DFlash2GatedDeltaNet: no state pool for handles {a}/{b}")
        return cls._registry[a]

    def reset(self, slot: int) -> None:
        """A request's state at the start of its context: zeros (TensorRT-LLM resets a slot on a new request)."""
        self.rnn[slot].zero_()
        self.conv[slot].zero_()

    def release(self) -> None:
        with StatePool._lock:
            StatePool._registry.pop(self.handle, None)

    def handle_tensor(self) -> torch.Tensor:
        return torch.tensor([self.handle], dtype=torch.int64)

    def pointer_inputs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(``rnn_state_ptr``, ``conv_state_ptr``) as the runtime binds them: host int64 [1] each, the device
        addresses of the two pools on a GPU, the pool's handle (twice) on the CPU."""
        if self.rnn.is_cuda:
            return (torch.tensor([self.rnn.data_ptr()], dtype=torch.int64),
                    torch.tensor([self.conv.data_ptr()], dtype=torch.int64))
        return self.handle_tensor(), self.handle_tensor()
