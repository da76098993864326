"""The CPU tensorrt_llm model's logic without a server (``deploy/triton/serving.py``): request
parsing (TensorRT-LLM backend tensors), the statistics' definitions, and the serving loop on the
real CPU engine: greedy outputs equal the target's own, in-flight batching across submissions,
streamed chunks, stop words, cancellation, an engine failure."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from dflash2_trt.deploy.triton.serving import ServingLoop, draft_stats, parse_request, parse_stop_words
from dflash2_trt.errors import ConfigError
from dflash2_trt.sampling import GREEDY_REQUEST_TEMPERATURE

from deploy_helpers import MAX_NEW


def _req(ids=(5, 6, 7), out=4, **extra):
    # greedy as a TensorRT-LLM client asks for it: a positive temperature below 1e-5 (unset is sampling at 1.0, 0 is
    # refused: engine_io.yaml request_temperature)
    extra.setdefault("temperature", np.float32(GREEDY_REQUEST_TEMPERATURE))
    d = {"input_ids": np.array([list(ids)], dtype=np.int32), "input_lengths": np.array([[len(ids)]], dtype=np.int32),
         "request_output_len": np.array([[out]], dtype=np.int32)}
    d.update({k: np.array([[v]]) for k, v in extra.items()})
    return d


def _parse(d, **kw):
    return parse_request(d, vocab_size=256, eos_token_ids=(2,), **kw)


def test_the_temperature_is_taken_as_tensorrt_llm_takes_it():
    """The CPU backend's tensorrt_llm model stands in for TensorRT-LLM's backend: no temperature is TensorRT-LLM's
    default 1.0 (sampling), 0 is refused as its EAGLE decoding layer refuses it (with its message), a tiny positive
    one passes as it is (the engine decodes it greedily), and what the executor refuses is refused."""
    from dflash2_trt.sampling import TRTLLM_DEFAULT_TEMPERATURE

    unset = _req()
    del unset["temperature"]
    assert _parse(unset).temperature == TRTLLM_DEFAULT_TEMPERATURE == 1.0
    with pytest.raises(ConfigError, match=r"temperature: 0 is refused by TensorRT-LLM's EAGLE decoding layer "
                                          r"\(temperature penalty param \(0\.000000\) is out of limits"):
        _parse(_req(temperature=np.float32(0.0)))
    assert _parse(_req(temperature=np.float32(1e-7))).temperature == pytest.approx(1e-7)
    for bad in (-1.0, np.inf, np.nan):
        with pytest.raises(ConfigError, match="temperature"):
            _parse(_req(temperature=np.float32(bad)))


def test_top_k_one_is_greedy_whatever_the_temperature():
    from dflash2_trt.sampling import GREEDY_BELOW

    # sampling from the one likeliest token is taking the argmax: the engine's greedy path
    for t in (0.5, 1.0, 7.0):
        s = _parse(_req(temperature=np.float32(t), runtime_top_k=np.int32(1)))
        assert 0 < s.temperature < GREEDY_BELOW
    unset = _req(runtime_top_k=np.int32(1))
    del unset["temperature"]
    assert 0 < _parse(unset).temperature < GREEDY_BELOW
    assert _parse(_req(temperature=np.float32(0.5), runtime_top_k=np.int32(0))).temperature == 0.5
    with pytest.raises(ConfigError, match="runtime_top_k: 2 is not supported"):
        _parse(_req(runtime_top_k=np.int32(2)))


def test_parse_a_request():
    s = _parse(_req(temperature=np.float32(0.5), seed=np.uint64(2**64 - 1), return_perf_metrics=True,
                    beam_width=np.int32(1), runtime_top_k=np.int32(0), runtime_top_p=np.float32(1.0)))
    assert (s.prompt_ids, s.max_new_tokens, s.temperature, s.seed) == ([5, 6, 7], 4, 0.5, 2**64 - 1)
    assert s.stop_token_ids == (2,) and s.perf and not s.streaming and s.exclude_input
    # input_lengths cuts a padded (ragged) batch row
    s = _parse({**_req((5, 6, 7, 0, 0)), "input_lengths": np.array([[3]], dtype=np.int32)})
    assert s.prompt_ids == [5, 6, 7]
    assert _parse(_req(end_id=np.int32(9))).stop_token_ids == (9,)
    assert _parse(_req(end_id=np.int32(-1))).stop_token_ids == ()
    assert not _parse(_req(exclude_input_in_output=False)).exclude_input
    assert not _parse(_req(), exclude_default=False).exclude_input
    assert _parse(_req(streaming=True), decoupled=True).streaming


@pytest.mark.parametrize("change,needle", [
    (lambda d: d.pop("input_ids"), "input_ids: required"),
    (lambda d: d.pop("request_output_len"), "request_output_len: required"),
    (lambda d: d.update(request_output_len=np.array([[0]], dtype=np.int32)), "request_output_len: must be >= 1"),
    (lambda d: d.update(input_ids=np.array([[5, 300]], dtype=np.int32), input_lengths=np.array([[2]])),
     "outside the vocabulary"),
    (lambda d: d.update(input_lengths=np.array([[9]], dtype=np.int32)), "input_lengths: 9 is not in [1, 3]"),
    (lambda d: d.update(temperature=np.array([[np.nan]], dtype=np.float32)), "temperature"),
    (lambda d: d.update(temperature=np.array([[-1.0]], dtype=np.float32)), "temperature"),
    (lambda d: d.update(streaming=np.array([[True]])), "streaming needs a decoupled model"),
    (lambda d: d.update(beam_width=np.array([[2]], dtype=np.int32)), "beam_width: 2 is not supported"),
    (lambda d: d.update(runtime_top_k=np.array([[5]], dtype=np.int32)), "runtime_top_k"),
    (lambda d: d.update(runtime_top_p=np.array([[0.9]], dtype=np.float32)), "runtime_top_p"),
    (lambda d: d.update(return_log_probs=np.array([[True]])), "return_log_probs"),
    (lambda d: d.update(lora_task_id=np.array([[1]], dtype=np.uint64)), "lora_task_id: not supported"),
    (lambda d: d.update(bad_words_list=np.zeros((1, 2, 1), dtype=np.int32)), "bad_words_list: not supported"),
    (lambda d: d.update(temperature=np.array([[0.5, 0.5]], dtype=np.float32)), "one value per request"),
    (lambda d: d.update(stop_words_list=np.zeros((1, 3, 2), dtype=np.int32)), "stop_words_list: must have shape"),
    (lambda d: d.update(stop_words_list=np.array([[[5, 6], [3, -1]]], dtype=np.int32)), "end offsets"),
])
def test_bad_requests_name_the_input(change, needle):
    d = _req()
    change(d)
    with pytest.raises(ConfigError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        _parse(d)


def test_stop_word_lists():
    assert parse_stop_words(np.array([[[5, 6, 7, 0], [2, 3, -1, -1]]], dtype=np.int32)) == [[5, 6], [7]]
    assert parse_stop_words(np.array([[0], [-1]], dtype=np.int32)) == []


def test_statistics_are_tensorrt_llms():
    """drafts += K per generation step, accepted += tokens emitted - 1; rate = accepted / drafts."""
    st = draft_stats([4, 1, 8], K=7)
    assert st == {"total_accepted_draft_tokens": 3 + 0 + 7, "total_draft_tokens": 21, "acceptance_rate": 10 / 21}
    assert draft_stats([], K=7) == {"total_accepted_draft_tokens": 0, "total_draft_tokens": 0, "acceptance_rate": 0.0}


class Sink:
    def __init__(self, cancel_after=None):
        self.chunks, self.final, self.err, self.cancel_after, self.counts = [], None, None, cancel_after, []
        self.done = threading.Event()

    def send(self, tensors, final):
        ids = tensors["output_ids"].reshape(-1).tolist()
        assert tensors["sequence_length"].reshape(-1)[0] == len(ids)
        self.chunks.append(ids)
        if "num_output_tokens" in tensors:
            self.counts.append(tensors["num_output_tokens"])
        if final:
            self.final = tensors
            self.done.set()

    def error(self, message):
        self.err = message
        self.done.set()

    def cancelled(self):
        return self.cancel_after is not None and len(self.chunks) >= self.cancel_after


@pytest.fixture(scope="module")
def cpu_engine(engine):
    from dflash2_trt.engine.standin.engine import open_standin_engine

    eng, man = open_standin_engine(engine)
    yield eng
    eng.close()


@pytest.fixture
def loop(cpu_engine):
    lp = ServingLoop(cpu_engine, max_batch_size=16)
    yield lp
    lp.close()
    assert not lp._thread.is_alive()


def _spec(prompt, **kw):
    kw.setdefault("return_perf_metrics", True)
    return _parse(_req(prompt, MAX_NEW, **kw), decoupled=True)


def _wait(sinks, timeout=120):
    for s in sinks:
        assert s.done.wait(timeout), "a request never finished"


def test_greedy_outputs_are_the_targets(loop, prompts, greedy):
    sinks = [Sink() for _ in prompts]
    for p, s in zip(prompts, sinks):
        loop.submit(_spec(p), s)
    _wait(sinks)
    for p, s, want in zip(prompts, sinks, greedy):
        assert s.err is None and s.chunks == [want]
    # in-flight batching: the 16 requests shared engine steps (alone, each takes 1 + its generation steps)
    alone = sum(1 + s.final["total_draft_tokens"].reshape(-1)[0] // 7 for s in sinks)
    assert loop.steps <= alone / 4


def test_statistics_match_the_runtime_solo(loop, engine, prompts):
    """Batched with others, a greedy request has the acceptance it has alone (`dflash2-trt run`)."""
    from dflash2_trt.engine.run import run_engine

    sinks = [Sink() for _ in prompts[:6]]
    for p, s in zip(prompts, sinks):
        loop.submit(_spec(p), s)
    _wait(sinks)
    for p, s in zip(prompts, sinks):
        solo = run_engine(engine, prompt_ids=",".join(map(str, p)), max_new_tokens=MAX_NEW)["requests"][0]
        st = draft_stats(solo["acceptance_lengths"], K=7)
        got = {k: s.final[k].reshape(-1)[0].item() for k in st}
        assert got["total_accepted_draft_tokens"] == st["total_accepted_draft_tokens"]
        assert got["total_draft_tokens"] == st["total_draft_tokens"]
        assert got["acceptance_rate"] == pytest.approx(st["acceptance_rate"], rel=1e-6)
        f = s.final
        assert 0 < f["arrival_time_ns"] <= f["first_scheduled_time_ns"] <= f["first_token_time_ns"] \
            <= f["last_token_time_ns"]
        # the KV-cache statistics the model's config.pbtxt declares: the prompt + max new tokens + K + 1 slots the
        # runtime reserves at admission, in 8-token blocks here, all new
        blocks = -(-(len(p) + MAX_NEW + 8) // loop.runtime.blocks.tokens_per_block)
        assert int(f["kv_cache_alloc_new_blocks"].reshape(-1)[0]) == blocks == \
            int(f["kv_cache_alloc_total_blocks"].reshape(-1)[0])
        assert int(f["kv_cache_reused_blocks"].reshape(-1)[0]) == 0


def test_streaming_chunks_are_steps_and_concatenate(loop, prompts, greedy):
    sinks = [Sink() for _ in prompts[:5]]
    for p, s in zip(prompts, sinks):
        loop.submit(_spec(p, streaming=True), s)
    _wait(sinks)
    for s, want in zip(sinks, greedy):
        assert sum(s.chunks, []) == want
        assert len(s.chunks[0]) == 1                    # the context step: the first token
        steps = s.final["total_draft_tokens"].reshape(-1)[0] // 7
        assert len(s.chunks) == 1 + steps               # then one response per generation step
        assert all(1 <= len(c) <= 8 for c in s.chunks)


def test_late_arrivals_join_the_batch(loop, prompts, greedy):
    first = [Sink() for _ in range(4)]
    for p, s in zip(prompts, first):
        loop.submit(_spec(p, streaming=True), s)
    while not all(s.chunks for s in first):
        time.sleep(0.001)
    late = [Sink() for _ in range(4)]
    for p, s in zip(prompts[4:], late):
        loop.submit(_spec(p), s)
    _wait(first + late)
    for s, want in zip(first + late, greedy):
        assert sum(s.chunks, []) == want


def test_stop_words_cut_the_output_and_free_the_blocks(loop, prompts, greedy):
    want = greedy[0]
    word = want[5:7]
    first = next(i for i in range(len(want)) if want[i:i + 2] == word)
    sink = Sink()
    words = np.array([[word + [0], [2, -1, -1]]], dtype=np.int32)
    loop.submit(_parse({**_req(prompts[0], MAX_NEW), "stop_words_list": words}, decoupled=True), sink)
    _wait([sink])
    assert sink.chunks == [want[:first + 2]]
    free = loop.runtime.blocks.free_blocks
    assert free == loop.runtime.blocks.num_blocks


def test_exclude_input_false_returns_prompt_and_output(loop, prompts, greedy):
    sink = Sink()
    loop.submit(_spec(prompts[1], exclude_input_in_output=False), sink)
    _wait([sink])
    assert sink.chunks == [prompts[1] + greedy[1]]


def _response_facts():
    import yaml
    from pathlib import Path

    import dflash2_trt.deploy.triton.serving as serving

    return yaml.safe_load((Path(serving.__file__).parent / "tensorrtllm_backend.yaml").read_text())["responses"]


def test_a_response_is_what_tensorrt_llms_backend_sends_at_an_end_token(loop, prompts, greedy):
    """Held to the record of TensorRT-LLM's backend and EAGLE decoding (tensorrtllm_backend.yaml ``responses``): a
    request that stops at its end id gets output_ids / sequence_length without it, and num_output_tokens counts the
    tokens of each response (streamed: the step's; not streamed: all of them, the prompt too where it is included)."""
    facts = _response_facts()
    assert facts["num_output_tokens"] == "per_response"
    want = greedy[2]
    i = 6
    end = want[i]
    i = want.index(end)                                    # its first place in the output
    assert i >= 2, want                                    # a few tokens before it: something to keep
    kept = want[:i + 1] if facts["end_token_in_output"] else want[:i]
    flags = dict(end_id=np.int32(end), return_num_output_tokens=True)
    whole, streamed, with_prompt = Sink(), Sink(), Sink()
    loop.submit(_spec(prompts[2], **flags), whole)
    loop.submit(_spec(prompts[2], streaming=True, **flags), streamed)
    loop.submit(_spec(prompts[2], exclude_input_in_output=False, **flags), with_prompt)
    _wait([whole, streamed, with_prompt])
    assert whole.chunks == [kept] and int(whole.final["num_output_tokens"].reshape(-1)[0]) == len(kept)
    assert sum(streamed.chunks, []) == kept
    assert [int(n.reshape(-1)[0]) for n in streamed.counts] == [len(c) for c in streamed.chunks]
    assert with_prompt.chunks == [prompts[2] + kept]
    assert int(with_prompt.final["num_output_tokens"].reshape(-1)[0]) == len(prompts[2]) + len(kept)


def test_a_cancelled_request_is_dropped_and_the_others_finish(loop, prompts, greedy):
    gone, kept = Sink(cancel_after=1), Sink()
    loop.submit(_spec(prompts[0], streaming=True), gone)
    loop.submit(_spec(prompts[1], streaming=True), kept)
    _wait([gone, kept])
    assert gone.err == "request cancelled" and gone.final is None
    assert sum(kept.chunks, []) == greedy[1]
    deadline = time.time() + 10
    while loop.runtime.has_work and time.time() < deadline:
        time.sleep(0.01)
    assert loop.runtime.blocks.free_blocks == loop.runtime.blocks.num_blocks


def test_an_engine_failure_fails_the_batch_and_serving_goes_on(loop, prompts, greedy, monkeypatch):
    real = loop.engine.step
    calls = {"n": 0}

    def flaky(inputs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("boom")
        return real(inputs)

    monkeypatch.setattr(loop.engine, "step", flaky)
    a = Sink()
    loop.submit(_spec(prompts[0]), a)
    _wait([a])
    assert a.err is not None and "engine step failed: RuntimeError: boom" in a.err
    b = Sink()
    loop.submit(_spec(prompts[2]), b)
    _wait([b])
    assert b.err is None and b.chunks == [greedy[2]]


def test_an_error_outside_the_step_fails_the_batch_and_serving_goes_on(loop, prompts, greedy, monkeypatch):
    """Building a response (or a cancel) that raised used to end the loop's thread: every later request then waited
    forever (a non-decoupled execute() in done.wait())."""
    real = loop._tensors
    calls = {"n": 0}

    def flaky(*a):
        calls["n"] += 1
        if calls["n"] == 1:
            raise ValueError("bad response")
        return real(*a)

    monkeypatch.setattr(loop, "_tensors", flaky)
    a = Sink()
    loop.submit(_spec(prompts[0]), a)
    _wait([a])
    assert a.err == "serving loop error: ValueError: bad response" and loop._thread.is_alive()
    b = Sink()
    loop.submit(_spec(prompts[2]), b)
    _wait([b])
    assert b.err is None and b.chunks == [greedy[2]]


def test_a_request_the_runtime_cannot_take_fails_alone(loop, prompts, greedy, monkeypatch):
    real = loop.runtime.submit

    def picky(req):
        if list(req.prompt_ids) == list(prompts[0]):
            raise RuntimeError("no")
        return real(req)

    monkeypatch.setattr(loop.runtime, "submit", picky)
    a, b = Sink(), Sink()
    loop.submit(_spec(prompts[0]), a)
    loop.submit(_spec(prompts[1]), b)
    _wait([a, b])
    assert a.err == "the request could not be scheduled: RuntimeError: no"
    assert b.err is None and b.chunks == [greedy[1]]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")   # the loop's thread ends
def test_after_the_loop_ended_a_request_is_refused_not_left_waiting(cpu_engine, monkeypatch):
    lp = ServingLoop(cpu_engine, max_batch_size=16)
    try:
        def broken(*a, **kw):   # even a fresh runtime cannot be made: the thread ends
            raise MemoryError("no room")

        monkeypatch.setattr(lp, "_Runtime", broken)
        monkeypatch.setattr(lp, "_reap_cancelled", lambda: (_ for _ in ()).throw(RuntimeError("reap")))
        a = Sink()
        lp.submit(_spec((5, 6, 7)), a)
        _wait([a])
        lp._thread.join(10)
        assert not lp._thread.is_alive() and a.err is not None
        with pytest.raises(ConfigError,
                           match=r"the model's serving loop has ended \(MemoryError: no room\); restart the server"):
            lp.submit(_spec((5, 6, 7)), Sink())
    finally:
        lp.close()


def test_a_drain_finishes_what_it_can_and_ends_the_rest_with_an_error(cpu_engine, prompts, greedy, tmp_path,
                                                                     monkeypatch):
    """`serve` stopping writes the drain file: from then on no request is taken, those in flight run on, and any
    still running at the deadline ends with an error (final) instead of being cut by tritonserver's exit."""
    from dflash2_trt.deploy.triton.serving import request_drain

    real = cpu_engine.step

    def slow(inputs):               # >= 60 steps for 500 tokens: the long requests cannot finish within 1 s
        time.sleep(0.03)
        return real(inputs)

    monkeypatch.setattr(cpu_engine, "step", slow)
    drain = tmp_path / "drain"
    lp = ServingLoop(cpu_engine, max_batch_size=16, drain_file=drain)
    try:
        long = [Sink() for _ in range(3)]
        for s in long:
            lp.submit(_parse(_req((5, 6, 7), 500, end_id=np.int32(-1), streaming=True), decoupled=True), s)
        while not all(s.chunks for s in long):
            time.sleep(0.005)
        short = Sink()
        lp.submit(_parse(_req(prompts[0], 8), decoupled=True), short)
        request_drain(drain, 1.0)
        with pytest.raises(ConfigError, match="the server is shutting down: it takes no new requests"):
            lp.submit(_parse(_req()), Sink())
        t0 = time.monotonic()
        _wait(long + [short], timeout=30)
        assert time.monotonic() - t0 < 5
        assert short.err is None and short.chunks == [greedy[0][:8]]          # finished within the drain
        for s in long:
            assert s.final is None and s.err == ("the server is shutting down: the request was ended before it "
                                                 "finished (the 1 s drain timeout passed)"), s.err
            assert 0 < len(sum(s.chunks, [])) < 500
        deadline = time.time() + 10
        while lp.runtime.has_work and time.time() < deadline:
            time.sleep(0.01)
        assert lp.runtime.blocks.free_blocks == lp.runtime.blocks.num_blocks
    finally:
        lp.close()


def test_submit_checks_the_engine_limits(loop):
    long = tuple([5] * (loop.runtime.engine.limits["max_input_len"] + 1))
    with pytest.raises(ConfigError, match="max_input_len"):
        loop.submit(_parse(_req(long, 4)), Sink())
    # a client that sent no request id (Triton's request_id() is ""): "request: ...", not "request : ..." nor the
    # prompt length as if it were an id ("request 2: ...")
    for task_id in ("", None):
        with pytest.raises(ConfigError) as e:
            loop.submit(_parse(_req(long, 4)), Sink(), task_id=task_id)
        assert str(e.value).startswith(f"request: prompt of {len(long)} tokens exceeds"), e.value
    with pytest.raises(ConfigError, match="^request r7: prompt"):
        loop.submit(_parse(_req(long, 4)), Sink(), task_id="r7")
    loop.close()
    with pytest.raises(ConfigError, match="shutting down"):
        loop.submit(_parse(_req()), Sink())


@pytest.fixture(scope="module")
def short_engine(tmp_path_factory):
    """The tiny target's engine at --max-seq-len 128 --max-input-len 64: decoding up to its length limit takes a
    hundred tokens, not the 490 of the default 512 (12 s of the suite)."""
    from click.testing import CliRunner

    from dflash2_trt.cli import main
    from dflash2_trt.engine.standin.engine import open_standin_engine

    out = tmp_path_factory.mktemp("short") / "engine"
    r = CliRunner().invoke(main, ["build", "--target", "tiny", "--backend", "cpu", "--output", str(out),
                                  "--max-seq-len", "128", "--max-input-len", "64", "--max-batch-size", "4"])
    assert r.exit_code == 0, r.output
    eng, _ = open_standin_engine(out)
    yield eng
    eng.close()


def test_an_output_len_past_max_seq_len_is_shortened_as_tensorrt_llm_does(short_engine, prompts):
    """Held to the record of TensorRT-LLM's LlmRequest::validate (tensorrtllm_backend.yaml ``requests``): a
    request_output_len that does not fit max_seq_len beside the prompt and the draft slots runs shortened to what
    fits, with a line for the server's log (it was refused: a new user's report)."""
    import yaml
    from pathlib import Path

    import dflash2_trt.deploy.triton.serving as serving

    rec = yaml.safe_load((Path(serving.__file__).parent / "tensorrtllm_backend.yaml").read_text())["requests"]
    assert rec["output_len_over_max_seq_len"] == "shortened"
    notes = []
    lp = ServingLoop(short_engine, max_batch_size=4, log=notes.append)
    assert lp.runtime.max_seq_len == 128
    try:
        p = prompts[0]
        room = lp.runtime.max_seq_len - len(p) - (lp.K + 1)
        sink = Sink()
        lp.submit(_parse({**_req(p, 100_000), "end_id": np.array([[-1]], dtype=np.int32)}, decoupled=True), sink,
                  task_id="long")
        _wait([sink], timeout=300)
        assert sink.err is None and len(sink.chunks[0]) == room
        assert notes == [f"tensorrt_llm: request long: prompt ({len(p)}) + request_output_len (100000) + draft slots "
                         f"({lp.K + 1}) exceed max_seq_len {lp.runtime.max_seq_len}: request_output_len is changed "
                         f"to {room}"], notes
        # a request the runtime refuses for another reason is refused, not noted as shortened
        too_long = [5] * (lp.runtime.engine.limits["max_input_len"] + 1)
        with pytest.raises(ConfigError, match="max_input_len"):
            lp.submit(_parse(_req(too_long, 100_000)), Sink(), task_id="refused")
        assert len(notes) == 1, notes
    finally:
        lp.close()


def test_close_during_a_failing_step_ends_the_loop_at_once(cpu_engine, prompts, monkeypatch):
    """A failing step's clean-up drained the queue, close()'s end mark with it: the loop then waited for a request
    and close() for its whole timeout."""
    lp = ServingLoop(cpu_engine, max_batch_size=16)
    entered, release = threading.Event(), threading.Event()

    def failing(inputs):
        entered.set()
        release.wait(30)
        raise RuntimeError("boom")

    monkeypatch.setattr(cpu_engine, "step", failing)
    a = Sink()
    lp.submit(_spec(prompts[0]), a)
    assert entered.wait(30)
    closer = threading.Thread(target=lp.close, kwargs={"timeout": 20})
    closer.start()
    time.sleep(0.2)          # close() has put its end mark while the step still runs
    t0 = time.monotonic()
    release.set()
    closer.join(30)
    assert not lp._thread.is_alive() and time.monotonic() - t0 < 5
    assert a.err is not None and "boom" in a.err


def test_prompts_cut_in_chunks_stream_the_targets_tokens(cpu_engine, prompts, greedy):
    """With a step budget of 16 tokens at batch 2, every prompt over 16 tokens is taken in chunks (the project
    runtime's chunked context): nothing streams before its last chunk, the streamed tokens are the target's, and the
    request counts as scheduled from its first chunk (TensorRT-LLM's first_scheduled_time)."""
    loop = ServingLoop(cpu_engine, max_batch_size=2, max_num_tokens=16, chunked_context=True)
    first_chunk_step: dict[int, int] = {}     # prompt index -> when the step that took its first chunk began
    real = loop.runtime.step

    def step(on_tokens=None):
        began = time.monotonic_ns()          # after the loop's own step time: a step's times are ordered
        before = {id(r): r.context_pos for r in loop.runtime._waiting}
        before.update({id(r): r.context_pos for r in loop.runtime._context})
        out = real(on_tokens=on_tokens)
        for r in [*loop.runtime._context, *loop.runtime._active, *out]:
            if before.get(id(r)) == 0 and r.context_pos > 0:
                first_chunk_step[r.task_id] = began
        return out

    loop.runtime.step = step
    try:
        sinks = [Sink() for _ in prompts]
        for i, (p, s) in enumerate(zip(prompts, sinks)):
            loop.submit(_spec(p, streaming=True), s, task_id=i)
        _wait(sinks)
        assert any(st.get("cut") for st in loop.runtime.step_log)
    finally:
        loop.close()
    long = [i for i, p in enumerate(prompts) if len(p) > 16]
    assert long
    for i, (s, want) in enumerate(zip(sinks, greedy)):
        assert s.err is None and sum(s.chunks, []) == want and len(s.chunks[0]) == 1
        f = {k: int(s.final[k].reshape(-1)[0]) for k in ("first_scheduled_time_ns", "first_token_time_ns")}
        assert f["first_scheduled_time_ns"] <= f["first_token_time_ns"]
        if i in long:
            # scheduled from the step of its first chunk (the loop stamps a step's time before it runs), not from the
            # later step of its last chunk, which emitted its first token
            assert f["first_scheduled_time_ns"] <= first_chunk_step[i], i


def test_enable_chunked_context_false_refuses_a_prompt_over_the_budget(cpu_engine, prompts):
    """The python model's enable_chunked_context "false" (the tensorrtllm backend's parameter name): a prompt over
    max_num_tokens is refused at submission (the others are served), as a runtime without chunking refuses it."""
    loop = ServingLoop(cpu_engine, max_batch_size=2, max_num_tokens=16, chunked_context=False,
                       chunked_context_switch='config.pbtxt enable_chunked_context "false"')
    try:
        long = next(p for p in prompts if len(p) > 16)
        with pytest.raises(ConfigError, match=r"exceeds max_num_tokens 16 \(a prompt is taken whole in one step: "
                                              r"chunked context is off \(config.pbtxt enable_chunked_context "
                                              r"\"false\"\); an engine built with --max-num-tokens \d+ or more takes "
                                              r"it whole\)"):
            loop.submit(_spec(long), Sink())
        short = next(p for p in prompts if len(p) <= 16)
        s = Sink()
        loop.submit(_spec(short), s)
        _wait([s])
        assert s.err is None
    finally:
        loop.close()
