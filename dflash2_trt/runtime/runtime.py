"""The CPU runtime: plays TensorRT-LLM's runtime (executor + in-flight batch manager) for a CPU engine.

What it does per step, as ``batch_manager/trtGptModelInflightBatching.cpp`` and the EAGLE decoder
(``layers/eagleDecodingLayer.cpp``) do for an EAGLE-mode engine (docs/TRTLLM-ENGINE.md §1):

- schedule, as the batch manager's two schedulers do: the capacity scheduler admits waiting requests FIFO
  while the batch holds fewer than ``max_batch_size`` requests, the KV pool has blocks for the request's
  lifetime and (recurrent targets) a state slot is free; the micro-batch scheduler then gives every
  request already generating its K + 1 tokens and each admitted request whose prompt is not all in a
  chunk of it from what is left of ``max_num_tokens``: chunked context with the default
  first-come-first-served policy (``engine/trtllm/facts/context_chunking.yaml``): the rest of the prompt
  when it fits, else the tokens left rounded down to a multiple of the chunk unit (tokens per block); a
  request whose chunk comes out 0 waits for a later step, and the requests after it still get theirs.
  Context requests are packed before generation requests, those not at their last chunk first; only a
  request's last chunk emits (its first token), and only it draws random data, so where a prompt is cut
  does not move the request's random stream (its tokens are the same up to the floating-point
  differences of a computation done in other pieces). Without chunking (``chunked_context=False``, or an
  engine built without paged context FMHA) a prompt is taken whole, and the first one that does not fit
  ends the step's scheduling, as the batch manager's loop ends there;
- inputs: ``input_ids`` = the prompt chunk (context) or ``[last token] + next_draft_tokens`` (generation:
  the engine's placeholders fed back), positions and the chain's packed mask from
  ``next_draft_paths``, sequence/past lengths, block offsets, per-request temperature and the
  random data (``rand_data_validation [bs, K+1]``, ``rand_data_sample [bs]``) drawn from a
  generator seeded by the request's seed;
- bookkeeping from the outputs: the accepted tokens are emitted (``seqLen += num_accepted_tokens``),
  cut at a stop token or ``max_new_tokens``; the next generation length is ``next_draft_lens + 1``;
  a finished request's blocks are freed.

Acceptance statistics per request: tokens the engine accepted per generation step
(``acceptance_lengths``: ``num_accepted_tokens``, the same quantity as the reference loop's), their
histogram and mean. A request's last step may accept more than it emits (cut at a stop token or
``max_new_tokens``); the acceptance length counts what the draft earned, not what was kept.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import torch

from ..chunking import CHUNKED_CONTEXT_ENV, chunked_context_default
from ..errors import ConfigError
from ..sampling import effective_temperature, request_temperature
from .kv_cache import BlockManager

CONTEXT, GENERATION = 0, 1


@dataclass
class Request:
    prompt_ids: list[int]
    max_new_tokens: int
    temperature: float = 0.0
    seed: int = 0
    stop_token_ids: tuple[int, ...] = ()
    task_id: object = None
    # state
    req_id: int = -1
    output_ids: list[int] = field(default_factory=list)
    acceptance_lengths: list[int] = field(default_factory=list)
    steps: int = 0
    stop_reason: str | None = None
    next_draft_tokens: list[int] = field(default_factory=list)
    next_draft_paths: torch.Tensor | None = None
    context_pos: int = 0          # prompt tokens the engine has taken (chunked context)
    context_chunks: int = 0       # engine steps that took part of the prompt (1: the whole prompt at once)
    slot: int | None = None
    arrival_step: int = 0
    first_token_time: float | None = None
    finish_time: float | None = None
    start_time: float | None = None
    _gen: torch.Generator | None = None
    _chunk: int | None = None     # this step's prompt chunk (None: the rest of the prompt)

    @property
    def done(self) -> bool:
        return self.stop_reason is not None

    @property
    def committed(self) -> int:
        """Tokens whose K/V are in the cache: prompt + emitted - 1 (the last one is the next anchor)."""
        return len(self.prompt_ids) + len(self.output_ids) - 1

    @property
    def mean_acceptance(self) -> float | None:
        """Tokens emitted per generation step; None before the first one (a request that ended at its prompt's
        token has no acceptance to average, and 0.0 would read as a drafter that never helps)."""
        a = self.acceptance_lengths
        return sum(a) / len(a) if a else None

    def to_dict(self) -> dict:
        return {"task_id": self.task_id, "prompt_len": len(self.prompt_ids), "output_ids": list(self.output_ids),
                "stop_reason": self.stop_reason, "steps": self.steps, "context_chunks": self.context_chunks,
                "mean_acceptance": self.mean_acceptance, "acceptance_lengths": list(self.acceptance_lengths),
                "acceptance_histogram": {str(k): v for k, v in sorted(Counter(self.acceptance_lengths).items())},
                "ttft_s": None if self.first_token_time is None else self.first_token_time - self.start_time,
                "latency_s": None if self.finish_time is None else self.finish_time - self.start_time}


class Runtime:
    """Runs requests through a :class:`~dflash2_trt.engine.standin.engine.StandinEngine` with in-flight batching."""

    def __init__(self, engine, *, max_batch_size: int | None = None, max_num_tokens: int | None = None,
                 chunked_context: bool | None = None, chunked_context_switch: str | None = None):
        self.engine = engine
        lim = engine.limits
        self.K = engine.K
        self.max_batch_size = lim["max_batch_size"] if max_batch_size is None else max_batch_size
        if not 1 <= self.max_batch_size <= lim["max_batch_size"]:
            raise ConfigError(f"must be in [1, {lim['max_batch_size']}] (the engine's max_batch_size), got "
                              f"{self.max_batch_size}", field="--max-batch-size")
        self.max_num_tokens = lim["max_num_tokens"] if max_num_tokens is None else max_num_tokens
        # every generation request runs each step (the batch manager would leave one over the budget for a later
        # step; this runtime never does), so the budget must hold them all, the rule trtllm-build sets the engine's by;
        # and no more than the engine's input shapes hold
        least = self.max_batch_size * (self.K + 1)
        if not least <= self.max_num_tokens <= lim["max_num_tokens"]:
            raise ConfigError(f"must be in [{least}, {lim['max_num_tokens']}] (max_batch_size {self.max_batch_size} x "
                              f"(K+1) {self.K + 1} generation tokens, the engine's max_num_tokens), got "
                              f"{self.max_num_tokens}", field="max_num_tokens")
        self.max_seq_len = lim["max_seq_len"]
        # TensorRT-LLM chunks a context only for an engine with paged context FMHA (every engine this project builds);
        # None: $DFLASH2_CHUNKED_CONTEXT (on unless 0). chunked_context_switch: what turned it off, for the refusal
        if chunked_context is None:
            chunked_context = chunked_context_default()
            chunked_context_switch = chunked_context_switch or f"${CHUNKED_CONTEXT_ENV}=0"
        self._chunking_switch = chunked_context_switch
        self.chunked_context = bool(chunked_context) and bool(getattr(engine, "paged_context_fmha", True))
        self.chunk_unit = context_chunk_unit(lim, getattr(engine, "max_attention_window", None), self.max_num_tokens)
        self._cache_indirection = torch.zeros(lim["max_batch_size"], 1, self.max_seq_len, dtype=torch.int32)
        # offsets in TensorRT-LLM's index over the engine's pool layers (every KV layer of a block in one row)
        self.blocks = BlockManager(engine.num_blocks, lim["tokens_per_block"], engine.num_layers)
        self.max_blocks = self.blocks.blocks_for(self.max_seq_len)
        # the longest request (prompt + new tokens + draft slots) the engine takes: max_seq_len, or less where the KV
        # pool holds fewer tokens (a small --set num_kv_blocks)
        self.token_capacity = min(self.max_seq_len, self.blocks.num_blocks * lim["tokens_per_block"])
        self._next_id = 0
        self._waiting: deque[Request] = deque()
        # Recurrent targets: one state slot per request in flight (TensorRT-LLM's RnnStateManager slots):
        # taken at admission, returned at completion.
        self._free_slots = list(range(getattr(engine, "num_slots", 0) - 1, -1, -1)) if getattr(engine, "recurrent",
                                                                                                False) else None
        self._active: list[Request] = []
        self._context: list[Request] = []   # admitted, their prompt not all taken yet (chunked context)
        self.step_count = 0
        self.step_log: list[dict] = []

    # ---- validation ------------------------------------------------------------------------------
    def check(self, r: Request) -> None:
        # a request without an id (a Triton client that sent none: request_id() is ""; the verify gate) is "request",
        # not "request " nor "request 16" (its prompt length, read as an id)
        where = "request" if r.task_id is None or r.task_id == "" else f"request {r.task_id}"
        if not r.prompt_ids:
            raise ConfigError("empty prompt", field=where)
        v = self.engine.vocab_size
        bad = [t for t in r.prompt_ids if not 0 <= int(t) < v]
        if bad:
            raise ConfigError(f"token ids {bad[:5]} outside the vocabulary [0, {v})", field=where)
        if r.max_new_tokens < 1:
            raise ConfigError(f"max new tokens must be >= 1, got {r.max_new_tokens}", field=where)
        if len(r.prompt_ids) > self.engine.limits["max_input_len"]:
            raise ConfigError(f"prompt of {len(r.prompt_ids)} tokens exceeds the engine's max_input_len "
                              f"{self.engine.limits['max_input_len']}", field=where)
        need = self._lifetime_tokens(r)
        room = self.token_capacity - len(r.prompt_ids) - (self.K + 1)
        cap = (f"the engine's max_seq_len {self.max_seq_len}" if self.token_capacity == self.max_seq_len else
               f"the {self.token_capacity} tokens the engine's KV pool holds")
        fix = (f"at most {room} new tokens for this prompt" if room >= 1 else
               f"the prompt and the draft slots alone fill {cap}: a shorter prompt")
        if need > self.max_seq_len:
            raise ConfigError(f"prompt ({len(r.prompt_ids)}) + max new tokens ({r.max_new_tokens}) + draft slots "
                              f"({self.K + 1}) = {need} exceeds the engine's max_seq_len {self.max_seq_len}: {fix}",
                              field=where)
        if len(r.prompt_ids) > self.max_num_tokens and not self.chunked_context:
            why = ("this engine was built without paged context FMHA, which chunked context needs"
                   if not getattr(self.engine, "paged_context_fmha", True) else
                   "chunked context is off" + (f" ({self._chunking_switch})" if self._chunking_switch else ""))
            raise ConfigError(f"prompt of {len(r.prompt_ids)} tokens exceeds max_num_tokens {self.max_num_tokens} "
                              f"(a prompt is taken whole in one step: {why}; an engine built with --max-num-tokens "
                              f"{len(r.prompt_ids)} or more takes it whole)", field=where)
        effective_temperature(r.temperature, field=f"{where}: temperature")   # below 1e-5: decoded greedily
        if self.blocks.blocks_for(need) > self.blocks.num_blocks:
            raise ConfigError(f"needs {self.blocks.blocks_for(need)} KV blocks, the pool has {self.blocks.num_blocks} "
                              f"({self.token_capacity} tokens): {fix}", field=where)

    # ---- main loop -------------------------------------------------------------------------------
    # ---- incremental API (serving: requests arrive while others generate) ------------------------
    def submit(self, r: Request) -> Request:
        """Queue a request (checked now); it joins the batch at the next :meth:`step` it fits in."""
        self.check(r)
        if r.start_time is None:
            r.start_time = time.perf_counter()
        self._waiting.append(r)
        return r

    @property
    def has_work(self) -> bool:
        return bool(self._waiting or self._context or self._active)

    @property
    def in_flight(self) -> int:
        return len(self._waiting) + len(self._context) + len(self._active)

    def _chunk_size(self, r: Request, capacity: int) -> int:
        """The prompt tokens ``r`` takes this step from ``capacity`` tokens left (facts/context_chunking.yaml policy):
        the rest of its prompt when it fits; else, chunking, the capacity rounded down to a multiple of the chunk unit;
        else 0 (it waits)."""
        rest = len(r.prompt_ids) - r.context_pos
        capacity = max(0, capacity)
        if rest <= capacity:
            return rest
        if not self.chunked_context:
            return 0
        return capacity // self.chunk_unit * self.chunk_unit        # capacity <= max_num_tokens already

    def step(self, on_tokens=None) -> list[Request]:
        """One engine step: admit what fits, run the engine, emit the accepted tokens.

        ``on_tokens(request, new_tokens)`` is called for every request that emitted tokens this step
        (streaming). Returns the requests that finished in this step."""
        active = self._active
        # the capacity scheduler: admission, FIFO
        while self._waiting and len(active) + len(self._context) < self.max_batch_size:
            r = self._waiting[0]
            # GUARANTEED_NO_EVICT (TensorRT-LLM's default capacity policy): reserve the request's whole
            # lifetime — prompt + max new tokens + the K + 1 draft slots — at admission, so that a
            # running request never finds the pool empty mid-generation.
            need = self._lifetime_tokens(r)
            if not self.blocks.can_fit(self._next_id, need):
                break
            if self._free_slots is not None and not self._free_slots:
                break
            self._waiting.popleft()
            if self._free_slots is not None:
                # Not zeroed here, as TensorRT-LLM's RnnStateManager does not: the engine starts a prompt's
                # first chunk from zero state itself (DFlash2GatedDeltaNet zero_state).
                r.slot = self._free_slots.pop()
            r.req_id = self._next_id
            self._next_id += 1
            r._gen = torch.Generator().manual_seed(int(r.seed))
            self.blocks.ensure(r.req_id, need)
            self._context.append(r)
        # the micro-batch scheduler: the generation requests' tokens first, then each context request's chunk in
        # admission order from what is left
        tokens = len(active) * (self.K + 1)
        batch_ctx: list[Request] = []
        for r in self._context:
            r._chunk = self._chunk_size(r, self.max_num_tokens - tokens)
            if r._chunk:
                batch_ctx.append(r)
                tokens += r._chunk
                continue
            r._chunk = None
            if not self.chunked_context:
                break
        if not batch_ctx and not active:
            if self._waiting or self._context:
                raise RuntimeError("scheduler: nothing fits (checked requests should always fit an empty engine)")
            return []
        for r in active:   # already reserved at admission; ensure() is a no-op unless that changes
            self.blocks.ensure(r.req_id, r.committed + self.K + 1)
        # the batch manager's order with chunks present: context requests not at their last chunk, then those at it
        cut = [r for r in batch_ctx if not self._last_chunk(r)]
        batch_ctx = cut + [r for r in batch_ctx if self._last_chunk(r)]
        batch = batch_ctx + active
        out = self.engine.step(self._inputs(batch_ctx, active))
        self.step_count += 1
        # "cut": context requests whose chunk this step was not their prompt's last
        self.step_log.append({"context": len(batch_ctx), "generation": len(active), "tokens": tokens,
                              **({"cut": len(cut)} if cut else {})})
        now = time.perf_counter()
        acc, num = out["accepted_tokens"], out["num_accepted_tokens"]
        for r in batch_ctx:
            r.context_pos += r._chunk
            r.context_chunks += 1
            r._chunk = None
        self._context = [r for r in self._context if r.context_pos < len(r.prompt_ids)]
        for i, r in enumerate(batch):
            if i < len(batch_ctx) and r.context_pos < len(r.prompt_ids):
                r.steps += 1        # a chunk before the last: its token and drafts are not used (the decoder skips it)
                continue
            n = int(num[i])
            if not 1 <= n <= self.K + 1:
                raise RuntimeError(f"engine reported {n} accepted tokens (must be in [1, {self.K + 1}])")
            r.steps += 1
            if i >= len(batch_ctx):
                r.acceptance_lengths.append(n)
            before = len(r.output_ids)
            self._emit(r, [int(t) for t in acc[i, :n]])
            if r.first_token_time is None:
                r.first_token_time = now
            r.next_draft_tokens = [int(t) for t in out["next_draft_tokens"][i, :int(out["next_draft_lens"][i])]]
            r.next_draft_paths = out["next_draft_paths"][i].clone()
            if len(r.next_draft_tokens) != self.K:
                raise RuntimeError(f"engine asked for {len(r.next_draft_tokens)} drafts; this engine runs K = {self.K}")
            if on_tokens is not None:
                on_tokens(r, r.output_ids[before:])
        self._active = [r for r in batch if not r.done and r.context_pos >= len(r.prompt_ids)]
        finished = [r for r in batch if r.done]
        for r in finished:
            r.finish_time = now
            self.blocks.free(r.req_id)
            self._release_slot(r)
        return finished

    def _release_slot(self, r: Request) -> None:
        if self._free_slots is not None and r.slot is not None:
            self._free_slots.append(r.slot)
            r.slot = None

    @staticmethod
    def _last_chunk(r: Request) -> bool:
        return r.context_pos + (len(r.prompt_ids) - r.context_pos if r._chunk is None else r._chunk) \
            >= len(r.prompt_ids)

    def _lifetime_tokens(self, r: Request) -> int:
        return len(r.prompt_ids) + r.max_new_tokens + self.K + 1

    def reserved_blocks(self, r: Request) -> int:
        """The KV-cache blocks this runtime reserves for ``r`` when it admits it (its whole lifetime's, all newly
        allocated: no prefix is reused)."""
        return self.blocks.blocks_for(self._lifetime_tokens(r))

    def cancel(self, r: Request) -> None:
        """Drop a request (client gone): frees its blocks; it ends with stop_reason 'cancelled'."""
        if any(x is r for x in self._waiting):     # by identity: Request compares by value
            self._waiting = deque(x for x in self._waiting if x is not r)
        for name in ("_context", "_active"):
            held = getattr(self, name)
            if any(x is r for x in held):
                setattr(self, name, [x for x in held if x is not r])
                self.blocks.free(r.req_id)
                self._release_slot(r)
        if r.stop_reason is None:
            r.stop_reason = "cancelled"

    def generate(self, requests: Sequence[Request], progress=None) -> list[Request]:
        """Run ``requests`` (all arriving now) to completion."""
        for r in requests:
            self.check(r)
        t0 = time.perf_counter()
        for r in requests:
            r.start_time = t0
            self._waiting.append(r)
        while self.has_work:
            self.step()
            if progress is not None:
                progress(sum(r.done for r in requests), len(requests))
        return list(requests)

    def adopt(self, r: Request, last_token: int) -> Request:
        """Place ``r`` straight into the generation phase, as if its prompt had been processed and ``last_token``
        emitted: its KV blocks and state slot reserved, the engine's placeholder drafts as its next inputs. Nothing
        is computed, so the cache and the slot hold whatever they held: for timing generation steps at a given
        context length (``bench steps``), never for output that matters. Returns ``r``."""
        self.check(r)
        if self._free_slots is not None:
            if not self._free_slots:
                raise RuntimeError("adopt: no free state slot")
            r.slot = self._free_slots.pop()
        r.req_id = self._next_id
        self._next_id += 1
        r._gen = torch.Generator().manual_seed(int(r.seed))
        r.output_ids = [int(last_token)]
        r.context_pos = len(r.prompt_ids)
        r.next_draft_tokens = [int(self.engine.mask_token_id)] * self.K
        paths = torch.full((self.K + 1, self.K + 1), -1, dtype=torch.int32)
        paths[0] = torch.arange(self.K + 1, dtype=torch.int32)
        r.next_draft_paths = paths
        self.blocks.ensure(r.req_id, self._lifetime_tokens(r))
        self._active.append(r)
        return r

    def step_inputs(self, ctx: list[Request], gen: list[Request]) -> dict:
        """The engine inputs of a step with context requests ``ctx`` and generation requests ``gen`` (what
        :meth:`step` feeds the engine; see :meth:`_inputs`)."""
        return self._inputs(ctx, gen)

    @property
    def generating(self) -> list[Request]:
        """The requests in the generation phase, in batch order."""
        return list(self._active)

    def _emit(self, r: Request, tokens: Iterable[int]) -> None:
        stops = set(r.stop_token_ids)
        for t in tokens:
            r.output_ids.append(t)
            if t in stops:
                r.stop_reason = "stop_token"
                return
            if len(r.output_ids) >= r.max_new_tokens:
                r.stop_reason = "max_new_tokens"
                return

    # ---- engine inputs ---------------------------------------------------------------------------
    def _inputs(self, ctx: list[Request], gen: list[Request]) -> dict:
        """The step's engine inputs with the values TensorRT-LLM 1.2's batch manager gives them
        (``batch_manager/runtimeBuffers.cpp`` setFromInputs, ``runtime/eagleBuffers.cpp``):

        - context request (a chunk of n prompt tokens from position s; a whole prompt: s = 0, n = P): tokens = the
          chunk; context_lengths = n; sequence_length = s + n; host_past_key_value_lengths = s + n (chunk start +
          input length, as stock); one logit (its last token); draft_lens = 0;
        - generation request (S committed tokens): tokens = [last token] + next_draft_tokens;
          context_lengths = prompt + K; sequence_length = S + K + 1; host_past_key_value_lengths = S;
          K + 1 logits; draft_lens = K; its spec-decoding rows (offsets, packed mask) from next_draft_paths;
        - last_token_ids = inclusive scan of the logits per request (a context request's entry is its
          token count, each generation token adds 1);
        - random data: rand_data_validation [bs, K+1] and rand_data_sample [bs], uniforms per request and step,
          from a generator seeded by the request's seed.
        """
        K = self.K
        batch = ctx + gen
        ids, logit_ids = [], []
        seq, past, ctx_len, types, draft_lens = [], [], [], [], []
        gen_len, offsets, masks = [], [], []
        chain = torch.tril(torch.ones(K + 1, K + 1, dtype=torch.bool))
        chunks = []
        for r in ctx:
            s0 = r.context_pos
            n = len(r.prompt_ids) - s0 if r._chunk is None else r._chunk
            chunks.append(n)
            ids += r.prompt_ids[s0:s0 + n]
            logit_ids.append(n)
            seq.append(s0 + n), past.append(s0 + n), ctx_len.append(n), types.append(CONTEXT), draft_lens.append(0)
        for r in gen:
            s = r.committed
            offs, mask = _paths_to_offsets_and_mask(r.next_draft_paths)
            if not torch.equal(mask, chain):
                raise RuntimeError("next_draft_paths is not the linear chain this runtime drives")
            ids += [r.output_ids[-1]] + r.next_draft_tokens
            logit_ids += [1] * (K + 1)
            seq.append(s + K + 1), past.append(s), ctx_len.append(len(r.prompt_ids) + K), types.append(GENERATION)
            draft_lens.append(len(r.next_draft_tokens))
            gen_len.append(K + 1), offsets.append(offs), masks.append(mask)
        from ..trtllm.cpu.attention import pack_mask

        bs = len(batch)
        blk_offsets = self.blocks.offsets([r.req_id for r in batch], self.max_blocks)
        i32 = lambda v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
        words = (K + 32) // 32
        rv = torch.zeros(bs, K + 1)      # eagleBuffers.cpp: rand_data_validation [numSequences, maxDecodingTokens]
        rs = torch.zeros(bs)
        for i, r in enumerate(batch):
            if i < len(ctx) and not self._last_chunk(r):
                continue            # a chunk before the last: its outputs are not used, so no draw (zeros)
            rv[i, 0], rs[i] = torch.rand(2, generator=r._gen)     # the engine keys its generators on these two
            rv[i, 1:] = torch.rand(K, generator=r._gen)
        return {
            "input_ids": i32(ids),
            "last_token_ids": torch.cumsum(i32(logit_ids), 0).to(torch.int32),
            "sequence_length": i32(seq), "host_past_key_value_lengths": i32(past),
            "context_lengths": i32(ctx_len), "host_context_lengths": i32(ctx_len),
            "host_request_types": i32(types),
            "kv_cache_block_offsets": blk_offsets, "host_kv_cache_block_offsets": blk_offsets.clone(),
            "spec_decoding_generation_lengths": i32(gen_len),
            "spec_decoding_position_offsets": (torch.stack(offsets).to(torch.int32) if gen
                                               else torch.zeros(0, K + 1, dtype=torch.int32)),
            "spec_decoding_packed_mask": (pack_mask(torch.stack(masks)).reshape(-1, words) if gen
                                          else torch.zeros(0, words, dtype=torch.int32)),
            # eagleBuffers.cpp: EagleBuffers::engineInputs.useSpecDecoding, a host [1] set to 1 once, every step
            "spec_decoding_use": i32([1]),
            "draft_lens": i32(draft_lens),
            # what this project's GPU entry points put in the TensorRT-LLM request, which its runtime copies into
            # the engine unchanged: the temperature, or GREEDY_REQUEST_TEMPERATURE for greedy (TensorRT-LLM refuses
            # 0); the engine itself reads anything below 1e-5 as greedy (network/accept.py decoding_temperature)
            "eagle_temperature": torch.tensor([request_temperature(r.temperature) for r in batch],
                                              dtype=torch.float32),
            "rand_data_validation": rv, "rand_data_sample": rs,
            # eagleBuffers.cpp: [numSequences]
            "host_gen_eagle_net_request_types": i32([GENERATION] * bs),
            # beam search only: transformerBuffers.cpp allocates [maxBatchSize, maxBeamWidth, maxAttentionWindow]
            # once and binds it whole
            "cache_indirection": self._cache_indirection,
            **({"slot_mapping": i32([r.slot for r in batch])} if self._free_slots is not None else {}),
            **(sliding_inputs(seq, chunks + [K + 1] * len(gen))
               if getattr(self.engine, "sliding_context", False) else {}),
        }


def context_chunk_unit(limits: dict, max_attention_window: int | None, max_num_tokens: int) -> int:
    """The chunk unit of chunked context (engine/trtllm/facts/context_chunking.yaml chunk_unit): tokens per block, at
    least 256 where max_input_len exceeds the largest attention window, clamped to ``max_num_tokens``."""
    unit = int(limits["tokens_per_block"])
    if max_attention_window is not None and int(limits["max_input_len"]) > int(max_attention_window):
        unit = max(256, unit)
    return max(1, min(unit, int(max_num_tokens)))


def sliding_inputs(sequence_length: list[int], new_tokens: list[int]) -> dict:
    """The context route's second set of request inputs (engine_io.yaml sliding_*; an engine whose target's
    sliding-window layers take each step's new tokens as a context chunk): every request a context request (0) whose
    chunk is its new tokens this step (a context request's prompt, a generation request's K + 1), and the stock
    host_past_key_value_lengths of a context chunk, chunk start + chunk length = sequence_length (the plugin takes its
    key range, and whether the window applies, from their max: engine/trtllm/facts/attention_window.yaml
    context_route)."""
    i32 = lambda v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
    return {"sliding_host_request_types": torch.zeros(len(new_tokens), dtype=torch.int32),
            "sliding_context_lengths": i32(new_tokens), "sliding_host_context_lengths": i32(new_tokens),
            "sliding_host_past_key_value_lengths": i32(sequence_length)}


_PATHS_CACHE: dict = {}


def _paths_to_offsets_and_mask(paths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Cached by the paths' values (every step of a chain engine hands back the same paths)."""
    key = (tuple(paths.shape), paths.to(torch.int64).flatten().tolist().__repr__())
    hit = _PATHS_CACHE.get(key)
    if hit is None:
        hit = _PATHS_CACHE[key] = _paths_uncached(paths)
        if len(_PATHS_CACHE) > 64:
            _PATHS_CACHE.pop(next(iter(_PATHS_CACHE)))
    return hit[0].clone(), hit[1].clone()


def _paths_uncached(paths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """EAGLE ``next_draft_paths [K+1, L+1]`` (rows = paths, entries = token indices, -1 padding) -> the
    position offset of every draft-tree token (its depth) and the attention mask (a token sees its
    ancestors on a path and itself), as TensorRT-LLM's spec-decoding inputs are built from a tree."""
    n = paths.shape[0]
    depth = torch.zeros(n, dtype=torch.int32)
    mask = torch.zeros(n, n, dtype=torch.bool)
    mask[0, 0] = True
    for row in paths:
        toks = [int(t) for t in row if int(t) >= 0]
        for d, t in enumerate(toks):
            depth[t] = d
            for a in toks[:d + 1]:
                mask[t, a] = True
    return depth, mask
