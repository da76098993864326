"""The autoregressive baseline on the CPU backend: the target alone, same stand-in, same runtime.

:class:`TargetOnlyCpuEngine` is :class:`~dflash2_trt.engine.cpu.CpuEngine` with the network
``trtllm/target_only.py`` instead of the combined engine's: it loads the target's tensors of the
same engine directory's checkpoint (the drafter's are dropped), allocates a KV pool for the target
layers only, and reports ``K = 0``. The stock :class:`~dflash2_trt.runtime.Runtime` then drives it
unchanged: with no draft slots every generation step feeds one token per request and emits one —
plain autoregressive decoding, batched the same way (in-flight batching, paged KV cache).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from ..engine.cpu import CpuEngine

TARGET_ONLY_FILE = Path(__file__).resolve().parents[1] / "trtllm" / "target_only.py"


def load_target_only_network(backend: str = "cpu") -> ModuleType:
    """A fresh instance of ``trtllm/target_only.py`` bound to ``backend`` (as ``backend.load_network``
    does for ``model.py``)."""
    from ..trtllm import backend as _backend

    name = f"dflash2_trt_target_only_{_backend.resolve(backend)}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, TARGET_ONLY_FILE)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        with _backend.using(backend):
            spec.loader.exec_module(mod)
    except BaseException:
        del sys.modules[name]
        raise
    return mod


class TargetOnlyCpuEngine(CpuEngine):
    """The target of a CPU engine directory, alone (see the module docstring)."""

    def __init__(self, pretrained_config: dict, checkpoint_dir: str | Path, limits: dict, *,
                 num_blocks: int | None = None):
        # CpuEngine.__init__ builds the combined network; this one builds the target-only network and
        # reuses CpuEngine's input structuring (_structured), static inputs, step and close.
        from ..trtllm.cpu import comm
        from ..trtllm.cpu.attention import KVCachePool

        net = load_target_only_network("cpu")
        cpu = net.api
        self.net = net
        self.config = dict(pretrained_config)
        self.limits = dict(limits)
        self.tp = int(self.config["mapping"]["tp_size"])
        self.world = comm.World(self.tp)
        self.K = 0
        self.vocab_size = int(self.config["vocab_size"])
        self.num_layers = int(self.config["num_hidden_layers"])
        tpb = int(limits["tokens_per_block"])
        per_seq = -(-int(limits["max_seq_len"]) // tpb)
        self.num_blocks = num_blocks or int(limits.get("num_kv_blocks") or per_seq * int(limits["max_batch_size"]))
        dtype = cpu.functional.str_dtype_to_torch(self.config["dtype"])

        def load(rank):
            cfg = cpu.PretrainedConfig.from_dict(self.config)
            return net.TargetOnlyForCausalLM.from_checkpoint(checkpoint_dir, rank, cfg)

        self.models = self.world.run(load)
        kv_heads = self.config["num_key_value_heads"]
        local_kv = kv_heads // self.tp if kv_heads >= self.tp else 1
        self.pools = [KVCachePool(self.num_blocks, self.num_layers, local_kv, tpb, self.config["head_size"], dtype)
                      for _ in range(self.tp)]
        self.layer_offset = self.num_layers
        import torch

        self._pool_mapping = torch.tensor([[0, layer] for layer in range(self.num_layers)], dtype=torch.int32)


def open_target_only_engine(engine_dir) -> TargetOnlyCpuEngine:
    """The target alone of a CPU engine directory (checked as ``open_cpu_engine`` checks it)."""
    from ..engine.build import load_engine_dir
    from ..engine.cpu import limits_from

    cfg, _ = load_engine_dir(engine_dir)
    pre = cfg["pretrained_config"]
    return TargetOnlyCpuEngine(pre, Path(engine_dir) / "checkpoint", limits_from(cfg["build_config"], pre))
