"""TensorRT-LLM's own trtllm-build (commands/build.py main through builder.build and Engine.save), run as
``dflash2-trt build --backend trtllm`` runs it (``python -m dflash2_trt.trtllm.register`` + the recorded argv) over the
real sources and TensorRT-RTX (scripts/trtllm_real_build.py): for every tiny pair, tp 1 and 2, combined and
``--baseline``, it writes the engine directory, and the config.json it writes holds what the project predicts it
writes (``engine/trtllm/command.py trtllm_engine_config``, which the runtime-rule emulation and the TensorRT session
read) in every field the prediction has (a subset: the file has more).

Needs $DFLASH2_TRTLLM_SRC with the conformance harness's files plus tensorrt_llm/commands/build.py and
tensorrt_llm/builder.py, and TensorRT-RTX; skips otherwise. The engine files hold placeholder bytes (``--no-build``)
except in the one test that sets DFLASH2_REAL_BUILD_RTX=1 (a TensorRT-RTX build: minutes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from real_sources import REPO, SRC, have  # noqa: E402

pytestmark = pytest.mark.skipif(
    not have("functional.py", "commands/build.py", "builder.py"),
    reason="TensorRT-LLM's sources (with commands/build.py and builder.py) are not in $DFLASH2_TRTLLM_SRC")


def _run(tmp_path, target, tp, network, build=False):
    pytest.importorskip("tensorrt_rtx", reason="the conformance harness's stand-in tensorrt is TensorRT-RTX")
    work = tmp_path / "w"
    cmd = [sys.executable, str(REPO / "scripts" / "trtllm_real_build.py"), "--trtllm-src", SRC, "--target", target,
           "--tp", str(tp), "--network", network, "--workdir", str(work), "--json"] + ([] if build else ["--no-build"])
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=3000, cwd=REPO)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout), work


def _predicted(work, target, tp, network):
    from dflash2_trt.engine.plan import prepare
    from dflash2_trt.engine.trtllm.command import trtllm_engine_config
    from dflash2_trt.targets import get_target, resolve_dirs

    ddir, tdir = resolve_dirs(get_target(target))
    prep = prepare(ddir, tdir, target_key=target, overrides={"tp_size": tp})
    kind = "baseline" if network == "baseline" else "build"
    pre = json.loads((work / f"{target}-tp{tp}.{kind}-checkpoint" / "config.json").read_text())
    return trtllm_engine_config(pre, prep.cfg, target_only=network == "baseline")


def _differences(want, got, path=""):
    out = []
    for k, v in want.items():
        p = f"{path}.{k}" if path else k
        if k not in got:
            out.append(f"{p}: missing from trtllm-build's config.json")
        elif isinstance(v, dict) and isinstance(got[k], dict):
            out += _differences(v, got[k], p)
        elif v != got[k]:
            out.append(f"{p}: predicted {v!r}, trtllm-build wrote {got[k]!r}")
    return out


@pytest.mark.parametrize("network", ["combined", "baseline"])
@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("target", ["tiny", "tiny-hybrid", "tiny-muse"])
def test_trtllm_build_writes_the_engine_config_the_project_predicts(tmp_path, target, tp, network):
    rep, work = _run(tmp_path, target, tp, network)
    assert rep["files"] == ["config.json"] + [f"rank{r}.engine" for r in range(tp)]
    assert rep["calls"].count("build_serialized_network") == tp and rep["optimization_profiles"] >= 1
    assert not rep["tensorrt_errors"], rep["tensorrt_errors"]
    want = _predicted(work, target, tp, network)
    want.pop("version")   # the stand-in's version string, not a fact about the file
    assert _differences(want, rep["config"]) == []


@pytest.mark.skipif(os.environ.get("DFLASH2_REAL_BUILD_RTX") != "1", reason="set DFLASH2_REAL_BUILD_RTX=1 (minutes)")
def test_trtllm_build_builds_the_engine_with_tensorrt_rtx(tmp_path):
    rep, work = _run(tmp_path, "tiny", 1, "combined", build=True)
    engine = work / "engine-combined" / "rank0.engine"
    assert rep["built"] and engine.stat().st_size > 100_000 and not rep["tensorrt_errors"]


def test_dflash2_trt_build_with_trtllm_builds_own_main(tmp_path, monkeypatch):
    """``build --backend trtllm --baseline`` (build_engine, its whole branch) with a runner that runs each recorded
    trtllm-build command line, with the env build gives it, through TensorRT-LLM's real main (placeholder engine bytes;
    cmake played and the toolchain declared as in test_trtllm_branch.py; the verify gate off, as it needs a GPU): the
    engine directory it commits takes what the real trtllm-build wrote, its config check and fixes pass, and
    load_engine_dir opens it, every file re-hashed."""
    pytest.importorskip("tensorrt_rtx", reason="the conformance harness's stand-in tensorrt is TensorRT-RTX")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))
    from test_trtllm_branch import SETS, FakeRunner, declared_toolchain

    from dflash2_trt.assets import trained_pair
    from dflash2_trt.engine.build import build_engine
    from dflash2_trt.engine.format import load_engine_dir

    monkeypatch.setenv("DFLASH2_TRT_CACHE", str(tmp_path / "cache"))
    toolchain = declared_toolchain(tmp_path)

    class RealTrtllmBuild(FakeRunner):
        def __call__(self, argv, *, env=None, log=None, cwd=None, echo=None):
            argv = list(argv)
            if argv[1:3] != ["-m", "dflash2_trt.trtllm.register"]:
                return super().__call__(argv, env=env, log=log, cwd=cwd, echo=echo)
            self.calls.append({"tool": "trtllm-build", "argv": argv, "env": dict(env or {})})
            code = ("import sys; sys.path.insert(0, sys.argv[1]); from trtllm_conformance_lib import real_build; "
                    "real_build.trtllm_build(sys.argv[2], sys.argv[3:], build=False)")
            with open(log, "a") as f:
                r = subprocess.run([sys.executable, "-c", code, str(REPO / "scripts"), SRC, *argv[3:]],
                                   stdout=f, stderr=subprocess.STDOUT, cwd=cwd, env={**os.environ, **(env or {})},
                                   timeout=1200)
            return r.returncode

    runner = RealTrtllmBuild()
    pair = trained_pair("qwen3")
    out = tmp_path / "eng"
    res = build_engine(pair.drafter_dir, pair.target_dir, out, backend="trtllm", target_key="tiny",
                       toolchain=toolchain, runner=runner, sets=SETS, verify=False, baseline=True)
    assert res.output == out
    assert [c["tool"] for c in runner.calls].count("trtllm-build") == 2
    # load_engine_dir re-hashes every file against the manifest build wrote over what trtllm-build wrote
    config, manifest = load_engine_dir(out, verify=True)
    assert manifest["backend"] == "trtllm" and config["build_config"]["plugin_config"]["gpt_attention_plugin"] == "auto"
    assert (out / "rank0.engine").read_bytes().startswith(b"dflash2-trt conformance: placeholder")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["build_config"]["max_draft_len"] == 7 and cfg["build_config"]["speculative_decoding_mode"] == 32
    base = json.loads((out / "baseline" / "config.json").read_text())
    assert base["build_config"]["speculative_decoding_mode"] == 1 and base["build_config"]["max_draft_len"] == 0
