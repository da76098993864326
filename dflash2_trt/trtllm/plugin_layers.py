"""The DFlash2 plugin layers, as the network calls them, for both backends.

``dynamic_conv`` = plugin ``DFlash2DynamicConv`` and ``pairwise_scan`` = ``DFlash2PairwiseScan``
(attributes, dtypes and shapes: ``plugins/*/…Plugin.yaml``, read by :mod:`dflash2_trt.plugins`).

- :class:`TrtPlugins` adds them to the TensorRT network being built (IPluginV3 through
  ``default_trtnet().add_plugin_v3``; the plugin library must be loaded first — the model class
  file does it with :func:`dflash2_trt.plugins.load_library`).
- :class:`CpuPlugins` runs the plugins' CPU builds (``plugins/*/…Cpu.cpp``, the same math headers
  as the CUDA kernels, bit-exact against the torch reference in tests/plugins).
"""

from __future__ import annotations


class CpuPlugins:
    name = "cpu"

    def dynamic_conv(self, x, delta, base_kernel, *, block_size: int, kernel_size: int, group_size: int,
                     residual=None):
        from .cpu.plugin_libs import conv_lib

        return conv_lib().run(x, delta, base_kernel, block_size=block_size, group_size=group_size,
                              residual=residual, kernel_size=kernel_size)

    def pairwise_scan(self, unary, cand_ids, proj_hidden, anchor, pred_codebook, succ_codebook, temperature,
                      uniforms, *, mode: str):
        from .cpu.plugin_libs import scan_lib

        _, _, ids, q = scan_lib().run(mode, unary, cand_ids, proj_hidden, anchor, pred_codebook, succ_codebook,
                                      temperature, uniforms)
        return ids.to(cand_ids.dtype), q


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
