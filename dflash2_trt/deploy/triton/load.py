"""A bounded load against a served ``tensorrt_llm`` model (gRPC streams), checked token by token.

``concurrency`` worker threads, each with its own gRPC stream, send ``requests`` (a fixed list,
so the load is bounded) one at a time: streaming, with ``return_perf_metrics``. A request's tokens
are the concatenation of its streamed responses; with ``expected`` given, every request must come
back exactly equal to it (a lost, duplicated, reordered or wrong token fails the run), so the
report's numbers are only ever for correct outputs.

Report (trtllm-bench / benchmark_serving style): requests/s, output tokens/s, latency and TTFT
percentiles, and the speculative-decoding statistics summed over the requests (TensorRT-LLM's
definitions, see ``serving.py``): acceptance rate and mean acceptance length (tokens per
generation step).

    python -m dflash2_trt.deploy.triton.load --engine-dir ENGINE --requests 200 --concurrency 1,4,16
"""

from __future__ import annotations

import argparse
import queue
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from ...engine.format import load_engine_dir
from ...errors import ConfigError, DFlash2Error, clear_stop_requests, pending_stop, raise_if_stop_requested, raise_stop
from ...sampling import request_temperature


class LoadError(DFlash2Error):
    """A request of the load failed, was lost, or came back wrong."""


@dataclass
class LoadRequest:
    input_ids: list[int]
    max_tokens: int
    expected: list[int] | None = None
    temperature: float = 0.0
    seed: int = 0


@dataclass
class LoadResult:
    index: int
    output_ids: list[int] = field(default_factory=list)
    responses: int = 0
    ttft_s: float | None = None
    latency_s: float | None = None
    accepted: int = 0
    drafts: int = 0
    error: str | None = None


def _inputs(grpc, r: LoadRequest):
    def t(name, arr, dt):
        x = grpc.InferInput(name, list(arr.shape), dt)
        x.set_data_from_numpy(arr)
        return x

    return [t("input_ids", np.array([r.input_ids], dtype=np.int32), "INT32"),
            t("input_lengths", np.array([[len(r.input_ids)]], dtype=np.int32), "INT32"),
            t("request_output_len", np.array([[r.max_tokens]], dtype=np.int32), "INT32"),
            # what a TensorRT-LLM request carries (greedy: a small positive temperature; engine_io.yaml
            # request_temperature): this talks to the tensorrt_llm model directly, not through the ensemble
            t("temperature", np.array([[request_temperature(r.temperature)]], dtype=np.float32), "FP32"),
            t("seed", np.array([[r.seed]], dtype=np.uint64), "UINT64"),
            t("streaming", np.array([[True]]), "BOOL"),
            t("return_perf_metrics", np.array([[True]]), "BOOL")]


def stream_one(client, grpc, responses: queue.Queue, index: int, r: LoadRequest, *, model: str = "tensorrt_llm",
               timeout: float = 120.0) -> LoadResult:
    """One streaming request on an open stream (its callback feeds ``responses``)."""
    res = LoadResult(index)
    t0 = time.perf_counter()
    client.async_stream_infer(model, _inputs(grpc, r), request_id=str(index), enable_empty_final_response=True)
    while True:
        try:
            result, error = responses.get(timeout=timeout)
        except queue.Empty:
            res.error = f"no response within {timeout:.0f} s (lost)"
            return res
        if error is not None:
            res.error = str(error)
            return res
        resp = result.get_response()
        if resp.id != str(index):
            res.error = f"response for request {resp.id!r} on the stream of request {index}"
            return res
        res.responses += 1
        if res.ttft_s is None:   # the first response, even an empty one (a request that ended at its end token)
            res.ttft_s = time.perf_counter() - t0
        ids = result.as_numpy("output_ids")
        if ids is not None and ids.size:
            res.output_ids += ids.reshape(-1).tolist()
        if resp.parameters["triton_final_response"].bool_param:
            res.latency_s = time.perf_counter() - t0
            acc, dr = result.as_numpy("total_accepted_draft_tokens"), result.as_numpy("total_draft_tokens")
            res.accepted = int(acc.reshape(-1)[0]) if acc is not None else 0
            res.drafts = int(dr.reshape(-1)[0]) if dr is not None else 0
            return res


def run_load(grpc_url: str, requests: list[LoadRequest], concurrency: int, *, model: str = "tensorrt_llm",
             K: int | None = None, timeout: float = 120.0) -> dict:
    """Send every request (``concurrency`` at a time) and report; raises :class:`LoadError` if any
    request failed or differs from its ``expected`` tokens."""
    import tritonclient.grpc as grpc

    if concurrency < 1:
        raise LoadError(f"concurrency must be >= 1, got {concurrency}")
    results: list[LoadResult | None] = [None] * len(requests)
    next_i = iter(range(len(requests)))
    lock = threading.Lock()

    def worker():
        client = grpc.InferenceServerClient(grpc_url)
        q: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: q.put((result, error)))
        try:
            while True:
                with lock:
                    i = next(next_i, None)
                if i is None:
                    return
                results[i] = stream_one(client, grpc, q, i, requests[i], model=model, timeout=timeout)
        finally:
            client.stop_stream()
            client.close()

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, name=f"load-{k}", daemon=True) for k in range(concurrency)]
    for th in threads:
        th.start()
    for th in threads:
        while th.is_alive():   # in steps: a stop whose exception Python lost still ends the run
            raise_if_stop_requested()
            th.join(0.1)
    wall = time.perf_counter() - t0
    bad = []
    for i, (req, res) in enumerate(zip(requests, results)):
        if res is None:
            bad.append(f"request {i}: never sent")
        elif res.error is not None:
            bad.append(f"request {i}: {res.error}")
        elif req.expected is not None and res.output_ids != req.expected:
            bad.append(f"request {i}: {len(res.output_ids)} tokens {res.output_ids[:8]}... differ from the expected "
                       f"{len(req.expected)} {req.expected[:8]}...")
    if bad:
        raise LoadError(f"{len(bad)} of {len(requests)} requests failed at concurrency {concurrency}: "
                        + "; ".join(bad[:3]))
    lat = sorted(r.latency_s for r in results)
    ttft = sorted(r.ttft_s for r in results)
    tokens = sum(len(r.output_ids) for r in results)
    accepted, drafts = sum(r.accepted for r in results), sum(r.drafts for r in results)
    report = {"concurrency": concurrency, "requests": len(requests), "wall_s": wall,
              "requests_per_s": len(requests) / wall, "output_tokens": tokens, "output_tokens_per_s": tokens / wall,
              "latency_s": _pcts(lat), "ttft_s": _pcts(ttft),
              "responses_per_request": statistics.mean(r.responses for r in results),
              "total_accepted_draft_tokens": accepted, "total_draft_tokens": drafts,
              "acceptance_rate": accepted / drafts if drafts else 0.0}
    if K is not None and drafts:
        report["mean_acceptance_length"] = 1 + accepted * K / drafts
    return report


def _pcts(xs: list[float]) -> dict:
    def p(q):
        return xs[min(len(xs) - 1, max(0, int(round(q * (len(xs) - 1)))))]

    return {"mean": statistics.mean(xs), "p50": p(0.50), "p90": p(0.90), "p99": p(0.99), "max": xs[-1]}


def render(report: dict) -> str:
    lat, ttft = report["latency_s"], report["ttft_s"]
    return (f"concurrency {report['concurrency']:>3}: {report['requests']} requests in {report['wall_s']:.1f} s, "
            f"{report['requests_per_s']:.2f} req/s, {report['output_tokens_per_s']:.0f} tok/s, latency p50 "
            f"{lat['p50'] * 1e3:.0f} ms p99 {lat['p99'] * 1e3:.0f} ms, TTFT p50 {ttft['p50'] * 1e3:.0f} ms, "
            f"acceptance rate {report['acceptance_rate']:.3f}"
            + (f", mean acceptance {report['mean_acceptance_length']:.2f}" if "mean_acceptance_length" in report else ""))


def main(argv=None) -> int:
    """Serve an engine with the bundled tritonserver and run the bounded load against it; greedy
    outputs are checked against the target's own greedy decoding."""
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--engine-dir", required=True)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--json", dest="json_out", help="write the reports here")
    args = ap.parse_args(argv)
    try:   # checked before the target decodes and the server starts, not by a traceback after the run
        concurrency = [int(x) for x in args.concurrency.split(",")]
    except ValueError:
        ap.error(f"--concurrency: expected comma-separated integers, got {args.concurrency!r}")
    for name, values in (("--requests", [args.requests]), ("--concurrency", concurrency),
                         ("--max-tokens", [args.max_tokens])):
        if min(values) < 1:
            ap.error(f"{name}: must be >= 1, got {min(values)}")
    import os
    import signal

    if not sys.stderr.isatty():   # no weight-loading bars in a log, as the CLI (transformers reads it when imported)
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

    # recorded, so that a stop whose exception Python lost still stops the run
    before = ({sig: signal.signal(sig, raise_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
              if threading.current_thread() is threading.main_thread() else {})   # (only there may Python set them)
    try:
        if args.json_out is not None:   # before the target decodes and the server starts; never an input
            from ...bench.io import check_output_file
            from ...overlap import refuse_overlap

            refuse_overlap(args.json_out, "--json", [("engine directory", args.engine_dir)], force=False)
            check_output_file(args.json_out, field="--json", replaces="load")
        return _run(args, concurrency)
    except DFlash2Error as exc:
        if pending_stop() is None:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        return _stopped(pending_stop())
    except KeyboardInterrupt:
        return _stopped(pending_stop() or signal.SIGINT)
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
        clear_stop_requests()


def _stopped(signum: int) -> int:
    import signal

    print("terminated (SIGTERM)" if signum == signal.SIGTERM else "interrupted", file=sys.stderr)
    return 128 + signum


def _run(args, concurrency: list[int]) -> int:
    from .repository import deploy_triton
    from .server import TritonServer

    import tempfile
    from pathlib import Path

    reqs, K = expected_requests(args.engine_dir, args.requests, args.max_tokens)
    with tempfile.TemporaryDirectory(prefix="dflash2-load-") as tmp:
        deploy_triton(args.engine_dir, Path(tmp) / "repo", decoupled=True, ids_only=True)
        with TritonServer(Path(tmp) / "repo") as srv:
            reports = []
            for c in concurrency:
                raise_if_stop_requested()
                rep = run_load(srv.grpc_url, reqs, c, K=K)
                print(render(rep), flush=True)
                reports.append(rep)
    if args.json_out is not None:
        from ...bench.io import LOAD_FORMAT, atomic_write_json

        atomic_write_json(args.json_out, {"format": LOAD_FORMAT, "engine_dir": str(Path(args.engine_dir).absolute()),
                                          "levels": reports})
    return 0


def expected_requests(engine_dir, n: int, max_tokens: int) -> tuple[list[LoadRequest], int]:
    """``n`` requests cycling over the engine target's shipped prompts (or seeded random ids), each
    with the target's own greedy continuation (``reference.loop.target_generate``) as expected."""
    import json as _json
    from pathlib import Path

    from ...reference.loop import load_target, target_generate
    from .serving import response_tokens

    _, man = load_engine_dir(engine_dir)
    target_dir = Path(man["sources"]["target_dir"])
    prompts_file = target_dir.parent / "prompts.json"
    prompts = _json.loads(prompts_file.read_text())["prompts"] if prompts_file.is_file() else None
    if not prompts:
        rng = np.random.default_rng(0)
        prompts = [rng.integers(3, 200, size=int(rng.integers(4, 24))).tolist() for _ in range(16)]
    prompts = prompts[:n]
    # what the server would refuse, said before the target decodes max_tokens for every prompt (the runtime's rule:
    # prompt + new tokens + the K + 1 draft slots within max_seq_len)
    max_seq_len, slots = (man.get("limits") or {}).get("max_seq_len"), int(man["block_size"])
    longest = max(len(p) for p in prompts)
    if isinstance(max_seq_len, int) and longest + max_tokens + slots > max_seq_len:
        raise ConfigError(f"{max_tokens}: the longest prompt ({longest}) + {max_tokens} + the draft slots ({slots}) "
                          f"exceed the engine's max_seq_len {max_seq_len}", field="--max-tokens")
    target = load_target(target_dir)
    stops = tuple(man.get("eos_token_ids") or ())
    # a response leaves out the end token the request stopped at, as TensorRT-LLM's backend does (serving.py)
    expected = [response_tokens(target_generate(target, p, max_tokens, stop_token_ids=stops), stops) for p in prompts]
    reqs = [LoadRequest(list(prompts[i % len(prompts)]), max_tokens, expected[i % len(prompts)]) for i in range(n)]
    return reqs, int(man["block_size"]) - 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
