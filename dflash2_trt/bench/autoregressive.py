"""The autoregressive baseline on the CPU backend: the target alone, same stand-in, same runtime.

:class:`TargetOnlyCpuEngine` is :class:`~dflash2_trt.engine.cpu.engine.CpuEngine` with the network's
``TargetOnlyForCausalLM`` (``trtllm/network/target_only.py``, from ``load_network("cpu")``) instead of the
combined engine's: it loads the target's tensors of the same engine directory's checkpoint (the drafter's are
dropped) and reports ``K = 0``. The stock
:class:`~dflash2_trt.runtime.Runtime` then drives it unchanged: with no draft slots every generation
step feeds one token per request and emits one — plain autoregressive decoding, batched the same way
(in-flight batching, paged KV cache).
"""

from __future__ import annotations

from pathlib import Path

from ..engine.cpu.engine import CpuEngine, limits_from
from ..engine.format import load_engine_dir
from ..trtllm.backend import load_network


class TargetOnlyCpuEngine(CpuEngine):
    """The target of a CPU engine directory, alone (see the module docstring).

    Built as the combined :class:`CpuEngine` is (same KV pool layout, state slots, static inputs and input
    structuring: whatever the runtime relies on stays the combined engine's), then its per-rank models are
    the target-only network's and ``K`` is 0. The target's layers are the pool's first KV layers in both
    networks (``layer_idx``), so the target-only network addresses the pool exactly as the combined one
    does; the drafter's layer slots stay unused."""

    def __init__(self, pretrained_config: dict, checkpoint_dir: str | Path, limits: dict, *,
                 num_blocks: int | None = None):
        super().__init__(pretrained_config, checkpoint_dir, limits, num_blocks=num_blocks)
        net = load_network("cpu")
        api = net.api

        def load(rank):
            cfg = api.PretrainedConfig.from_dict(self.config)
            return net.TargetOnlyForCausalLM.from_checkpoint(checkpoint_dir, rank, cfg)

        self.models = self.world.run(load)
        self.K = 0
        self._declared = self.declare_inputs()   # the target-only network's own inputs (K = 0), bound every step


def open_target_only_engine(engine_dir) -> TargetOnlyCpuEngine:
    """The target alone of a CPU engine directory (checked as ``open_cpu_engine`` checks it)."""
    cfg, _ = load_engine_dir(engine_dir)
    pre = cfg["pretrained_config"]
    return TargetOnlyCpuEngine(pre, Path(engine_dir) / "checkpoint", limits_from(cfg["build_config"], pre))
