"""A stand-in engine: the network (``trtllm/network/``) executed by the torch stand-in of TensorRT-LLM's API, one
model per simulated TP rank, each with its own paged KV pool, stepping all ranks together. On the ``cpu`` backend
everything is on the CPU and the plugins are their CPU builds; on the ``cuda`` backend the weights, the KV pool, the
recurrent-state slots and every device input are on the GPU, host inputs stay in host memory (as TensorRT binds
them, ``engine_io.yaml`` memory), the pool pointers are real device addresses, and the plugins are their CUDA
kernels. It is not a TensorRT engine: the network's ops run eagerly in torch.

``step(inputs)`` takes the engine inputs by their contract names (``trtllm/engine_io.yaml``) and
returns the marked outputs of rank 0 (every rank computes the same outputs: the logits and the
drafter's ``fc`` are gathered, partial sums all-reduced, and the random inputs are shared), after
checking that every rank agrees on the tokens. The outputs the runtime reads are returned in host memory; the
logits stay where the engine computed them.
"""

from __future__ import annotations

import contextlib
import functools
import math
from pathlib import Path

import torch

from ...config.build import fit_pool_blocks, pool_blocks
from ...errors import ConfigError, MissingDependencyError
from ...trtllm.backend import STANDIN_BACKENDS, cuda_available, cuda_free_bytes, load_network
from ...trtllm.cpu import comm, modeling_utils
from ...trtllm.cpu.attention import KVCachePool
from ...trtllm.cpu.state import StatePool
from ...trtllm.cpu.tensor import network_input, on_device
from ...trtllm.engine_io import load_contract
from ...trtllm.gdn_slot import engine_slot_layout
from ..format import load_engine_dir
from ..binding import bind, layer_windows, static_inputs

def engine_device(backend: str) -> torch.device:
    """Where a stand-in engine of ``backend`` runs: the CPU, or the current CUDA device (one line when none)."""
    if backend not in STANDIN_BACKENDS:
        raise ConfigError(f"backend {backend!r} is not one the project's stand-in runs ({', '.join(STANDIN_BACKENDS)})",
                          field="backend")
    if backend == "cpu":
        return torch.device("cpu")
    if not cuda_available():
        from ...trtllm.cuda.plugin_lib import no_gpu_message

        raise MissingDependencyError(no_gpu_message() + " (a cuda engine builds and runs only on a GPU; on this "
                                     "machine, build with --backend cpu)")
    return torch.device("cuda", torch.cuda.current_device())


class StandinEngine:
    """``weights``: ``"checkpoint"`` (the engine directory's converted checkpoint), ``"random"`` (every parameter
    drawn on the engine's device, no checkpoint read: for timing real widths; its outputs are meaningless), or one
    ``{name: tensor}`` per rank to take the parameters from (shared, not copied: the target-only baseline on the
    combined engine's weights). ``world``: the ranks' collectives (default: every rank a thread of this process,
    :class:`~dflash2_trt.trtllm.cpu.comm.World`); a :class:`~dflash2_trt.trtllm.cpu.comm.ProcessWorld` makes this
    process hold and step only its own rank (the stand-in of one rank engine under ``mpirun``). ``free_memory``: what
    reads a GPU's free bytes when the pool is sized from them (tests play it on the CPU); ``pools_of``: an engine of the
    same pool layout whose KV pool and state slots this one uses instead of its own (:meth:`_share_pools`)."""

    def __init__(self, pretrained_config: dict, checkpoint_dir: str | Path | None, limits: dict, *,
                 num_blocks: int | None = None, backend: str = "cpu", weights: str = "checkpoint", seed: int = 0,
                 world: comm.World | None = None, device=None, free_memory=None, pools_of=None):
        self.backend = backend
        # device: only the capture check's "meta" engine of the cuda backend (engine/standin/capture.py)
        self.device = engine_device(backend) if device is None else torch.device(device)
        if self.device.type == "cuda":
            from ...trtllm.cuda.plugin_lib import cuda_plugin_lib

            cuda_plugin_lib()   # built (or found) and loaded now, not inside the first step
        net = load_network(backend)
        cpu = net.api
        self.net = net
        self.config = dict(pretrained_config)
        self.limits = dict(limits)
        self.tp = int(self.config["mapping"]["tp_size"])
        self.world = world or comm.World(self.tp)
        if self.world.size != self.tp:
            raise ValueError(f"a world of {self.world.size} ranks for a tp {self.tp} engine")
        own = getattr(self.world, "local_rank", None)
        self.local_ranks = list(range(self.tp)) if own is None else [own]
        d = self.config["dflash2"]
        self.K = int(d["block_size"]) - 1
        self.vocab_size = int(self.config["vocab_size"])
        self.mask_token_id = int(d["mask_token_id"])
        kinds = self.config.get("hf_layer_types") or self.config["layer_types"]   # HF names (trtllm/network/kv_layout.py hf_layer_types)
        target_kv_layers = sum(1 for t in kinds if t != "linear_attention")
        # KV layers: the target's attention layers, then the drafter's (model.total_kv_layers)
        self.num_layers = net.total_kv_layers(cpu.PretrainedConfig.from_dict(self.config))
        tpb = int(limits["tokens_per_block"])
        # the pool: num_blocks, the build's num_kv_blocks, else every request at max_seq_len; a cuda engine opened from
        # its directory (limits carry the build's kv_cache_free_gpu_mem_fraction) takes at most that share of the GPU
        # memory free once its weights and state slots are in, as TensorRT-LLM sizes its pool (sized below)
        self.num_blocks = num_blocks or pool_blocks(limits["max_seq_len"], tpb, limits["max_batch_size"],
                                                    limits.get("num_kv_blocks") or 0)
        fraction = limits.get("kv_cache_free_gpu_mem_fraction")
        # free_memory: what reads the free bytes (default on a GPU: CUDA's count, torch's cached blocks given back
        # first); given on the CPU only by tests, which play a GPU's free memory
        fit_to_memory = ((self.device.type == "cuda" or free_memory is not None) and fraction is not None
                         and not num_blocks and not limits.get("num_kv_blocks"))
        self._free_memory = free_memory or cuda_free_bytes
        self.pool_sizing = {"num_kv_blocks": self.num_blocks, "every_request_blocks": pool_blocks(
            limits["max_seq_len"], tpb, limits["max_batch_size"]), "rule": "num_kv_blocks" if (
                num_blocks or limits.get("num_kv_blocks")) else "every request at max_seq_len"}
        dtype = cpu.functional.str_dtype_to_torch(self.config["dtype"])

        model_cls = self.model_class()

        def load(rank):
            cfg = cpu.PretrainedConfig.from_dict(self.config)
            if weights == "checkpoint":
                return model_cls.from_checkpoint(checkpoint_dir, rank, cfg)
            cfg.set_rank(rank)
            model = model_cls(cfg)
            if weights == "random":
                random_weights(model, seed + rank, self.device)
            else:
                names = {n for n, _ in model.named_parameters()}
                model.load({k: v for k, v in weights[rank].items() if k in names})
            return model

        if not (weights in ("checkpoint", "random") or isinstance(weights, (list, tuple))):
            raise ValueError(f"weights {weights!r}: checkpoint, random or one dict per rank")
        with on_device(self.device):
            self.models = self.world.run(load)
        # trtllm-build's first use of the network is its input declaration; the CPU backend opens an engine only
        # if that declaration follows TensorRT-LLM's dim_range and optimization-profile rules (the stand-in's
        # input_tensor / check_profiles), so a declaration TensorRT-LLM would refuse fails here too
        self._declared = self.declare_inputs()
        # the context route: the target's sliding-window layers read the second set of request inputs, which the
        # runtime then feeds (engine_io.yaml sliding_*)
        self.sliding_context = "sliding_host_request_types" in self._declared
        # tp > 1: the custom all-reduce's pointer table (engine_io.yaml), bound once like the runtime's; the simulated
        # collectives do not read it
        self._all_reduce_workspace = torch.zeros(modeling_utils.ALL_REDUCE_POINTERS_PER_RANK * self.tp
                                                 + modeling_utils.ALL_REDUCE_POINTERS_OF_COUNTER, dtype=torch.int64)
        kv_heads = self.config["num_key_value_heads"]
        local_kv = net.local_heads(kv_heads, self.tp)
        self.layer_offset = target_kv_layers   # drafter KV layers follow the target's
        # one block index: its bytes in every pool this process holds
        self.kv_block_bytes = (len(self.local_ranks) * self.num_layers * 2 * local_kv * tpb
                               * int(self.config["head_size"]) * torch.empty((), dtype=dtype).element_size())
        self._pool_mapping = torch.tensor([[0, layer] for layer in range(self.num_layers)], dtype=torch.int32)
        # the runtime fills them once, as TensorRT-LLM's does
        self._window_sizes = layer_windows(net, self.config, int(limits["max_seq_len"]))
        # the largest per-layer window: the runtime's chunk unit depends on it (facts/context_chunking.yaml)
        self.max_attention_window = int(self._window_sizes.max())
        # Recurrent (Gated DeltaNet) layers: one state pool per layer and rank, a slot per request in flight.
        self.gdn_layers = [i for i, t in enumerate(kinds) if t == "linear_attention"]
        self.recurrent = bool(self.gdn_layers)
        self.num_slots = int(limits["max_batch_size"])
        self._device_copies: list[dict] = [{} for _ in range(self.tp)]   # placed_inputs' reuse of unchanged inputs
        # The pools register themselves until released: each is kept as it is made, and an allocation that fails part
        # way (out of GPU memory at a real width) releases the ones made before it, which would otherwise stay for
        # the rest of the process (no engine object to close)
        self.pools: list = []
        self.states: list[dict] = [{} for _ in range(self.tp)]
        self._owns_pools = pools_of is None
        if pools_of is not None:
            self._share_pools(pools_of)
            return
        try:
            if self.recurrent:
                # a slot = the state and the deferred commit's records (trtllm/gdn_slot.py: the plugin's layout)
                lay = engine_slot_layout(self.config)
                conv_kernel = self.config["linear_attention"]["conv_kernel_size"]
                for r in self.local_ranks:
                    for layer in self.gdn_layers:
                        self.states[r][layer] = StatePool(self.num_slots, lay, conv_kernel, dtype, device=self.device)
            if fit_to_memory:
                self.num_blocks = self._fit_pool(float(fraction), self._free_memory(self.device))
            for r in range(self.tp):
                self.pools.append(KVCachePool(self.num_blocks, self.num_layers, local_kv, tpb,
                                              self.config["head_size"], dtype, device=self.device)
                                  if r in self.local_ranks else None)
        except BaseException:
            self.close()
            raise

    def _share_pools(self, other: "StandinEngine") -> None:
        """Take ``other``'s KV pool and state slots instead of allocating them (``pools_of``): ``bench run``'s
        target-only baseline, which steps only while the combined engine does not (one run after the other), so each
        runs with the whole pool, as it would alone; a request's first chunk starts from zero state (zero_state) and
        reads only the blocks it wrote. The layouts must be the same (the target-only network addresses the combined
        one's pool: autoregressive.py); ``other`` releases them."""
        same = (other.num_layers, other.kv_block_bytes, other.num_slots, other.local_ranks, sorted(other.gdn_layers),
                other.device)
        mine = (self.num_layers, self.kv_block_bytes, self.num_slots, self.local_ranks, sorted(self.gdn_layers),
                self.device)
        if same != mine:
            raise ValueError(f"pools of another layout: {same} != {mine}")
        self.pools, self.states, self.num_blocks = other.pools, other.states, other.num_blocks
        self.pool_sizing = {**other.pool_sizing, "shared": True}

    def _fit_pool(self, fraction: float, free: int) -> int:
        """The pool's blocks on a GPU: at most ``fraction`` of ``free`` (the bytes free now, weights and state slots
        in), every local rank's pool counted (:func:`~dflash2_trt.config.build.fit_pool_blocks`); one line when not
        even one request at max_seq_len fits."""
        block_bytes, tpb = self.kv_block_bytes, int(self.limits["tokens_per_block"])
        blocks = fit_pool_blocks(self.num_blocks, free, block_bytes, fraction)
        one = pool_blocks(self.limits["max_seq_len"], tpb, 1)
        self.pool_sizing.update(num_kv_blocks=blocks, rule="free GPU memory", free_bytes=int(free),
                                fraction=fraction, block_bytes=block_bytes)
        if blocks < one:
            # a fraction is named only where it leaves the steps' activations some room (TensorRT-LLM's default
            # leaves them a tenth)
            need = math.ceil(100 * one * block_bytes / free) / 100 if free else math.inf
            how = (f"a fraction of at least {need:g} (build --set kv_cache_free_gpu_mem_fraction=F, or deploy triton "
                   f"--kv-cache-free-gpu-mem-fraction F), " if need <= 0.95 else "")
            slots = f"--max-batch-size (its {self.num_slots} state slots) or " if self.recurrent else ""
            raise ConfigError(f"no room for the KV pool: {fraction:g} of the {free / 2**30:.2f} GiB free once the "
                              f"weights and state slots are in holds {blocks} blocks of {block_bytes / 2**20:.2f} MiB, "
                              f"one request at max_seq_len {self.limits['max_seq_len']} needs {one}: {how}a build with "
                              f"a lower {slots}--max-seq-len, or a GPU with more memory",
                              field="kv_cache_free_gpu_mem_fraction")
        return blocks

    def parameters(self) -> list[dict]:
        """Per rank, ``{name: tensor}`` of the loaded parameters (the tensors themselves, not copies)."""
        return [None if m is None else {n: p.value.as_subclass(torch.Tensor) for n, p in m.named_parameters()}
                for m in self.models]

    def model_class(self):
        """The network class each rank runs (the combined engine; the target-only baseline overrides it)."""
        return self.net.DFlash2ForCausalLM

    def declare_inputs(self) -> dict:
        """Engine input name -> InputDecl of the models' ``prepare_inputs`` (what a step's feed is bound against,
        binding.py), after checking the declaration by TensorRT-LLM's dim_range and profile rules."""
        lim = self.limits
        decl = self.models[self.local_ranks[0]].prepare_inputs(max_batch_size=int(lim["max_batch_size"]),
                                             max_num_tokens=int(lim["max_num_tokens"]),
                                             max_seq_len=int(lim["max_seq_len"]),
                                             tokens_per_block=int(lim["tokens_per_block"]))
        inputs = modeling_utils.declared_inputs(decl)
        modeling_utils.check_profiles(inputs)
        return {d.name: d for d in inputs}

    def close(self) -> None:
        if not getattr(self, "_owns_pools", True):      # another engine's pools (pools_of): it releases them
            return
        for p in self.pools:
            if p is not None:
                p.release()
        for per_rank in self.states:
            for sp in per_rank.values():
                sp.release()

    def reset_slot(self, slot: int) -> None:
        """Zero a state slot on every rank and layer (a request's context starts from the zero state)."""
        for per_rank in self.states:
            for sp in per_rank.values():
                sp.reset(slot)

    def static_inputs(self, rank: int) -> dict:
        """What the runtime fills once, as every execution path builds it (``binding.static_inputs``)."""
        return static_inputs(
            windows=self._window_sizes,
            pool_pointers=torch.tensor([[self.pools[rank].handle, 0]], dtype=torch.int64),
            pool_mapping=self._pool_mapping,
            state_pointers={**{f"rnn_state_ptr_{layer}": sp.pointer_inputs()[0]
                               for layer, sp in self.states[rank].items()},
                            **{f"conv_state_ptr_{layer}": sp.pointer_inputs()[1]
                               for layer, sp in self.states[rank].items()}},
            all_reduce_workspace=self._all_reduce_workspace if self.tp > 1 else None)

    def _structured(self, flat: dict, rank: int) -> dict:
        net = self.net
        # every input as the engine sees it: bound by the runtime, in host or device memory (engine_io.yaml)
        # TensorRT-LLM's runtime binds exactly the engine's inputs, or refuses the step
        f = placed_inputs(bind(self._declared, {**self.static_inputs(rank), **flat}), self.device,
                          self._device_copies[rank])
        K = self.K
        return dict(
            input_ids=f["input_ids"], last_token_ids=f["last_token_ids"],
            kv_cache_params=net.KeyValueCacheParams(
                host_past_key_value_lengths=f["host_past_key_value_lengths"],
                host_max_attention_window_sizes=f["host_max_attention_window_sizes"],
                host_sink_token_length=f["host_sink_token_length"],
                kv_cache_block_offsets=f["kv_cache_block_offsets"],
                host_kv_cache_block_offsets=f["host_kv_cache_block_offsets"],
                host_kv_cache_pool_pointers=f["host_kv_cache_pool_pointers"],
                host_kv_cache_pool_mapping=f["host_kv_cache_pool_mapping"],
                cache_indirection=f["cache_indirection"]),
            attention_params=net.AttentionParams(
                sequence_length=f["sequence_length"], context_lengths=f["context_lengths"],
                host_context_lengths=f["host_context_lengths"], max_context_length=int(self.limits["max_input_len"]),
                host_request_types=f["host_request_types"], host_runtime_perf_knobs=f["host_runtime_perf_knobs"],
                host_context_progress=f["host_context_progress"]),
            spec_decoding_params=net.SpecDecodingParams(
                spec_decoding_is_generation_length_variable=True, spec_decoding_max_generation_length=K + 1,
                spec_decoding_generation_lengths=f["spec_decoding_generation_lengths"],
                spec_decoding_position_offsets=f["spec_decoding_position_offsets"],
                spec_decoding_packed_mask=f["spec_decoding_packed_mask"], spec_decoding_use=f["spec_decoding_use"]),
            draft_lens=f["draft_lens"], eagle_temperature=f["eagle_temperature"],
            rand_data_validation=f["rand_data_validation"], rand_data_sample=f["rand_data_sample"],
            host_gen_eagle_net_request_types=f["host_gen_eagle_net_request_types"],
            **({"recurrent_params": net.RecurrentStateParams(
                slot_mapping=f["slot_mapping"],
                rnn_state_ptr={layer: f[f"rnn_state_ptr_{layer}"] for layer in self.gdn_layers},
                conv_state_ptr={layer: f[f"conv_state_ptr_{layer}"] for layer in self.gdn_layers})}
               if self.recurrent else {}),
            **({"sliding_params": net.SlidingParams(
                host_request_types=f["sliding_host_request_types"], context_lengths=f["sliding_context_lengths"],
                host_context_lengths=f["sliding_host_context_lengths"],
                host_past_key_value_lengths=f["sliding_host_past_key_value_lengths"])}
               if self.sliding_context else {}))

    @torch.no_grad()
    def step(self, inputs: dict) -> dict:
        outs = self.run_step(inputs)
        first, *rest = self.local_ranks
        for r in rest:
            for name in ("accepted_tokens", "num_accepted_tokens"):
                if not torch.equal(outs[first][name], outs[r][name]):
                    raise RuntimeError(f"TP rank {r} disagrees with rank {first} on {name}")
        # what the runtime reads, in host memory (one copy per output, a copy on the CPU too: an output may be a view
        # of a constant the stand-in keeps between steps); the logits stay on the device
        return {k: v if k == "logits" else v.to("cpu", copy=True) for k, v in outs[first].items()}

    @torch.no_grad()
    def run_step(self, inputs: dict) -> list[dict]:
        """Every rank's marked outputs of one step, where the network computed them (no host copy)."""
        gpu = self.device.type == "cuda"

        def run(rank):
            # every rank's thread on the engine's GPU: the plugins' kernels launch on the thread's current device
            with torch.cuda.device(self.device) if gpu else contextlib.nullcontext():
                modeling_utils.begin_outputs()
                self.models[rank](**self._structured(inputs, rank))
                return modeling_utils.outputs()

        with on_device(self.device):
            return self.world.run(run)


def placed_inputs(feed: dict, device, copies: dict | None = None) -> dict:
    """The bound feed as the network receives it: each input a network input in the memory the contract gives it
    (``engine_io.yaml`` memory): host inputs stay in host memory (the per-layer state pointers too), every other
    input goes to the engine's ``device``, as TensorRT places an engine's bindings. ``copies``: name -> (host tensor,
    its version, device copy) of earlier steps; a runtime tensor handed again unchanged (the same object, not written
    since: e.g. ``cache_indirection``) reuses its device copy."""
    out = {}
    for k, v in feed.items():
        where = input_memory(k)
        if where == "host":
            out[k] = network_input(v, k, where)
            continue
        hit = None if copies is None else copies.get(k)
        if hit is not None and hit[0] is v and hit[1] == v._version and hit[2].device == torch.device(device):
            on = hit[2]
        else:
            on = v.to(device, non_blocking=True)
            if copies is not None and torch.device(device).type != "cpu":
                copies[k] = (v, v._version, on)
        out[k] = network_input(on, k, where)
    return out


def input_memory(name: str) -> str:
    """Where the engine reads input ``name``: "host" or "device" (engine_io.yaml memory; the per-layer state pointers
    are host inputs)."""
    return _input_memory().get(name, "host" if name.startswith(("rnn_state_ptr_", "conv_state_ptr_")) else "device")


@functools.lru_cache(maxsize=1)
def _input_memory() -> dict:
    """Engine input name -> "host" | "device", from the contract (engine_io.yaml), read once."""
    return {p.name: p.memory or "device" for p in load_contract()["inputs"]}


def random_weights(model, seed: int, device) -> None:
    """Every parameter of ``model`` drawn on ``device`` (nothing is read or written): matrices ~ N(0, 1/fan_in),
    norm scales 1 (a zero-centred norm's stored weight 0), the Gated DeltaNet's dt_bias / A_log in their usual
    ranges, conv kernels small. The outputs are meaningless; the widths, dtypes and the work per step are real."""
    g = torch.Generator(device=device).manual_seed(int(seed))
    offset_norms = {id(m.weight) for _, m in model.named_modules() if getattr(m, "offset", 0.0)}
    for name, p in model.named_parameters():
        shape, dtype = p.shape, p.dtype
        if len(shape) == 1 and id(p) in offset_norms:
            v = torch.zeros(shape, device=device)
        elif len(shape) == 1 and "norm" in name:
            v = torch.ones(shape, device=device)
        elif name.endswith("A_log"):
            v = torch.rand(shape, generator=g, device=device) * 2.0
        elif name.endswith("dt_bias"):
            v = torch.rand(shape, generator=g, device=device) - 4.0
        elif len(shape) == 1:
            v = torch.randn(shape, generator=g, device=device) * 0.02
        elif name.endswith("conv1d.weight") or name.endswith("base_kernel"):
            v = torch.randn(shape, generator=g, device=device) * 0.1
        else:
            v = torch.randn(shape, generator=g, device=device) * shape[-1] ** -0.5
        p.value = v.to(dtype)


def limits_from(build: dict, config: dict) -> dict:
    K = int(config["dflash2"]["block_size"]) - 1
    lim = {k: int(build[k]) for k in ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens",
                                       "tokens_per_block")}
    if lim["max_num_tokens"] < lim["max_batch_size"] * (K + 1):
        raise ConfigError(f"max_num_tokens {lim['max_num_tokens']} < max_batch_size x (K+1) = "
                          f"{lim['max_batch_size'] * (K + 1)} (trtllm-build's own rule)", field="max_num_tokens")
    lim["num_kv_blocks"] = int(build.get("num_kv_blocks") or 0)
    if build.get("kv_cache_free_gpu_mem_fraction") is not None:   # a cuda engine's (engine/standin/build.py)
        lim["kv_cache_free_gpu_mem_fraction"] = float(build["kv_cache_free_gpu_mem_fraction"])
    return lim


def open_standin_engine(engine_dir, *, verify: bool = False, engine_cls=None, world=None,
                        kv_cache_fraction: float | None = None, weights=None, free_memory=None, pools_of=None):
    """Open a cpu or cuda engine directory (a cuda one needs a CUDA GPU: one-line error without); ``world``: see
    :class:`StandinEngine`. A cuda engine's KV pool takes at most ``kv_cache_fraction`` of the GPU memory free once its
    weights and state slots are in (None: the build's ``kv_cache_free_gpu_mem_fraction``, else 0.9, as the TensorRT
    session's; the build's ``num_kv_blocks``, when set, decides instead); a cpu engine has no fraction. ``weights``: one
    ``{name: tensor}`` per rank to share instead of reading the checkpoint (see :class:`StandinEngine`);
    ``free_memory``, ``pools_of``: see :class:`StandinEngine`."""
    if world is None:
        refuse_multiprocess_launch(engine_dir)   # before any work: each process would do all of it
    cfg, man = load_engine_dir(engine_dir, verify=verify)
    if man["backend"] not in STANDIN_BACKENDS:
        raise ConfigError(f"backend {man['backend']!r}: a TensorRT-LLM engine runs through TensorRT-LLM's runner on a GPU "
                          f"machine (`dflash2-trt run` there, or RUN.md in the engine directory)",
                          source=Path(engine_dir) / "engine.json", field="backend")
    pre = cfg["pretrained_config"]
    build = dict(cfg["build_config"])
    if man["backend"] == "cuda":
        fraction = build.get("kv_cache_free_gpu_mem_fraction", 0.9) if kv_cache_fraction is None else kv_cache_fraction
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction < 1:
            raise ConfigError(f"must be a number in (0, 1) (as TensorRT-LLM's), got {fraction!r}",
                              **({"source": Path(engine_dir) / "config.json",
                                  "field": "build_config.kv_cache_free_gpu_mem_fraction"} if kv_cache_fraction is None
                                 else {"field": "kv_cache_free_gpu_mem_fraction"}))
        build["kv_cache_free_gpu_mem_fraction"] = fraction
    elif kv_cache_fraction is not None:
        raise ConfigError(f"applies to GPU engines (a cuda engine's or a TensorRT session's KV pool); this is a "
                          f"{man['backend']} engine, whose pool holds every request at max_seq_len",
                          field="kv_cache_free_gpu_mem_fraction")
    return (engine_cls or StandinEngine)(pre, Path(engine_dir) / "checkpoint", limits_from(build, pre),
                                         backend=man["backend"], world=world, free_memory=free_memory,
                                         pools_of=pools_of,
                                         weights="checkpoint" if weights is None else weights), man


def refuse_multiprocess_launch(engine_dir) -> None:
    """A cpu or cuda engine runs every tp rank in one process: started as one of several processes by an MPI launcher
    (``mpirun -n 2 dflash2-trt run``), each process would run the whole engine and print the same report (a new user
    did). One line instead; an unreadable launcher variable counts as no launch (it never mattered to these engines)."""
    from ..format import engine_backend
    from ..launch import several_processes

    size = several_processes()
    backend = engine_backend(engine_dir) if size else None
    if size and backend in STANDIN_BACKENDS:
        raise ConfigError(f"a {backend} engine runs in one process (its tp ranks, if any, all in it); this is one of "
                          f"{size} processes an MPI launcher started: run it without mpirun (one process per rank is "
                          f"for TensorRT engines)", source=engine_dir)
