"""A CPU engine: the network (``trtllm/network/``) executed by the CPU stand-in, one model per
simulated TP rank, each with its own paged KV pool, stepping all ranks together.

``step(inputs)`` takes the engine inputs by their contract names (``trtllm/engine_io.yaml``) and
returns the marked outputs of rank 0 (every rank computes the same outputs: the logits and the
drafter's ``fc`` are gathered, partial sums all-reduced, and the random inputs are shared), after
checking that every rank agrees on the tokens.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from ...errors import ConfigError
from ...trtllm.cpu import comm, modeling_utils
from ...trtllm.cpu.attention import KVCachePool
from ...trtllm.cpu.state import StatePool
from ...trtllm.cpu.tensor import network_input
from ...trtllm.engine_io import load_contract
from ..format import load_engine_dir
from .binding import bind
from ...trtllm.backend import load_network

# The runtime's per-layer tensors that are the same every step (TensorRT-LLM's runtime also fills them once).
_STATIC = ("host_max_attention_window_sizes", "host_sink_token_length", "host_kv_cache_pool_pointers",
           "host_kv_cache_pool_mapping", "host_runtime_perf_knobs", "host_context_progress")


class CpuEngine:
    def __init__(self, pretrained_config: dict, checkpoint_dir: str | Path, limits: dict, *, num_blocks: int | None = None):
        net = load_network("cpu")
        cpu = net.api
        self.net = net
        self.config = dict(pretrained_config)
        self.limits = dict(limits)
        self.tp = int(self.config["mapping"]["tp_size"])
        self.world = comm.World(self.tp)
        d = self.config["dflash2"]
        self.K = int(d["block_size"]) - 1
        self.vocab_size = int(self.config["vocab_size"])
        self.mask_token_id = int(d["mask_token_id"])
        kinds = self.config.get("hf_layer_types") or self.config["layer_types"]   # HF names (trtllm/network/kv_layout.py hf_layer_types)
        target_kv_layers = sum(1 for t in kinds if t != "linear_attention")
        # KV layers: the target's attention layers, then the drafter's (model.total_kv_layers)
        self.num_layers = net.total_kv_layers(cpu.PretrainedConfig.from_dict(self.config))
        tpb = int(limits["tokens_per_block"])
        per_seq = -(-int(limits["max_seq_len"]) // tpb)
        self.num_blocks = num_blocks or int(limits.get("num_kv_blocks") or per_seq * int(limits["max_batch_size"]))
        dtype = cpu.functional.str_dtype_to_torch(self.config["dtype"])

        def load(rank):
            cfg = cpu.PretrainedConfig.from_dict(self.config)
            return net.DFlash2ForCausalLM.from_checkpoint(checkpoint_dir, rank, cfg)

        self.models = self.world.run(load)
        # trtllm-build's first use of the network is its input declaration; the CPU backend opens an engine only
        # if that declaration follows TensorRT-LLM's dim_range and optimization-profile rules (the stand-in's
        # input_tensor / check_profiles), so a declaration TensorRT-LLM would refuse fails here too
        self._declared = self.declare_inputs()
        # tp > 1: the custom all-reduce's pointer table (engine_io.yaml), bound once like the runtime's; the simulated
        # collectives do not read it
        self._all_reduce_workspace = torch.zeros(modeling_utils.ALL_REDUCE_POINTERS_PER_RANK * self.tp
                                                 + modeling_utils.ALL_REDUCE_POINTERS_OF_COUNTER, dtype=torch.int64)
        kv_heads = self.config["num_key_value_heads"]
        local_kv = kv_heads // self.tp if kv_heads >= self.tp else 1
        self.pools = [KVCachePool(self.num_blocks, self.num_layers, local_kv, tpb, self.config["head_size"], dtype)
                      for _ in range(self.tp)]
        self.layer_offset = target_kv_layers   # drafter KV layers follow the target's
        self._pool_mapping = torch.tensor([[0, layer] for layer in range(self.num_layers)], dtype=torch.int32)
        self._window_sizes = self._windows()      # the runtime fills them once, as TensorRT-LLM's does
        # Recurrent (Gated DeltaNet) layers: one state pool per layer and rank, a slot per request in flight.
        self.gdn_layers = [i for i, t in enumerate(kinds) if t == "linear_attention"]
        self.recurrent = bool(self.gdn_layers)
        self.num_slots = int(limits["max_batch_size"])
        self.states: list[dict] = [{} for _ in range(self.tp)]
        if self.recurrent:
            la = self.config["linear_attention"]
            nk = la["num_key_heads"] // self.tp if la["num_key_heads"] >= self.tp else 1
            nv = la["num_value_heads"] // self.tp
            conv_dim = 2 * nk * la["key_head_dim"] + nv * la["value_head_dim"]
            for r in range(self.tp):
                for layer in self.gdn_layers:
                    self.states[r][layer] = StatePool(self.num_slots, nv, la["key_head_dim"], la["value_head_dim"],
                                                      la["conv_kernel_size"], conv_dim, dtype)

    def declare_inputs(self) -> dict:
        """Engine input name -> InputDecl of the models' ``prepare_inputs`` (what a step's feed is bound against,
        binding.py), after checking the declaration by TensorRT-LLM's dim_range and profile rules."""
        lim = self.limits
        decl = self.models[0].prepare_inputs(max_batch_size=int(lim["max_batch_size"]),
                                             max_num_tokens=int(lim["max_num_tokens"]),
                                             max_seq_len=int(lim["max_seq_len"]),
                                             tokens_per_block=int(lim["tokens_per_block"]))
        inputs = modeling_utils.declared_inputs(decl)
        modeling_utils.check_profiles(inputs)
        return {d.name: d for d in inputs}

    def close(self) -> None:
        for p in self.pools:
            p.release()
        for per_rank in self.states:
            for sp in per_rank.values():
                sp.release()

    def reset_slot(self, slot: int) -> None:
        """Zero a state slot on every rank and layer (a request's context starts from the zero state)."""
        for per_rank in self.states:
            for sp in per_rank.values():
                sp.reset(slot)

    def _windows(self) -> torch.Tensor:
        """The runtime's per-KV-layer attention window (model.kv_layer_windows: TensorRT-LLM's executor
        max_attention_window list): max_seq_len, or a sliding layer's own window (the drafter's with
        drafter_window model, Muse Glimmer's sliding layers). The plugin reads it on the host, so the graph cannot
        make it."""
        cfg = self.net.api.PretrainedConfig.from_dict(self.config)
        eng = self.config.get("dflash2_engine") or {}
        w = self.net.kv_layer_windows(cfg, eng.get("drafter_window", "model"), int(self.limits["max_seq_len"]))
        return torch.tensor(w, dtype=torch.int32)

    def static_inputs(self, rank: int) -> dict:
        return {
            "host_max_attention_window_sizes": self._window_sizes,
            "host_sink_token_length": torch.zeros(1, dtype=torch.int32),
            "host_kv_cache_pool_pointers": torch.tensor([[self.pools[rank].handle, 0]], dtype=torch.int64),
            "host_kv_cache_pool_mapping": self._pool_mapping,
            "host_runtime_perf_knobs": torch.zeros(16, dtype=torch.int64),
            "host_context_progress": torch.zeros(1, dtype=torch.int64),
            **{f"rnn_state_ptr_{layer}": sp.handle_tensor() for layer, sp in self.states[rank].items()},
            **{f"conv_state_ptr_{layer}": sp.handle_tensor() for layer, sp in self.states[rank].items()},
            **({"all_reduce_workspace": self._all_reduce_workspace} if self.tp > 1 else {}),
        }

    def _structured(self, flat: dict, rank: int) -> dict:
        net = self.net
        memory = _input_memory()
        # every input as the engine sees it: bound by the runtime, in host or device memory (engine_io.yaml)
        # TensorRT-LLM's runtime binds exactly the engine's inputs, or refuses the step
        feed = bind(self._declared, {**self.static_inputs(rank), **flat})
        f = {k: network_input(v, k, memory.get(k, "host" if k.startswith(("rnn_state_ptr_", "conv_state_ptr_"))
                                                 else "device"))
             for k, v in feed.items()}
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
               if self.recurrent else {}))

    @torch.no_grad()
    def step(self, inputs: dict) -> dict:
        def run(rank):
            modeling_utils.begin_outputs()
            self.models[rank](**self._structured(inputs, rank))
            return modeling_utils.outputs()

        outs = self.world.run(run)
        for r in range(1, self.tp):
            for name in ("accepted_tokens", "num_accepted_tokens"):
                if not torch.equal(outs[0][name], outs[r][name]):
                    raise RuntimeError(f"TP rank {r} disagrees with rank 0 on {name}")
        return outs[0]


@functools.lru_cache(maxsize=1)
def _input_memory() -> dict:
    """Engine input name -> "host" | "device", from the contract (engine_io.yaml), read once."""
    return {p.name: p.memory or "device" for p in load_contract()["inputs"]}


def limits_from(build: dict, config: dict) -> dict:
    K = int(config["dflash2"]["block_size"]) - 1
    lim = {k: int(build[k]) for k in ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens",
                                       "tokens_per_block")}
    if lim["max_num_tokens"] < lim["max_batch_size"] * (K + 1):
        raise ConfigError(f"max_num_tokens {lim['max_num_tokens']} < max_batch_size x (K+1) = "
                          f"{lim['max_batch_size'] * (K + 1)} (trtllm-build's own rule)", field="max_num_tokens")
    lim["num_kv_blocks"] = int(build.get("num_kv_blocks") or 0)
    return lim


def open_cpu_engine(engine_dir, *, verify: bool = False):
    cfg, man = load_engine_dir(engine_dir, verify=verify)
    if man["backend"] != "cpu":
        raise ConfigError(f"backend {man['backend']!r}: a TensorRT-LLM engine runs through TensorRT-LLM's runner on a GPU "
                          f"machine (`dflash2-trt run` there, or RUN.md in the engine directory)",
                          source=Path(engine_dir) / "engine.json", field="backend")
    pre = cfg["pretrained_config"]
    return CpuEngine(pre, Path(engine_dir) / "checkpoint", limits_from(cfg["build_config"], pre)), man
