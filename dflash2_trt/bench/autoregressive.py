"""The autoregressive baseline on the stand-in backends (cpu, cuda): the target alone, same stand-in, same runtime.

:class:`TargetOnlyEngine` is :class:`~dflash2_trt.engine.standin.engine.StandinEngine` with the network's
``TargetOnlyForCausalLM`` (``trtllm/network/target_only.py``, from the engine's network package) instead of the
combined engine's: it loads the target's tensors of the same engine directory's checkpoint (the drafter's are
dropped) and reports ``K = 0``. The stock
:class:`~dflash2_trt.runtime.Runtime` then drives it unchanged: with no draft slots every generation
step feeds one token per request and emits one — plain autoregressive decoding, batched the same way
(in-flight batching, paged KV cache).
"""

from __future__ import annotations

from pathlib import Path

from ..engine.standin.engine import StandinEngine, open_standin_engine


class TargetOnlyEngine(StandinEngine):
    """The target of a stand-in engine directory, alone (see the module docstring).

    Built as the combined :class:`StandinEngine` is (same KV pool layout, state slots, static inputs and input
    structuring: whatever the runtime relies on stays the combined engine's), with the target-only network's
    class on every rank and ``K`` 0. The target's layers are the pool's first KV layers in both networks
    (``layer_idx``), so the target-only network addresses the pool exactly as the combined one does; the
    drafter's layer slots stay unused."""

    def __init__(self, pretrained_config: dict, checkpoint_dir: str | Path | None, limits: dict, **kw):
        super().__init__(pretrained_config, checkpoint_dir, limits, **kw)   # inputs declared by the target-only class
        self.K = 0

    def model_class(self):
        return self.net.TargetOnlyForCausalLM


def open_target_only_engine(engine_dir, **kw) -> TargetOnlyEngine:
    """The target alone of a cpu or cuda engine directory (checked as ``open_standin_engine`` checks it); ``kw``:
    :func:`~dflash2_trt.engine.standin.engine.open_standin_engine`'s (``weights``: the combined engine's, shared)."""
    return open_standin_engine(engine_dir, engine_cls=TargetOnlyEngine, **kw)[0]
