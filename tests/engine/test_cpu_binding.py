"""A CPU engine binds each step's feed by the rules of TensorRT-LLM's C++ runtime (engine_io.yaml
``runtime_binding``, read in runtime/tllmRuntime.cpp ``TllmRuntime::setInputTensorsImpl``): every engine input
present, with the engine's dtype and a shape inside its optimization profile, names that are not engine inputs
ignored. Before, the CPU engine took whatever the runtime handed it, so a feed the GPU runtime refuses (the tp > 1
engine's all_reduce_workspace was never fed) ran here."""

from __future__ import annotations

import pytest
import torch

from dflash2_trt.assets import trained_pair
from dflash2_trt.engine.binding import binding_rules as _rules, bind


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from dflash2_trt.engine.build import build_engine
    from dflash2_trt.engine.standin.engine import open_standin_engine

    p = trained_pair("qwen3")
    out = tmp_path_factory.mktemp("bind") / "eng"
    build_engine(p.drafter_dir, p.target_dir, out, target_key="tiny", tp_size=2, overrides={"block_size": 4})
    eng, _ = open_standin_engine(out)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def feeds(engine):
    """The flat feed of every step of a short run (context and generation steps)."""
    from dflash2_trt.runtime import Request
    from dflash2_trt.testing.engines import run_with_step_spy

    seen = []
    run_with_step_spy(engine, [Request([5, 6, 7, 8, 9], 5), Request([3, 4], 5)], lambda f: seen.append(dict(f)))
    assert len(seen) >= 3
    return [{**engine.static_inputs(0), **f} for f in seen]


def test_every_step_binds_every_engine_input(engine, feeds):
    names = set(engine._declared)
    assert "all_reduce_workspace" in names and "input_ids" in names and len(names) >= 25
    for feed in feeds:
        assert set(bind(engine._declared, feed)) == names


def test_a_missing_input_is_refused_with_the_runtimes_message(engine, feeds):
    for name in ("input_ids", "all_reduce_workspace", "host_kv_cache_pool_pointers", "draft_lens"):
        feed = {k: v for k, v in feeds[-1].items() if k != name}
        shape = "(" + ", ".join(str(int(s)) for s in engine._declared[name].shape) + ")"
        with pytest.raises(RuntimeError) as e:
            bind(engine._declared, feed)
        assert str(e.value) == f"Input tensor '{name}' not found; expected shape: {shape}"


def test_a_wrong_dtype_is_refused(engine, feeds):
    feed = dict(feeds[-1], input_ids=feeds[-1]["input_ids"].long())
    with pytest.raises(RuntimeError, match=r"^input_ids: expected type torch.int32, provided type torch.int64$"):
        bind(engine._declared, feed)
    with pytest.raises(RuntimeError, match="expected type torch.int32"):   # the engine itself binds each step
        engine.step({k: v for k, v in feed.items() if k not in engine.static_inputs(0)})


def test_a_shape_outside_the_profile_is_refused(engine, feeds):
    max_bs = int(engine.limits["max_batch_size"])
    feed = dict(feeds[-1], sequence_length=torch.ones(max_bs + 1, dtype=torch.int32))
    with pytest.raises(RuntimeError, match=rf"^Tensor 'sequence_length' has invalid shape \({max_bs + 1}\), "
                                           rf"expected in range min \(1\), max \({max_bs}\)$"):
        bind(engine._declared, feed)
    feed = dict(feeds[-1], all_reduce_workspace=torch.zeros(5, dtype=torch.int64))   # a static dimension
    with pytest.raises(RuntimeError, match="all_reduce_workspace' has invalid shape"):
        bind(engine._declared, feed)
    feed = dict(feeds[-1], draft_lens=feeds[-1]["draft_lens"][None])                  # another rank
    with pytest.raises(RuntimeError, match="draft_lens' has invalid shape"):
        bind(engine._declared, feed)


def test_names_that_are_not_engine_inputs_are_ignored(engine, feeds):
    feed = dict(feeds[-1], position_ids=torch.zeros(3, dtype=torch.int64))   # not declared (engine_io.yaml)
    assert "position_ids" not in bind(engine._declared, feed)
    assert _rules()["extra_names"] == "ignored"
    assert _rules()["source"]["path"] == "cpp/tensorrt_llm/runtime/tllmRuntime.cpp"
