"""Triton python-backend model ``tensorrt_llm`` on the project runtime (written by ``dflash2-trt deploy triton``).

Same name and tensors as TensorRT-LLM's ``tensorrtllm`` backend model; the work is done by
``dflash2_trt.deploy.triton.serving`` (one project runtime in a background thread: in-flight batching
across Triton requests; decoupled: one response per engine step with the tokens it accepted). The engine
is opened by ``serving.open_engine`` from engine.json's ``backend``: a CPU or cuda engine directly, a
TensorRT-LLM engine through TensorRT (``engine/trtllm/session.py``, for the engines TensorRT-LLM's executor
refuses: docs/trt-session.md §8); everything after that is the same code.
Needs the ``dflash2-trt`` package importable by the python-backend stub (the server's Python).
"""

import json
import os
import sys

import triton_python_backend_utils as pb_utils

from dflash2_trt.cpu_threads import calm_openmp_waits, share_cpus

calm_openmp_waits()   # before torch loads (the imports below): a tritonserver not started by `serve` gets it too

from dflash2_trt.engine.graph_rules import describe  # noqa: E402
from dflash2_trt.deploy.triton.serving import (  # noqa: E402
    DRAIN_ENV, NotServing, ServingLoop, graph_report, open_engine, parse_request, refuse_parameters)
from dflash2_trt.errors import DFlash2Error  # noqa: E402


def _param(cfg, key, default=None):
    value = cfg.get("parameters", {}).get(key, {}).get("string_value")
    return default if value in (None, "") else value


def _response(tensors):
    return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(k, v) for k, v in tensors.items()])


def _log(message):
    """Into tritonserver's log: the python backend's logger where the stub has it, else the stub's stderr (which
    the server's log collects)."""
    logger = getattr(pb_utils, "Logger", None)
    if logger is not None:
        logger.log_info(message)     # what the model does, not a warning (a new user read W lines as trouble)
    else:
        print(message, file=sys.stderr, flush=True)


def _error(message, code_name=None):
    """An error response: ``code_name`` INVALID_ARG (HTTP 400, gRPC INVALID_ARGUMENT) where the request itself is at
    fault, so a client's retry logic does not take it for the server's, UNAVAILABLE where the model takes no requests
    now; else INTERNAL (an engine step that failed, a drain's deadline). Older stubs take no code. (TensorRT-LLM's own
    backend answers all of them with INTERNAL.)"""
    code = getattr(pb_utils.TritonError, code_name, None) if code_name else None
    error = pb_utils.TritonError(message) if code is None else pb_utils.TritonError(message, code)
    return pb_utils.InferenceResponse(output_tensors=[], error=error)


class _StreamSink:
    """Responses go out through the request's sender as they are made: decoupled, one per engine step (streaming) or
    one in all; not decoupled, the one final response. Either way execute() returns at once (None), so Triton hands
    the instance its next requests while these run: in-flight batching across requests, as TensorRT-LLM's backend
    does (it answers each request from its own response thread, whatever the transaction policy)."""

    def __init__(self, request):
        self.request = request
        self.sender = request.get_response_sender()

    def send(self, tensors, final):
        flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0
        self.sender.send(_response(tensors), flags=flags)

    def error(self, message, code_name=None):
        self.sender.send(_error(message, code_name), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def cancelled(self):
        return self.request.is_cancelled()


class TritonPythonModel:
    def initialize(self, args):
        cfg = json.loads(args["model_config"])
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(cfg)
        engine_dir = _param(cfg, "gpt_model_path")
        if engine_dir is None:
            raise pb_utils.TritonModelException("parameter gpt_model_path (the engine directory) is not set")
        fraction = _param(cfg, "kv_cache_free_gpu_mem_fraction")
        try:
            fraction = None if fraction is None else float(fraction)
        except ValueError:
            raise pb_utils.TritonModelException(f"parameter kv_cache_free_gpu_mem_fraction {fraction!r} is not a "
                                                f"number") from None
        graphs = _param(cfg, "cuda_graph_mode", "false").strip().lower()
        if graphs not in ("true", "false"):
            raise pb_utils.TritonModelException(f"parameter cuda_graph_mode {graphs!r} is not true or false")
        # the tensorrtllm backend's name: a prompt over max_num_tokens is taken in chunks (on unless "false")
        chunked = _param(cfg, "enable_chunked_context", "true").strip().lower()
        if chunked not in ("true", "false"):
            raise pb_utils.TritonModelException(f"parameter enable_chunked_context {chunked!r} is not true or false")
        # this project's own parameter (deploy triton --target-only): the autoregressive baseline, the target alone
        target_only = _param(cfg, "target_only", "false").strip().lower()
        if target_only not in ("true", "false"):
            raise pb_utils.TritonModelException(f"parameter target_only {target_only!r} is not true or false")
        target_only = target_only == "true"
        mode = _param(cfg, "decoding_mode", "auto" if target_only else "eagle")
        if target_only:   # one token per request per step, no draft tree: checked before the engine loads
            if _param(cfg, "eagle_choices") is not None:
                raise pb_utils.TritonModelException("eagle_choices: the target alone (target_only true) decodes "
                                                    "autoregressively, with no draft tree; leave it out")
            if mode != "auto":
                raise pb_utils.TritonModelException(f"decoding_mode {mode!r}: the target alone (target_only true) "
                                                    f"decodes autoregressively: decoding_mode \"auto\"")
        elif mode != "eagle":
            raise pb_utils.TritonModelException(f"decoding_mode {mode!r}: this engine runs eagle decoding only")
        try:
            self.engine, self.manifest, runtime = open_engine(engine_dir, kv_cache_fraction=fraction,
                                                              cuda_graphs=graphs == "true", target_only=target_only)
        except DFlash2Error as exc:
            raise pb_utils.TritonModelException(f"cannot open the engine: {exc}") from None
        _log(f"tensorrt_llm: {engine_dir} runs on {runtime}")
        pool = getattr(self.engine, "pool_sizing", None)   # as TensorRT-LLM logs its KV cache's size at load
        if pool:
            free = (f": {pool['fraction']:g} of {pool['free_bytes'] / 2**30:.2f} GiB free" if "fraction" in pool
                    else "")
            _log(f"tensorrt_llm: KV pool of {pool['num_kv_blocks']} blocks ({pool['rule']}{free})")
        # this stub shares the CPUs with tritonserver's own request threads: leave them one (dflash2_trt/cpu_threads.py)
        threads = share_cpus(1, reserve=1)
        if threads is not None:
            _log(f"tensorrt_llm: torch uses {threads} CPU thread{'s' if threads > 1 else ''}, one CPU left to "
                 f"tritonserver (OMP_NUM_THREADS overrides)")
        K = self.engine.K
        choices = None if target_only else _param(cfg, "eagle_choices")
        chain = ",".join("{" + ",".join(["0"] * d) + "}" for d in range(1, K + 1))
        if choices is not None and choices.replace(" ", "") != chain:
            # a different tree would silently change what the engine is asked to verify
            raise pb_utils.TritonModelException(f"eagle_choices {choices!r} is not the engine's chain of depth {K}: "
                                                f"{chain}")
        self.exclude_default = _param(cfg, "exclude_input_in_output", "false").lower() == "true"
        self.eos = tuple(int(e) for e in self.manifest.get("eos_token_ids") or ())
        max_batch = int(cfg.get("max_batch_size") or 0) or None
        limit = self.engine.limits["max_batch_size"]
        if max_batch is not None and not 1 <= max_batch <= limit:
            # this file's own field, not the runtime's option name (--max-batch-size: a repository edited by hand)
            raise pb_utils.TritonModelException(
                f"config.pbtxt max_batch_size {max_batch}: must be in [1, {limit}] (the engine's max_batch_size); "
                f"write the repository again with `deploy triton --max-batch-size`")
        try:
            # `serve` names a drain file: when it appears, requests in flight get until its deadline to finish
            self.loop = ServingLoop(self.engine, max_batch_size=max_batch, poll_cancel=True,
                                    drain_file=os.environ.get(DRAIN_ENV) or None, chunked_context=chunked == "true",
                                    chunked_context_switch='config.pbtxt enable_chunked_context "false"',
                                    log=_log)
        except DFlash2Error as exc:
            raise pb_utils.TritonModelException(f"max_batch_size: {exc}") from None

    def _spec(self, request):
        # e.g. /generate's JSON fields that name no input (a python backend without parameters() passes none on)
        refuse_parameters(request.parameters() if hasattr(request, "parameters") else None)
        inputs = {t.name(): t.as_numpy() for t in request.inputs()}
        return parse_request(inputs, vocab_size=self.engine.vocab_size, eos_token_ids=self.eos,
                             exclude_default=self.exclude_default, decoupled=self.decoupled)

    def execute(self, requests):
        for request in requests:
            sink = _StreamSink(request)
            try:
                self.loop.submit(self._spec(request), sink, task_id=request.request_id())
            except NotServing as exc:
                sink.error(str(exc), "UNAVAILABLE")
            except DFlash2Error as exc:      # the request's inputs (parse_request, the runtime's limits)
                sink.error(str(exc), "INVALID_ARG")
        return None

    def finalize(self):
        self.loop.close()
        graphs = graph_report(self.engine)
        if graphs is not None:    # cuda_graph_mode: what the graphs did, and why they stopped if a capture failed
            _log(f"tensorrt_llm: CUDA graphs: {describe(graphs)}")
        self.engine.close()
