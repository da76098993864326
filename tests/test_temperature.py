"""The temperature boundary (issue 21 item 8): a positive temperature below 1e-5 decodes greedily
(``dflash2_trt/sampling.py``) in ``run``, ``bench run``, ``generate``, ``analyze`` and the Triton model's
request parsing / serving loop; 1e-5 itself samples and stays sane. Before, ``1e-45`` passed the checks
and sampled from a NaN softmax: 64 x token 0 from ``run``, an all-zero ``bench run``, an IndexError from
``generate``."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from dflash2_trt.assets import trained_pair
from dflash2_trt.cli import main
from dflash2_trt.errors import ConfigError
from dflash2_trt.sampling import FLT_MAX, GREEDY_BELOW, effective_temperature

PROMPT = "187,95,235,168,53,118"
TINY = ["1e-45", "1e-38", "9.9e-06"]


def _cli(*args):
    r = CliRunner().invoke(main, [str(a) for a in args])
    return r.exit_code, r.output


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    out = tmp_path_factory.mktemp("temperature") / "E"
    code, text = _cli("build", "--target", "tiny", "--backend", "cpu", "--output", out, "--no-verify")
    assert code == 0, text
    return out


def test_the_rule():
    assert f"{GREEDY_BELOW:g}" == "1e-05" and GREEDY_BELOW == float(np.float32(1e-5))
    for t in (0.0, 1e-45, 1e-38, 9.99e-6):
        assert effective_temperature(t) == 0.0
    for t in (1e-5, float(np.float32(1e-5)), 0.5, 3.0e38):
        assert effective_temperature(t) == t
    for bad in (-1e-45, float("nan"), float("inf"), "x", None):
        with pytest.raises(ConfigError, match="^--temperature: must be a finite number >= 0"):
            effective_temperature(bad)
    # finite in float64, inf in the engine's float32 (logits / inf: uniform sampling); TensorRT-LLM takes (0, FLT_MAX]
    assert effective_temperature(FLT_MAX) == FLT_MAX == float(np.finfo(np.float32).max)
    assert effective_temperature("3.4028235e38") > FLT_MAX          # numpy's print of FLT_MAX: FLT_MAX in float32
    for big in (1e39, 1e300, 3.4028236e38):                         # inf in float32
        with pytest.raises(ConfigError, match=r"^--temperature: must be at most 3\.4028234663852886e\+38 \(FLT_MAX"):
            effective_temperature(big)
    with pytest.raises(ConfigError, match="^--temperature: must be a finite number"):
        effective_temperature(10 ** 400)                             # too large for a float at all


def _run_ids(engine, t):
    code, text = _cli("run", "--engine-dir", engine, "--prompt-ids", PROMPT, "--max-new-tokens", 24, "--temperature", t,
                      "--json")
    assert code == 0, text
    rep = json.loads(text)
    return rep["requests"][0]["output_ids"], rep


def test_run_tiny_temperatures_are_greedy(engine):
    greedy, _ = _run_ids(engine, 0)
    assert len(set(greedy)) > 3                                   # a real continuation, not one repeated id
    for t in TINY:
        ids, rep = _run_ids(engine, t)
        assert ids == greedy, t
        assert rep["temperature"] == 0.0
    ids, rep = _run_ids(engine, "1e-5")                          # the smallest sampled temperature: sane
    assert rep["temperature"] == 1e-5 and ids == greedy          # (one-hot in practice, measured on this pair)


def test_bench_run_tiny_temperature_is_greedy(engine, tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"task_id": i, "input_ids": [5 + i, 6, 7, 9], "output_tokens": 12}) + "\n"
                            for i in range(3)))
    outs = {}
    for t in ("0", "1e-45"):
        rep = tmp_path / f"r{t}.json"
        code, text = _cli("bench", "run", "--engine-dir", engine, "--dataset", data, "--concurrency", 2,
                          "--temperature", t, "--json", rep, "--no-progress", "--save-outputs")
        assert code == 0, text
        doc = json.loads(rep.read_text())
        outs[t] = doc
    a, b = outs["0"], outs["1e-45"]
    assert b["settings"]["temperature"] == 0.0
    assert b["runs"][0]["outputs_match"] is True                 # greedy: speculative == autoregressive
    spec = lambda doc: doc["runs"][0]["speculative"]["outputs"]   # noqa: E731
    assert spec(b) == spec(a) and any(len(set(o["output_ids"])) > 3 for o in spec(a))


def test_generate_tiny_temperature_is_greedy_and_sample_needs_a_real_one():
    pair = trained_pair("qwen3")
    dirs = ["--drafter", pair.drafter_dir, "--target-dir", pair.target_dir, "--prompt-ids", PROMPT,
            "--max-new-tokens", 12, "--json"]
    doc = lambda text: json.loads(text[text.index("{\n"):])   # noqa: E731 (after any progress bar)
    code, text = _cli("generate", *dirs)
    assert code == 0, text
    greedy = doc(text)
    code, text = _cli("generate", *dirs, "--temperature", "1e-45")      # was an IndexError traceback
    assert code == 0, text
    tiny = doc(text)
    assert tiny["output_ids"] == greedy["output_ids"] and len(set(greedy["output_ids"])) > 3
    assert tiny["selector"] == "greedy" and tiny["temperature"] == 0.0
    code, text = _cli("generate", *dirs, "--temperature", "1e-45", "--selector", "sample")
    lines = [ln for ln in text.splitlines() if ln.startswith("error")]
    assert code == 1 and len(lines) == 1 and "--selector" in lines[0] and "1e-05" in lines[0], text


def test_analyze_refuses_a_temperature_that_would_not_sample():
    pair = trained_pair("qwen3")
    code, text = _cli("analyze", "--drafter", pair.drafter_dir, "--target-dir", pair.target_dir, "--temperature",
                      "1e-45", "--no-measure", "--max-prompts", 1)
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert code == 1 and len(lines) == 1 and "--temperature" in lines[0] and "1e-05" in lines[0], text


def test_triton_model_request_and_serving_loop(engine):
    """The python-backend tensorrt_llm model's parsing (HTTP / gRPC requests arrive here) and its loop."""
    from dflash2_trt.deploy.triton.serving import ServingLoop, parse_request
    from dflash2_trt.engine.standin.engine import open_standin_engine

    def req(t):
        ids = [int(x) for x in PROMPT.split(",")]
        return {"input_ids": np.array([ids], dtype=np.int32), "input_lengths": np.array([[len(ids)]], dtype=np.int32),
                "request_output_len": np.array([[16]], dtype=np.int32),
                "temperature": np.array([[t]], dtype=np.float32)}

    # taken as TensorRT-LLM's backend takes it (engine_io.yaml request_temperature): a tiny positive temperature
    # passes unchanged, and the engine decodes it greedily
    spec = parse_request(req(1e-45), vocab_size=256, eos_token_ids=(2,))
    assert 0 < spec.temperature < 1e-44
    assert parse_request(req(1e-5), vocab_size=256, eos_token_ids=(2,)).temperature == pytest.approx(1e-5)

    from dflash2_trt.testing.serving import CollectingSink as Sink

    eng, _ = open_standin_engine(engine)
    loop = ServingLoop(eng, max_batch_size=4)
    try:
        from dataclasses import replace

        sinks = {}
        for name, t in (("greedy", 0.0), ("tiny", 1e-45)):
            s = Sink()
            # the Spec with the temperature as given: the runtime and the engine must decode it greedily
            loop.submit(replace(parse_request(req(1.0), vocab_size=256, eos_token_ids=(2,)), temperature=t), s)
            sinks[name] = s
        for s in sinks.values():
            assert s.done.wait(120) and s.err is None
        assert sinks["tiny"].ids == sinks["greedy"].ids and len(set(sinks["greedy"].ids)) > 3
    finally:
        loop.close()
        eng.close()


def test_the_request_temperature_rules_follow_the_recorded_tensorrt_llm_facts():
    """sampling.py's constants and check_request_temperature against engine_io.yaml request_temperature (read in
    TensorRT-LLM's sources): unset is decoded at the recorded default, greedy is sent inside the EAGLE layer's
    (0, FLT_MAX] range and below the engine's greedy threshold, and what that range excludes is refused."""
    import yaml

    from dflash2_trt.sampling import (GREEDY_REQUEST_TEMPERATURE, TRTLLM_DEFAULT_TEMPERATURE,
                                      check_request_temperature, request_temperature)
    from dflash2_trt.trtllm.engine_io import CONTRACT

    rule = yaml.safe_load(CONTRACT.read_text(encoding="utf-8"))["request_temperature"]
    rng = rule["eagle_layer_range"]
    assert TRTLLM_DEFAULT_TEMPERATURE == rule["default_when_unset"]
    assert not rng["low_inclusive"] and rng["high_inclusive"] and rng["low"] == 0.0

    def inside(t):
        return rng["low"] < t <= rng["high"]

    g32 = float(np.float32(GREEDY_REQUEST_TEMPERATURE))
    assert inside(g32) and g32 < GREEDY_BELOW
    for t in (0, "0", 1e-45, 1e-6, 9.9e-6):                  # every greedy request temperature is a valid one
        r = request_temperature(t)
        assert inside(r) and r < GREEDY_BELOW
    assert request_temperature(0.7) == 0.7 and request_temperature(GREEDY_BELOW) == GREEDY_BELOW
    for t in (1e-45, 1e-6, 0.7, 3.0e38):
        assert check_request_temperature(t) == t and inside(t)
    with pytest.raises(ConfigError, match=r"temperature: 0 is refused .*\(temperature penalty param \(0\.000000\)"):
        check_request_temperature(0.0)
    assert not inside(float("inf")) and not inside(0.0)
    for bad in (float("inf"), -1.0, float("nan"), "x"):
        with pytest.raises(ConfigError, match="temperature"):
            check_request_temperature(bad)


def test_the_greedy_boundary_is_compared_in_float32():
    """The engine compares its fp32 eagle_temperature with 1e-5 as float32: a float64 temperature just below 1e-5
    that rounds to 1e-5 in float32 samples there, so the host must not call it greedy."""
    import struct

    just_below = 9.999999520005076e-06
    assert just_below < GREEDY_BELOW and struct.unpack("<f", struct.pack("<f", just_below))[0] == GREEDY_BELOW
    assert effective_temperature(just_below) == just_below
    assert effective_temperature(9.99e-06) == 0.0
