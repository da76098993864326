"""The cuda backend on a machine without a GPU: how a backend is picked, where the stand-in puts each tensor when the
engine runs on a device (checked on torch's ``meta`` device, which holds no data: a tensor left on the host where the
device was meant, or moved where the host was meant, shows), the random weights of ``bench steps``, and the
refusals (``build --backend cuda`` and a cuda engine directory without a GPU: one line, nothing written). On a GPU
the same backend runs end to end in tests/gpu/test_cuda_engine.py and scripts/gpu_e2e.py."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
import torch

from dflash2_trt.errors import ConfigError
from dflash2_trt.testing.cli import cli as _cli
from dflash2_trt.testing.cli import one_error_line as _one_error_line
from dflash2_trt.trtllm import backend
from dflash2_trt.trtllm.cpu import functional as F
from dflash2_trt.trtllm.cpu.tensor import align, network_input, on_device

NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: the no-GPU refusal is not exercised")


def test_auto_picks_trtllm_then_cuda_then_cpu(monkeypatch):
    monkeypatch.delenv("DFLASH2_TRT_BACKEND", raising=False)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: object() if n == "tensorrt_llm" else real(n, *a))
    assert backend.resolve("auto") == "trtllm"
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "tensorrt_llm" else real(n, *a))
    monkeypatch.setattr(backend, "cuda_available", lambda: True)
    assert backend.resolve("auto") == "cuda"
    monkeypatch.setattr(backend, "cuda_available", lambda: False)
    assert backend.resolve("auto") == "cpu"
    assert backend.resolve("cuda") == "cuda"
    with pytest.raises(Exception, match="expected auto, cpu, cuda, trtllm"):
        backend.resolve("gpu")


def test_the_cuda_network_is_the_same_package_with_the_cuda_plugins():
    cpu, cuda = backend.load_network("cpu"), backend.load_network("cuda")
    assert cpu is not cuda and cuda.api.name == "cuda" and type(cuda.api.plugins).__name__ == "CudaPlugins"
    assert cuda.api.functional is cpu.api.functional           # one stand-in, two devices
    assert {n for n in dir(cpu) if not n.startswith("_")} == {n for n in dir(cuda) if not n.startswith("_")}


def test_constants_are_made_on_the_engine_device_and_shapes_stay_on_the_host():
    dev = torch.device("meta")
    with on_device(dev):
        x = F.constant(np.zeros((3, 4), np.float32))
        assert x.device == dev and F.arange(0, 5, "int32").device == dev
        n = F.shape(x, 0)
        assert n.device.type == "cpu"                                    # a shape tensor: host
        assert F.concat([n, 4]).device.type == "cpu"                     # shape math stays on the host
        assert (x + 1.0).device == dev and (x * 2.0).dtype == torch.float32
        host = network_input(torch.tensor([1, 0], dtype=torch.int32), "host_request_types", "host")
        dev_in = torch.zeros(2, dtype=torch.int32, device=dev)
        assert F.where(F.eq(host, 0), 7, dev_in).device == dev           # a host input meeting device data moves
        assert (dev_in + host).device == dev
        big = np.ones((1, 1 << 15), np.float32)                          # >= 64 KiB: its device copy is kept
        first = F.constant(big)
        assert first.device == dev and not big.flags.writeable
        assert F.constant(big).data_ptr() == first.data_ptr()            # the same device copy, not a new one
        assert F.constant(np.array(3, np.int32)).device.type == "cpu"    # a 0-D constant (a bound) stays on the host
    assert F.constant(np.zeros(2, np.float32)).device.type == "cpu"      # outside a step: the CPU
    assert align(torch.zeros(1), torch.zeros(1, device=dev))[0].device == dev


def test_feed_placement_follows_the_contract():
    """Host inputs stay in host memory, every other input goes to the engine's device (engine_io.yaml memory)."""
    from dflash2_trt.engine.standin.engine import placed_inputs

    feed = {"input_ids": torch.zeros(3, dtype=torch.int32), "host_request_types": torch.zeros(1, dtype=torch.int32),
            "sequence_length": torch.zeros(1, dtype=torch.int32), "rnn_state_ptr_0": torch.zeros(1, dtype=torch.int64),
            "host_kv_cache_pool_pointers": torch.zeros(1, 2, dtype=torch.int64),
            "spec_decoding_use": torch.ones(1, dtype=torch.int32)}
    out = placed_inputs(feed, torch.device("meta"))
    where = {k: v.device.type for k, v in out.items()}
    assert where == {"input_ids": "meta", "host_request_types": "cpu", "sequence_length": "meta",
                     "rnn_state_ptr_0": "cpu", "host_kv_cache_pool_pointers": "cpu", "spec_decoding_use": "cpu"}
    assert all(v.is_network_input and v.input_name == k for k, v in out.items())


@NO_GPU
def test_build_cuda_without_a_gpu_is_one_line_and_writes_nothing(tmp_path, monkeypatch):
    out = tmp_path / "eng"
    line = _one_error_line(*_cli("build", "--target", "tiny", "--backend", "cuda", "--output", str(out)))
    assert "the cuda backend needs a CUDA GPU" in line and "build with --backend cpu" in line
    assert not out.exists() and list(tmp_path.iterdir()) == []
    # before the checkpoints are found or downloaded: a published pair's 57 GB came first, then the refusal
    import dflash2_trt.cli as cli_mod

    def no_download(*a, **k):
        raise AssertionError("the pair was resolved (downloaded) before the GPU check")

    monkeypatch.setattr(cli_mod, "resolve_pair", no_download)
    line = _one_error_line(*_cli("build", "--target", "qwen3.8-27b", "--backend", "cuda", "--download", "--output",
                                 str(out)))
    assert "the cuda backend needs a CUDA GPU" in line and not out.exists()


@NO_GPU
def test_a_cuda_engine_directory_without_a_gpu_is_one_line(tmp_path):
    from dflash2_trt.assets import trained_pair
    from dflash2_trt.engine.plan import prepare
    from dflash2_trt.engine.standin.build import build_standin

    pair = trained_pair("qwen3")
    out = tmp_path / "eng"
    prep = prepare(pair.drafter_dir, pair.target_dir, target_key="tiny", overrides={"block_size": 4})
    build_standin(prep, out, backend="cuda")          # what a GPU machine writes (the build itself needs no GPU)
    man = json.loads((out / "engine.json").read_text())
    cfg = json.loads((out / "config.json").read_text())
    assert man["backend"] == "cuda" and cfg["backend"] == "cuda"
    # its pool is sized from the GPU's free memory when it opens: the build's fraction is recorded for it
    fraction = cfg["build_config"]["kv_cache_free_gpu_mem_fraction"]
    assert fraction == man["limits"]["kv_cache_free_gpu_mem_fraction"] == 0.9
    line = _one_error_line(*_cli("run", "--engine-dir", str(out), "--prompt-ids", "5,6,7"))
    assert "needs a CUDA GPU" in line and "build with --backend cpu" in line
    # serve: before tritonserver starts (its model failed in the server's log, ten lines and seconds later)
    line = _one_error_line(*_cli("serve", "--engine-dir", str(out)))
    assert "needs a CUDA GPU" in line
    data = tmp_path / "d.jsonl"
    data.write_text('{"task_id": 0, "input_ids": [5, 6, 7], "output_tokens": 4}\n')
    line = _one_error_line(*_cli("bench", "run", "--engine-dir", str(out), "--dataset", str(data), "--backend", "cpu"))
    assert "is a cuda engine" in line
    line = _one_error_line(*_cli("bench", "run", "--engine-dir", str(out), "--dataset", str(data)))
    assert "needs a CUDA GPU" in line
    # deploy triton (served elsewhere): the python model gets the fraction, the build's or the option's
    for extra, want in (((), "0.9"), (("--kv-cache-free-gpu-mem-fraction", "0.5"), "0.5")):
        repo = tmp_path / f"repo{want}"
        code, text = _cli("deploy", "triton", "--engine-dir", str(out), "--output", str(repo), "--ids-only", *extra)
        assert code == 0, text
        pbtxt = (repo / "tensorrt_llm" / "config.pbtxt").read_text()
        assert 'key: "kv_cache_free_gpu_mem_fraction"' in pbtxt and f'string_value: "{want}"' in pbtxt, pbtxt
    # a fraction out of range is one line before any GPU is looked for
    from dflash2_trt.engine.standin.engine import open_standin_engine

    for bad in (1.5, 1.0):   # TensorRT-LLM's KV cache manager refuses 1 too (freeMemFraction < 1)
        with pytest.raises(ConfigError, match=f"kv_cache_free_gpu_mem_fraction: must be a number in \\(0, 1\\) "
                                              f".*got {bad}"):
            open_standin_engine(out, kv_cache_fraction=bad)


def test_dry_run_plans_the_cuda_build(tmp_path):
    code, text = _cli("build", "--target", "tiny", "--backend", "cuda", "--dry-run", "--json")
    assert code == 0, text
    plan = json.loads(text)
    assert plan["backend"] == "cuda" and plan["trtllm_build"] is None
    assert [s["step"] for s in plan["steps"]] == ["validate", "convert", "plugins", "engine", "verify"]
    assert "nvcc" in plan["steps"][2]["what"] and "not a TensorRT engine" in plan["steps"][3]["what"]
    if not torch.cuda.is_available():
        assert any("CUDA GPU" in m for m in plan["machine"]["missing"])


def test_random_weights_have_the_norms_and_gates_in_range():
    from dflash2_trt.bench.steps import config_dirs
    from dflash2_trt.engine.plan import prepare
    from dflash2_trt.engine.pretrained import engine_pretrained_config
    from dflash2_trt.engine.standin.engine import random_weights

    net = backend.load_network("cpu")
    d, t = config_dirs("tiny-hybrid")
    prep = prepare(d, t, target_key="tiny-hybrid")
    cfg = net.api.PretrainedConfig.from_dict(engine_pretrained_config(prep.checkpoint_config, prep.cfg, prep.d))
    model = net.DFlash2ForCausalLM(cfg)
    random_weights(model, 0, torch.device("cpu"))
    params = {n: p.value.as_subclass(torch.Tensor) for n, p in model.named_parameters()}
    offsets = [n for n, m in model.named_modules() if getattr(m, "offset", 0.0)]
    assert offsets and all(torch.equal(params[f"{n}.weight"], torch.zeros_like(params[f"{n}.weight"])) for n in offsets)
    a_log = [v for n, v in params.items() if n.endswith("A_log")]
    assert a_log and all(0 <= float(v.min()) and float(v.max()) <= 2 for v in a_log)
    assert params["lm_head.weight"].float().std() < 1.0


def test_bench_steps_on_the_cpu_backend():
    """The real-width step timing's code path on a tiny target: every component is attributed and the speedup is the
    acceptance length times the ratio of the steps."""
    from dflash2_trt.bench.steps import COMPONENTS, measure_steps, render

    doc = measure_steps("tiny", backend="cpu", concurrency="1,2", context_len=12, steps=1, warmup=0,
                        profile_steps=1, acceptance=3.0)
    assert doc["backend"] == "cpu" and doc["weights"].startswith("random") and doc["draft_len"] == 7
    assert doc["sliding_path"] == "generation"            # tiny: no sliding-window layers
    for p in doc["points"]:
        sp, ar = p["speculative"], p["target_only"]
        assert sp["tokens_per_step"] == p["concurrency"] * 8 and ar["tokens_per_step"] == p["concurrency"]
        assert set(sp["spans_ms"]) == set(COMPONENTS) and sp["spans_ms"]["drafter"] > 0
        assert ar["spans_ms"]["drafter"] == 0 and ar["spans_ms"]["selector"] == 0
        assert p["speedup_wall"] == pytest.approx(3.0 * ar["wall_ms"] / sp["wall_ms"])
        # the dispatched operators: the speculative step (drafter, selector, accept) has more than the target's own
        assert sp["ops_per_step"] > ar["ops_per_step"] > 100
    assert "BENCH STEPS tiny" in render(doc)


def test_adopt_places_a_request_in_the_generation_phase():
    from dflash2_trt.bench.steps import step_engines
    from dflash2_trt.runtime import Request, Runtime

    eng, _ = step_engines("tiny-hybrid", backend="cpu", max_batch=2, context_len=10)
    try:
        rt = Runtime(eng)
        r = rt.adopt(Request([3] * 10, 5, seed=1), 4)
        assert r.output_ids == [4] and r.committed == 10 and r.slot is not None
        feed = rt.step_inputs([], rt.generating)
        assert feed["input_ids"].tolist() == [4] + [eng.mask_token_id] * eng.K
        assert feed["sequence_length"].tolist() == [10 + eng.K + 1] and feed["host_past_key_value_lengths"].tolist() == [10]
        out = eng.step(feed)
        assert out["accepted_tokens"].device.type == "cpu" and 1 <= int(out["num_accepted_tokens"][0]) <= eng.K + 1
        rt.cancel(r)
        assert rt.blocks.free_blocks == rt.blocks.num_blocks
    finally:
        eng.close()


def test_offsets_not_in_trtllms_index_are_refused_on_the_cpu_too(tmp_path):
    """The runtime writes TensorRT-LLM's block index (block * layers * 2 + field); the old form (2 * block + field,
    what it wrote before the pool took TensorRT-LLM's layout) would alias other blocks' layers: refused on the CPU
    backend as on the GPU, from the host copy of the offsets."""
    from dflash2_trt.engine.standin.engine import open_standin_engine
    from dflash2_trt.runtime import Request, Runtime

    code, text = _cli("build", "--target", "tiny", "--backend", "cpu", "--output", str(tmp_path / "e"),
                      "--block-size", "4", "--no-verify")
    assert code == 0, text
    eng, _ = open_standin_engine(tmp_path / "e")
    try:
        rt = Runtime(eng)
        assert rt.blocks.layers == eng.num_layers > 1
        rt.blocks.layers = 1
        with pytest.raises(IndexError, match="not TensorRT-LLM's index"):
            rt.generate([Request(list(range(5, 40)), 3)])
    finally:
        eng.close()


def test_kernel_time_is_split_once_per_kernel():
    """bench steps' attribution on made-up profiler events: a kernel launched by a torch op goes to the component
    whose scope encloses the op, a plugin kernel no op launched goes to its plugin's component by name, each kernel
    is counted once, and the rest is the total minus the components."""
    from types import SimpleNamespace as NS

    from dflash2_trt.bench.steps import _kernel_split_ms, plugin_component

    cpu, cuda = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA

    def ev(name, device, parent=None, kernels=(), us=0.0):
        return NS(name=name, device_type=device, cpu_parent=parent, kernels=list(kernels),
                  time_range=NS(elapsed_us=lambda: us))

    scope = ev("dflash2::attention", cpu)
    mm = ev("aten::bmm", cpu, parent=scope, kernels=[NS(name="sm90_gemm", duration=30.0)])
    add = ev("aten::add", cpu, kernels=[NS(name="elementwise", duration=5.0)])          # outside every scope: rest
    events = [scope, mm, add, ev("dflash2::attention", cuda, us=40.0),                   # a GPU annotation: not a kernel
              ev("sm90_gemm", cuda, us=30.0), ev("elementwise", cuda, us=5.0),
              ev("void dflash2::(anonymous namespace)::gdnRecurrentKernel<128>", cuda, us=100.0),
              ev("void dflash2::(anonymous namespace)::pairwiseScanKernel<float>", cuda, us=7.0)]
    total, comp = _kernel_split_ms(NS(events=lambda: events), steps=1)
    assert total == pytest.approx(0.142)                        # 30 + 5 + 100 + 7 us, in ms
    assert comp["attention"] == pytest.approx(0.030) and comp["gdn"] == pytest.approx(0.100)
    assert comp["selector"] == pytest.approx(0.007) and comp["rest"] == pytest.approx(0.005)
    assert plugin_component("ampere_sgemm") is None and plugin_component("dflash2::dynamicConvKernel") == "drafter"


def test_the_dry_run_sizes_what_a_standin_engine_allocates(tmp_path, monkeypatch):
    """A cpu or cuda engine allocates its own pool (every rank in one process): the plan's ``standin`` figures equal the
    bytes a tiny hybrid tp 2 engine really allocates; a cuda engine sizes its pool from the GPU memory free once its
    weights and slots are in, as TensorRT-LLM does (kv_cache_free_gpu_mem_fraction), and the engine's own sizing
    (its free_memory played here) gives the plan's block count. For qwen3.8-27b on an H200 the default pool is
    cut to what fits (before: every request at max_seq_len, 274 GiB, which a GPU run would have met as an
    out-of-memory error at open)."""
    from dflash2_trt.assets import trained_pair
    from dflash2_trt.engine.standin.engine import open_standin_engine

    pair = trained_pair("qwen3_5")
    args = ["--drafter", str(pair.drafter_dir), "--target-dir", str(pair.target_dir), "--backend", "cpu",
            "--tp-size", "2", "--max-batch-size", "3"]
    code, text = _cli("build", *args, "--dry-run", "--json")
    assert code == 0, text
    m = json.loads(text)["sizing"]["standin"]
    out = tmp_path / "eng"
    code, text = _cli("build", *args, "--output", str(out), "--no-verify")
    assert code == 0, text
    eng, _ = open_standin_engine(out)
    try:
        pools = sum(p.data.numel() * p.data.element_size() for p in eng.pools)
        states = sum(t.numel() * t.element_size() for r in eng.states for sp in r.values() for t in (sp.rnn, sp.conv))
        assert (m["num_kv_blocks"], m["kv_pool"], m["state_slots"]) == (eng.num_blocks, pools, states)
        assert m["ranks_on_one_device"] == 2 and states > 0 and m["fits"] is None   # cpu: no GPU verdict
        assert eng.pool_sizing["rule"] == "every request at max_seq_len" and not m["sized_from_free_memory"]
        # the cuda sizing of the same engine: what the dry run plans for a GPU with F bytes free at open is what the
        # engine takes when CUDA reports F (the plan: 0.9 x F over the bytes of one block index in both ranks' pools)
        assert eng.kv_block_bytes * eng.num_blocks == pools
        gib = (m["weights"] + m["state_slots"] + 2 ** 30 + 60.5 * eng.kv_block_bytes) / 2 ** 30   # 60.5 blocks free
        code, text = _cli("build", *args[:4], "--backend", "cuda", *args[6:], "--dry-run", "--json",
                          "--gpu-memory-gib", repr(gib), "--set", "kv_cache_free_gpu_mem_fraction=0.5")
        c = json.loads(text[text.index("{"):])["sizing"]["standin"]
        assert c["sized_from_free_memory"] and c["num_kv_blocks"] == 30 < m["num_kv_blocks"], c
        free = int(gib * 2 ** 30) - c["weights"] - c["state_slots"] - 2 ** 30
    finally:
        eng.close()
    # the engine's own sizing, through its constructor: CUDA's free count played by free_memory (the one thing a GPU
    # would give); the pool it allocates is the plan's
    from dflash2_trt.engine.format import load_engine_dir
    from dflash2_trt.engine.standin.engine import StandinEngine, limits_from
    from dflash2_trt.trtllm.cpu.attention import KVCachePool

    cfg, _ = load_engine_dir(out)
    pre = cfg["pretrained_config"]
    limits = limits_from({**cfg["build_config"], "kv_cache_free_gpu_mem_fraction": 0.5}, pre)
    eng = StandinEngine(pre, out / "checkpoint", limits, free_memory=lambda device: free)
    try:
        assert eng.num_blocks == c["num_kv_blocks"] == 30 == eng.pools[0].data.shape[0] == eng.pools[1].data.shape[0]
        assert eng.pool_sizing == {"num_kv_blocks": 30, "every_request_blocks": 48, "rule": "free GPU memory",
                                   "free_bytes": free, "fraction": 0.5, "block_bytes": eng.kv_block_bytes}
    finally:
        eng.close()
    eng = StandinEngine(pre, out / "checkpoint", limits, free_memory=lambda device: 2 ** 40)
    eng.close()
    assert eng.num_blocks == 48                     # never more than every request at max_seq_len needs
    pools = len(KVCachePool._registry)
    with pytest.raises(ConfigError, match=r"kv_cache_free_gpu_mem_fraction: no room for the KV pool: 0.5 of the 0.00 "
                                          r"GiB free .* holds 8 blocks .* needs 16: a build with a lower "
                                          r"--max-batch-size \(its 3 state slots\) or --max-seq-len, or a GPU with "
                                          r"more memory"):
        StandinEngine(pre, out / "checkpoint", limits, free_memory=lambda device: 16 * eng.kv_block_bytes)
    with pytest.raises(ConfigError, match=r"holds 10 blocks .* needs 16: a fraction of at least 0.8 \(build --set "
                                          r"kv_cache_free_gpu_mem_fraction=F, or deploy triton"):
        StandinEngine(pre, out / "checkpoint", limits, free_memory=lambda device: 20 * eng.kv_block_bytes)
    assert len(KVCachePool._registry) == pools      # nothing left allocated
    code, text = _cli("build", "--target", "qwen3.8-27b", "--backend", "cuda", "--dry-run", "--json")
    z = json.loads(text[text.index("\n{") + 1:])["sizing"]   # after the notes: configs shipped, no weights
    s = z["standin"]
    free = z["gpu_memory_bytes"] - s["weights"] - s["state_slots"] - 2 ** 30
    block = s["kv_pool"] // s["num_kv_blocks"]
    assert code == 0 and s["fits"] is True and s["sized_from_free_memory"], text
    assert s["num_kv_blocks"] == int(free * 0.9) // block and s["full_length_requests"] == 20
    n = s["num_kv_blocks_that_fit"]
    assert n >= s["num_kv_blocks"]
    for blocks, fits in ((n, True), (n + 1, False)):
        code, text = _cli("build", "--target", "qwen3.8-27b", "--backend", "cuda", "--dry-run", "--json", "--set",
                          f"num_kv_blocks={blocks}")
        got = json.loads(text[text.index("\n{") + 1:])["sizing"]["standin"]
        assert got["fits"] is fits and got["num_kv_blocks"] == blocks and not got["sized_from_free_memory"], blocks
    code, text = _cli("build", "--target", "qwen3.8-27b", "--backend", "cuda", "--dry-run")
    assert ("(26,601 blocks: kv_cache_free_gpu_mem_fraction 0.9 of the memory free once the weights and state slots "
            "are in, at most enough for max_batch_size 64 x max_seq_len 40960, as TensorRT-LLM sizes its pool)") in text
    assert ("fits the GPU's 140.4 GiB with the activations and reserve above; 20 requests at max_seq_len at once (the "
            "others of max_batch_size 64 wait for blocks)") in text
    code, text = _cli("build", "--target", "qwen3.8-27b", "--backend", "cuda", "--dry-run", "--gpu-memory-gib", "66")
    assert ("does NOT fit the GPU's 66 GiB with the activations and reserve above: not one request at max_seq_len "
            "(1,280 blocks) fits beside the weights, the state slots and the activations: lower "
            "--max-batch-size") in text
    # a fraction too small for one request: the plan names one that works (not "no request fits")
    code, text = _cli("build", "--target", "qwen3.8-27b", "--backend", "cuda", "--dry-run", "--gpu-memory-gib", "80",
                      "--set", "kv_cache_free_gpu_mem_fraction=0.2")
    assert "the pool at 0.2 holds no request at max_seq_len: --set kv_cache_free_gpu_mem_fraction=0.89 fits" in text
    code, text = _cli("build", "--target", "qwen3.8-27b", "--backend", "cuda", "--dry-run", "--set",
                      "num_kv_blocks=100", "--json")
    z = json.loads(text[text.index("\n{") + 1:])["sizing"]["standin"]
    assert z["fits"] is False and z["num_kv_blocks"] == 100 < z["one_request_blocks"] == 1280
    code, text = _cli("build", "--target", "qwen3.8-27b", "--backend", "cuda", "--dry-run", "--set",
                      "num_kv_blocks=100")
    assert "holds NO request at max_seq_len: num_kv_blocks 100 is 3,200 tokens, and a request longer than that" in text
    # an H100: 0.9 of what is free leaves less than the activations' estimate; the fraction that does is named
    code, text = _cli("build", "--target", "qwen3.8-27b", "--backend", "cuda", "--dry-run", "--json",
                      "--gpu-memory-gib", "80")
    s = json.loads(text[text.index("\n{") + 1:])["sizing"]["standin"]
    f = s["fraction_that_fits"]
    assert s["fits"] is False and 0.5 < f < 0.9, s
    for frac, fits in ((f, True), (f + 0.01, False)):
        code, text = _cli("build", "--target", "qwen3.8-27b", "--backend", "cuda", "--dry-run", "--json",
                          "--gpu-memory-gib", "80", "--set", f"kv_cache_free_gpu_mem_fraction={frac:g}")
        assert json.loads(text[text.index("\n{") + 1:])["sizing"]["standin"]["fits"] is fits, frac
    code, text = _cli("build", "--target", "qwen3.8-27b", "--backend", "cuda", "--dry-run", "--gpu-memory-gib", "80")
    assert (f"the pool at 0.9 leaves too little for the activations: --set kv_cache_free_gpu_mem_fraction={f:g} "
            f"fits") in text

def test_run_reports_how_the_pool_was_sized(tmp_path):
    """`run`'s report carries the pool's sizing; a cuda engine's (from free GPU memory) is also a line of its text."""
    from dflash2_trt.engine.run import render

    out = tmp_path / "eng"
    code, text = _cli("build", "--target", "tiny", "--output", str(out), "--no-verify", "--max-batch-size", "2")
    assert code == 0, text
    code, text = _cli("run", "--engine-dir", str(out), "--prompt-ids", "5,6,7", "--max-new-tokens", "3", "--json")
    rep = json.loads(text[text.index("{"):])
    assert rep["kv_pool"] == {"num_kv_blocks": 32, "every_request_blocks": 32, "rule": "every request at max_seq_len",
                              "token_capacity": 512, "max_seq_len": 512}
    assert "KV pool" not in render(rep)
    rep["kv_pool"] = {"num_kv_blocks": 20, "every_request_blocks": 32, "rule": "free GPU memory",
                      "free_bytes": 3 * 2 ** 29, "fraction": 0.9, "block_bytes": 2 ** 20}
    assert ("KV pool: 20 blocks of 32 for every request at max_seq_len (0.9 of the 1.50 GiB free once the weights and "
            "state slots were in, as TensorRT-LLM sizes its pool; requests beyond it wait)") in render(rep)
    assert "less than max_seq_len" not in render(rep)
    rep["kv_pool"].update(num_kv_blocks=4, rule="num_kv_blocks", token_capacity=64, max_seq_len=512)
    assert ("KV pool: 4 blocks hold 64 tokens, less than max_seq_len 512: a longer request (prompt + new tokens + "
            "draft slots) is refused") in render(rep)


def test_the_baseline_shares_the_combined_engines_weights_and_pools(tmp_path):
    """bench run's target-only baseline takes the combined engine's weights, KV pool and state slots (the two runs of a
    level take turns), so on a GPU each runs with the whole pool; it does not release what it does not own, and an
    engine of another pool layout is refused. The outputs staying equal is tests/engine/test_cuda_graph_steps.py's
    bench run (hybrid, baseline outputs_match)."""
    from dflash2_trt.bench.autoregressive import open_target_only_engine
    from dflash2_trt.engine.standin.engine import open_standin_engine
    from dflash2_trt.trtllm.cpu.attention import KVCachePool

    out = tmp_path / "eng"
    code, text = _cli("build", "--target", "tiny-hybrid", "--output", str(out), "--no-verify", "--max-batch-size", "2")
    assert code == 0, text
    eng, _ = open_standin_engine(out)
    try:
        ar = open_target_only_engine(out, weights=eng.parameters(), pools_of=eng)
        assert ar.pools is eng.pools and ar.states is eng.states and ar.num_blocks == eng.num_blocks
        assert ar.pool_sizing["shared"] is True and ar.K == 0 and eng.K == 7
        names = {n for r in ar.parameters() for n in r}
        assert all(ar.parameters()[0][n].data_ptr() == eng.parameters()[0][n].data_ptr() for n in names)
        ar.close()
        assert all(p.handle in KVCachePool._registry for p in eng.pools)    # still the combined engine's
        other = tmp_path / "other"
        code, text = _cli("build", "--target", "tiny-hybrid", "--output", str(other), "--no-verify",
                          "--max-batch-size", "3")
        assert code == 0, text
        with pytest.raises(ValueError, match="pools of another layout"):
            open_target_only_engine(other, pools_of=eng)
    finally:
        eng.close()


@pytest.mark.parametrize("args", [
    ["--gpu-memory-gib", "69.6"],                                                    # num_kv_blocks just above one
    ["--gpu-memory-gib", "80"],                                                      # activations: a lower fraction
    ["--gpu-memory-gib", "80", "--set", "kv_cache_free_gpu_mem_fraction=0.2"],     # too low a fraction
    ["--set", "num_kv_blocks=40000"],                                                # more blocks than fit
    ["--set", "num_kv_blocks=100"],                                                  # fewer than one request
])
def test_the_dry_runs_advice_for_a_cuda_engine_works_when_followed(args):
    """Where the cuda plan does not fit, the `--set KEY=VALUE` it names, given instead, is a plan that fits."""
    import re

    base = ["build", "--target", "qwen3.8-27b", "--backend", "cuda", "--dry-run"]
    code, text = _cli(*base, *args)
    advice = re.findall(r"--set (num_kv_blocks|kv_cache_free_gpu_mem_fraction)=([0-9.]+) fits", text)
    assert code == 0 and len(advice) == 1 and ("does NOT fit" in text or "holds NO request" in text), text
    key, value = advice[0]
    kept = [a for i, a in enumerate(args) if not (a == "--set" or (i and args[i - 1] == "--set"))]
    code, text = _cli(*base, *kept, "--set", f"{key}={value}")
    assert code == 0 and "  fits the GPU's" in text, text


@pytest.mark.parametrize("target,args,needle", [
    ("qwen3.8-27b", ["--dtype", "float32", "--gpu-memory-gib", "79.2"],
     "the weights and state slots alone do not fit (every rank on this one GPU: --tp-size does not help): a GPU with "
     "more memory, or --dtype bfloat16, or a lower --max-batch-size (its state slots)"),
    ("muse-glimmer-30b", ["--gpu-memory-gib", "62"],     # no state slots: --max-batch-size is not named for them
     "fits beside the weights, the state slots and the activations: lower --max-num-tokens (most of the activations' "
     "estimate) or --max-seq-len"),
])
def test_the_dry_run_names_the_levers_that_help(target, args, needle):
    code, text = _cli("build", "--target", target, "--backend", "cuda", "--dry-run", *args)
    assert code == 0 and needle in text, text
