"""The DFlash2 plugin layers, as the network calls them, for both backends.

``dynamic_conv`` = plugin ``DFlash2DynamicConv`` and ``pairwise_scan`` = ``DFlash2PairwiseScan``
(attributes, dtypes and shapes: ``plugins/*/…Plugin.yaml``, read by :mod:`dflash2_trt.plugins`).

- :class:`TrtPlugins` adds them to the TensorRT network being built (IPluginV3 through
  ``default_trtnet().add_plugin_v3``; the plugin library must be loaded first — the model class
  file does it with :func:`dflash2_trt.plugins.load_library`).
- :class:`CpuPlugins` runs the plugins' CPU builds (``plugins/*/…Cpu.cpp``, the same math headers
  as the CUDA kernels, bit-exact against the torch reference in tests/plugins).
- :class:`CudaPlugins` runs the plugins' CUDA kernels (the sources of ``libdflash2_plugins.so``, built by
  :mod:`dflash2_trt.trtllm.cuda.plugin_lib` with a C ABI that does each plugin's enqueue) on the cuda backend.
"""

from __future__ import annotations

import torch


def _io(fn):
    """Plugin layers take the stand-in's Tensors and return layer outputs (device Tensors), as a TensorRT plugin
    layer does; the CPU builds work on plain torch tensors."""
    import functools

    from .cpu.tensor import raw, wrap

    @functools.wraps(fn)
    def f(self, *args, **kwargs):
        out = fn(self, *(raw(a) for a in args), **{k: raw(v) for k, v in kwargs.items()})
        return tuple(wrap(o) for o in out) if isinstance(out, tuple) else wrap(out)
    return f


class CpuPlugins:
    name = "cpu"

    @_io
    def dynamic_conv(self, x, delta, base_kernel, *, block_size: int, kernel_size: int, group_size: int,
                     residual=None):
        from .cpu.plugin_libs import conv_lib

        return conv_lib().run(x, delta, base_kernel, block_size=block_size, group_size=group_size,
                              residual=residual, kernel_size=kernel_size)

    @_io
    def pairwise_scan(self, unary, cand_ids, proj_hidden, anchor, pred_codebook, succ_codebook, temperature,
                      uniforms, *, mode: str):
        from .cpu.plugin_libs import scan_lib

        _, _, ids, q = scan_lib().run(mode, unary, cand_ids, proj_hidden, anchor, pred_codebook, succ_codebook,
                                      temperature, uniforms)
        return ids.to(cand_ids.dtype), q


    # DFlash2GatedDeltaNet: the state pools are the runtime's; the pointer inputs hold handles of
    # :class:`dflash2_trt.trtllm.cpu.state.StatePool` (TensorRT-LLM: device addresses).
    @_io
    def gated_delta_net(self, qkv, conv_weight, a, b, dt_bias, A_log, cu_seqlens, slot_mapping, host_request_types,
                        rnn_state_ptr, conv_state_ptr, zero_state=None, **attrs):
        from .cpu.plugin_libs import gdn_lib
        from .cpu.state import StatePool

        pool = StatePool.from_handles(rnn_state_ptr, conv_state_ptr)
        return gdn_lib().forward(qkv, conv_weight, a, b, dt_bias, A_log, cu_seqlens.to(torch.int32),
                                 slot_mapping.to(torch.int32), host_request_types.to(torch.int32), pool.rnn, pool.conv,
                                 zero_state=None if zero_state is None else zero_state.to(torch.int32), **attrs)

    @_io
    def gated_delta_net_commit(self, verify_qkv, verify_gates, conv_weight, num_accepted, cu_seqlens, slot_mapping,
                               host_request_types, rnn_state_ptr, conv_state_ptr, **attrs):
        from .cpu.plugin_libs import gdn_lib
        from .cpu.state import StatePool

        pool = StatePool.from_handles(rnn_state_ptr, conv_state_ptr)
        return gdn_lib().commit(verify_qkv, verify_gates, conv_weight, num_accepted.to(torch.int32),
                                cu_seqlens.to(torch.int32), slot_mapping.to(torch.int32),
                                host_request_types.to(torch.int32), pool.rnn, pool.conv, **attrs)


def _on(t, device):
    """A plugin input where the plugin reads it: a host input in host memory, a device input on ``device`` (what
    TensorRT arranges for a plugin's declared inputs)."""
    return t if t.device == device else t.to(device)


class CudaPlugins:
    """The plugins' CUDA kernels on the cuda backend; inputs and outputs are CUDA tensors, except the inputs the
    plugins' specs put in host memory (the Gated DeltaNet's host_request_types and its two pool addresses, the
    device addresses of the runtime's state pools)."""

    name = "cuda"

    def __init__(self):
        self._libs: dict = {}

    def _lib(self, device=None):
        """The CUDA build for ``device``'s architecture, looked up once per device (on the ``meta`` device of the
        capture check, the library's Python side without kernels: ``ShapeOnlyPluginLib``)."""
        key = None if device is None else (device.type, device.index)
        lib = self._libs.get(key)
        if lib is None:
            from .cuda.plugin_lib import ShapeOnlyPluginLib, cuda_plugin_lib, device_arch

            lib = self._libs[key] = ShapeOnlyPluginLib() if device is not None and device.type == "meta" else \
                cuda_plugin_lib(device_arch(device))
        return lib

    @_io
    def dynamic_conv(self, x, delta, base_kernel, *, block_size: int, kernel_size: int, group_size: int,
                     residual=None):
        dev = x.device
        return self._lib(dev).conv(x, _on(delta, dev), _on(base_kernel, dev),
                                None if residual is None else _on(residual, dev), block_size=block_size,
                                group_size=group_size, kernel_size=kernel_size)

    @_io
    def pairwise_scan(self, unary, cand_ids, proj_hidden, anchor, pred_codebook, succ_codebook, temperature,
                      uniforms, *, mode: str):
        dev = unary.device
        ids, q = self._lib(dev).scan(mode, *(_on(t, dev) for t in (
            unary, cand_ids.to(torch.int32), proj_hidden, anchor.to(torch.int32), pred_codebook, succ_codebook,
            temperature, uniforms)))
        return ids.to(cand_ids.dtype), q

    @_io
    def gated_delta_net(self, qkv, conv_weight, a, b, dt_bias, A_log, cu_seqlens, slot_mapping, host_request_types,
                        rnn_state_ptr, conv_state_ptr, zero_state=None, **attrs):
        dev, cpu = qkv.device, torch.device("cpu")
        ins = [qkv, *(_on(t, dev) for t in (conv_weight, a, b, dt_bias, A_log, cu_seqlens.to(torch.int32),
                                            slot_mapping.to(torch.int32))),
               _on(host_request_types.to(torch.int32), cpu), _on(rnn_state_ptr, cpu), _on(conv_state_ptr, cpu)]
        if zero_state is not None:
            ins.append(_on(zero_state.to(torch.int32), dev))
        return self._lib(dev).gdn("forward", ins, **attrs)

    @_io
    def gated_delta_net_commit(self, verify_qkv, verify_gates, conv_weight, num_accepted, cu_seqlens, slot_mapping,
                               host_request_types, rnn_state_ptr, conv_state_ptr, **attrs):
        dev, cpu = verify_qkv.device, torch.device("cpu")
        ins = [verify_qkv, *(_on(t, dev) for t in (verify_gates, conv_weight, num_accepted.to(torch.int32),
                                                   cu_seqlens.to(torch.int32), slot_mapping.to(torch.int32))),
               _on(host_request_types.to(torch.int32), cpu), _on(rnn_state_ptr, cpu), _on(conv_state_ptr, cpu)]
        return self._lib(dev).gdn("commit", ins, **attrs)[0]


class TrtPlugins:  # pragma: no cover - needs TensorRT-LLM (GPU machines)
    name = "trtllm"

    @staticmethod
    def _add(name, layer_name, inputs, n_out, **attrs):
        from tensorrt_llm._common import default_trtnet
        from tensorrt_llm.functional import _create_tensor

        from ..plugins import create_trt_plugin

        plugin = create_trt_plugin(name, layer_name, **attrs)
        layer = default_trtnet().add_plugin_v3([t.trt_tensor for t in inputs], [], plugin)
        return [_create_tensor(layer.get_output(i), layer) for i in range(n_out)]

    def dynamic_conv(self, x, delta, base_kernel, *, block_size: int, kernel_size: int, group_size: int,
                     residual=None):
        ins = [x, delta, base_kernel] + ([residual] if residual is not None else [])
        return self._add("DFlash2DynamicConv", "dflash2_dynamic_conv", ins, 1, block_size=block_size,
                         kernel_size=kernel_size, group_size=group_size,
                         fuse_residual=int(residual is not None))[0]

    def pairwise_scan(self, unary, cand_ids, proj_hidden, anchor, pred_codebook, succ_codebook, temperature,
                      uniforms, *, mode: str):
        ids, q = self._add("DFlash2PairwiseScan", "dflash2_pairwise_scan",
                           [unary, cand_ids, proj_hidden, anchor, pred_codebook, succ_codebook, temperature,
                            uniforms], 2, mode=mode)
        return ids, q

    def gated_delta_net(self, qkv, conv_weight, a, b, dt_bias, A_log, cu_seqlens, slot_mapping, host_request_types,
                        rnn_state_ptr, conv_state_ptr, zero_state=None, **attrs):
        ins = [qkv, conv_weight, a, b, dt_bias, A_log, cu_seqlens, slot_mapping, host_request_types, rnn_state_ptr,
               conv_state_ptr] + ([zero_state] if zero_state is not None else [])
        return self._add("DFlash2GatedDeltaNet", "dflash2_gated_delta_net", ins, 3, mode="forward",
                         zero_state_input=int(zero_state is not None), **attrs)

    def gated_delta_net_commit(self, verify_qkv, verify_gates, conv_weight, num_accepted, cu_seqlens, slot_mapping,
                               host_request_types, rnn_state_ptr, conv_state_ptr, **attrs):
        return self._add("DFlash2GatedDeltaNet", "dflash2_gated_delta_net_commit",
                         [verify_qkv, verify_gates, conv_weight, num_accepted, cu_seqlens, slot_mapping,
                          host_request_types, rnn_state_ptr, conv_state_ptr], 1, mode="commit", **attrs)[0]
