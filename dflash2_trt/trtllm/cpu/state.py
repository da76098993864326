"""Recurrent-state pools of the CPU backend (the stand-in for TensorRT-LLM's ``RnnStateManager`` buffers).

TensorRT-LLM (``batch_manager/rnnStateManager.cpp``) keeps, per recurrent layer, an fp32 state and a conv
state for every sequence slot, hands the engine their addresses (``rnn_state_ptr_<L>``, ``conv_state_ptr_<L>``,
int64 host inputs) and each request's slot (``slot_mapping``). Here one :class:`StatePool` per layer and rank
holds ``rnn [slots, Hv, Dk + E, Dv]`` float32 (a slot = the Gated DeltaNet's state and the records of its
deferred commit, :mod:`dflash2_trt.trtllm.gdn_slot`: the runtime's ``state_size`` is ``Dk + E``) and
``conv [slots, K - 1, C]`` in the activation dtype. On the CPU the pointer inputs carry the pool's handle (both
the same), which the CPU plugin layer resolves; on a GPU they carry the two tensors' device addresses, which the
plugin's CUDA kernels dereference as TensorRT-LLM's do (:meth:`StatePool.pointer_inputs`).
"""

from __future__ import annotations

import itertools
import threading

import torch

from ..gdn_slot import GdnSlotLayout, gdn_slot_layout


class StatePool:
    _registry: dict[int, "StatePool"] = {}
    _ids = itertools.count(1)
    _lock = threading.Lock()

    def __init__(self, slots: int, layout: GdnSlotLayout, conv_kernel: int, dtype: torch.dtype, device="cpu"):
        self.layout = layout
        self.conv_kernel = int(conv_kernel)
        hk, hv = layout.num_k_heads, layout.num_v_heads
        conv_dim = 2 * hk * layout.head_k_dim + hv * layout.head_v_dim
        self.rnn = torch.zeros(slots, *layout.row_shape, dtype=torch.float32, device=device)
        self.conv = torch.zeros(slots, conv_kernel - 1, conv_dim, dtype=dtype, device=device)
        with StatePool._lock:
            self.handle = next(StatePool._ids)
            StatePool._registry[self.handle] = self

    @classmethod
    def for_linear_attention(cls, slots: int, la: dict, tp: int, max_verify_tokens: int, dtype: torch.dtype,
                             device="cpu") -> "StatePool":
        """One rank's pool from a checkpoint's ``linear_attention`` dict (key heads duplicated below tp, as convert
        does) and the engine's block size (``max_verify_tokens``)."""
        nk, nv = int(la["num_key_heads"]), int(la["num_value_heads"])
        lay = gdn_slot_layout(nk // tp if nk >= tp else 1, nv // tp, la["key_head_dim"], la["value_head_dim"],
                              max_verify_tokens)
        return cls(slots, lay, la["conv_kernel_size"], dtype, device=device)

    @classmethod
    def like(cls, other: "StatePool", slots: int, device="cpu") -> "StatePool":
        """A pool of ``slots`` slots with ``other``'s shapes."""
        return cls(slots, other.layout, other.conv_kernel, other.conv.dtype, device=device)

    def attrs(self) -> dict:
        """The plugin attributes that fix the slot's layout (GdnLib's keyword arguments)."""
        lay = self.layout
        return dict(num_k_heads=lay.num_k_heads, num_v_heads=lay.num_v_heads, head_k_dim=lay.head_k_dim,
                    head_v_dim=lay.head_v_dim, conv_kernel=self.conv_kernel, max_verify_tokens=lay.max_verify_tokens)

    def committed_state(self, slot: int) -> torch.Tensor:
        """The slot's committed state ``[Hv, Dk, Dv]`` (a CPU copy): its state with the pending records of the
        deferred commit folded in, by the plugin's CPU build (the pool is not changed)."""
        from .plugin_libs import gdn_lib

        return gdn_lib().committed_states(self.rnn[slot:slot + 1], **self.attrs())[0]

    @classmethod
    def from_handles(cls, rnn_ptr, conv_ptr) -> "StatePool":
        a, b = int(torch.as_tensor(rnn_ptr).reshape(-1)[0]), int(torch.as_tensor(conv_ptr).reshape(-1)[0])
        if a != b or a not in cls._registry:
            raise ValueError(f"DFlash2GatedDeltaNet: no state pool for handles {a}/{b}")
        return cls._registry[a]

    def reset(self, slot: int) -> None:
        """A request's state at the start of its context: zeros, no records pending (TensorRT-LLM resets a slot on a
        new request)."""
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
