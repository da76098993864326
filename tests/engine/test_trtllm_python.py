"""``build --trtllm-python``: TensorRT-LLM's side of a build (trtllm-build, the engine side of the verify gate) in
another interpreter, the Hugging Face stages here. TensorRT-LLM 1.2 pins transformers 4.57.x and this project's
Hugging Face stages need its own pin (engine/trtllm/facts/trtllm_requirements.yaml), so a real GPU user has two
environments; here the other interpreter is this one behind a wrapper script (another path: a subprocess), or this
one with its site-packages switched off (it cannot import this project)."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from dflash2_trt.cli import main
from dflash2_trt.engine.trtllm import toolchain as tcm
from dflash2_trt.engine.trtllm.toolchain import Toolchain, environment_problems, probe_toolchain
from dflash2_trt.engine.run import engine_outputs
from dflash2_trt.engine.trtllm.verify import engine_outputs_in, verify_trtllm_engine
from dflash2_trt.engine.verify import VerifyError
from dflash2_trt.errors import MissingDependencyError
from dflash2_trt.yaml_files import load_yaml_file

from test_trtllm_branch import (FakeRunner, _build, _own_plugin_cache, declared_toolchain,  # noqa: F401 - fixtures
                                pair)


@pytest.fixture(autouse=True)
def _no_trtllm_python_env(monkeypatch):
    monkeypatch.delenv("DFLASH2_TRTLLM_PYTHON", raising=False)


def _wrapper(tmp_path: Path, name: str = "python", flags: str = "") -> str:
    """An executable that runs this interpreter: another path, so a subprocess (as a second environment is)."""
    p = tmp_path / name
    p.write_text(f"#!/bin/sh\ncd /\nexec {sys.executable} {flags} \"$@\"\n")
    p.chmod(0o755)
    return str(p)


def test_the_other_interpreter_is_asked_in_a_subprocess(tmp_path):
    py = _wrapper(tmp_path)
    tc = probe_toolchain(py)
    assert tc.python == py
    here = tcm.python_side()
    assert (tc.tensorrt_llm, tc.transformers, tc.project) == (here["tensorrt_llm"], here["transformers"],
                                                             here["dflash2_trt"])
    assert probe_toolchain(sys.executable).python is None        # this interpreter: nothing to ask
    assert environment_problems(tc) == ([], [])


def test_an_interpreter_without_this_project_is_named_in_one_line(tmp_path, pair):
    bare = _wrapper(tmp_path, flags="-S")        # no site-packages: no dflash2_trt, as a fresh TensorRT-LLM venv
    tc = probe_toolchain(bare)
    assert tc.python == bare and tc.tensorrt_llm is None
    assert re.match(r"TensorRT-LLM's Python .* cannot import dflash2_trt: install this project there too.*"
                    r"-m pip install --no-deps -e /", tc.probe_error)
    assert environment_problems(tc) == ([tc.probe_error], [])
    assert "cannot be run" in probe_toolchain(str(tmp_path / "absent" / "python")).probe_error
    # the plan names it; a build stops on it before converting anything
    r = CliRunner().invoke(main, ["build", "--target", "tiny", "--dry-run", "--json", "--trtllm-python", bare])
    assert r.exit_code == 0 and tc.probe_error in json.loads(r.output[r.output.index("{"):])["machine"]["missing"]
    out = tmp_path / "eng"
    with pytest.raises(MissingDependencyError, match=r"the TensorRT-LLM side .* cannot build: TensorRT-LLM's Python"):
        _build(pair, out, Toolchain(**{**declared_toolchain(tmp_path).to_dict(), "python": bare,
                                       "probe_error": tc.probe_error}), FakeRunner())
    assert not out.exists() and not (tmp_path / "eng.checkpoint").exists()


def test_environment_problems():
    trt = dict(tensorrt_llm="1.2.0", python="/trt/bin/python", project=tcm.python_side()["dflash2_trt"],
               project_source=tcm.source_digest())
    # TensorRT-LLM on its own pin, in its own environment: nothing to say
    assert environment_problems(Toolchain(**trt, transformers="4.57.1", trtllm_transformers="==4.57.1")) == ([], [])
    # TensorRT-LLM 1.2 beside transformers 5: it does not even import (facts/trtllm_requirements.yaml)
    miss, warn = environment_problems(Toolchain(**trt, transformers="5.25.0", trtllm_transformers="==4.57.1"))
    assert warn == [] and len(miss) == 1 and "`import tensorrt_llm` fails (tensorrt_llm/models/gpt/convert.py imports " \
        "AutoModelForVision2Seq" in miss[0] and "transformers==4.57.1" in miss[0]
    # another 4.x than its pin: a warning naming both
    _, warn = environment_problems(Toolchain(**trt, transformers="4.56.2", trtllm_transformers="==4.57.1"))
    assert len(warn) == 1 and "pins transformers==4.57.1 but transformers 4.56.2" in warn[0]
    # another version of this project there, or the same version from other sources, or one too old to say
    for other in ({"project": "0.0.1"}, {"project_source": "0" * 64}, {"project_source": None}):
        miss, _ = environment_problems(Toolchain(**{**trt, **other}, transformers="4.57.1",
                                                 trtllm_transformers="==4.57.1"))
        assert len(miss) == 1 and "imports another dflash2_trt" in miss[0] and "pip install --no-deps" in miss[0]
    assert environment_problems(Toolchain(**trt, transformers="4.57.1", trtllm_transformers="==4.57.1")) == ([], [])


def test_this_interpreters_transformers_decides_the_hf_stages(monkeypatch):
    from dflash2_trt import transformers_support as ts

    monkeypatch.setattr(ts, "installed_version", lambda: "4.57.1")
    miss, _ = environment_problems(Toolchain(tensorrt_llm="1.2.0", transformers="4.57.1",
                                             trtllm_transformers="==4.57.1"))
    assert len(miss) == 1 and miss[0].startswith("transformers 4.57.1 is installed") and "--trtllm-python" in miss[0]


def test_trtllm_build_runs_in_the_given_interpreter(pair, tmp_path, toolchain_other):
    r = FakeRunner()
    seen, said = [], []

    def verifier(engine_dir, **kw):
        seen.append(kw)
        return {"passed": True, "prompts": 4, "tokens": 96}

    res = _build(pair, tmp_path / "eng", toolchain_other, r, verify=True, verifier=verifier, progress=said.append)
    assert not any(s.startswith("warning:") for s in said)    # TensorRT-LLM on its own pin there
    said.clear()
    from dataclasses import replace

    _build(pair, tmp_path / "eng-off-pin", replace(toolchain_other, transformers="4.56.2"), FakeRunner(),
           progress=said.append)
    assert [s for s in said if s.startswith("warning:")] == [
        "warning: TensorRT-LLM 1.2.0 in /trt/bin/python pins transformers==4.57.1 but transformers 4.56.2 is installed "
        "there: TensorRT-LLM runs on a transformers it does not declare (untested by NVIDIA and by this project); keep "
        "its own and give this project an environment of its own (docs/trt-session.md §11)"]
    (tb,) = [c for c in r.calls if c["tool"] == "trtllm-build"]
    assert tb["argv"][:3] == ["/trt/bin/python", "-m", "dflash2_trt.trtllm.register"]
    assert res.manifest["trtllm_build"]["argv"][0] == "/trt/bin/python"
    assert seen[0]["python"] == "/trt/bin/python"
    run_md = (tmp_path / "eng" / "RUN.md").read_text()
    assert "runs where TensorRT-LLM imports: the environment of `/trt/bin/python`" in run_md
    assert f"/trt/bin/python -m dflash2_trt run --engine-dir {(tmp_path / 'eng').absolute()}" in run_md
    assert f"/trt/bin/python -m dflash2_trt bench run --engine-dir {(tmp_path / 'eng').absolute()}" in run_md
    assert "dflash2-trt " not in run_md.replace("dflash2-trt {", "").split("## 0.")[1]   # no bare command
    assert "/trt/bin/python -m dflash2_trt.bench.trtllm_bench" in run_md
    v = res.manifest["versions"]
    assert (v["trtllm_python"], v["transformers"], v["python"], v["torch"]) == ("/trt/bin/python", "4.57.1", "3.10.12",
                                                                                "2.9.0+cu130")


def test_without_tensorrt_llm_there_the_message_names_the_interpreter(pair, tmp_path):
    tc = Toolchain(**{**declared_toolchain(tmp_path).to_dict(), "tensorrt_llm": None, "python": "/trt/bin/python",
                      "project": tcm.python_side()["dflash2_trt"], "project_source": tcm.source_digest()})
    with pytest.raises(MissingDependencyError, match=r"TensorRT-LLM is not importable by /trt/bin/python .*"
                                                     r"The engine step runs: DFLASH2_PLUGIN_LIB=.* /trt/bin/python -m "
                                                     r"dflash2_trt.trtllm.register"):
        _build(pair, tmp_path / "eng", tc, FakeRunner())


@pytest.fixture
def toolchain_other(tmp_path):
    return Toolchain(**{**declared_toolchain(tmp_path).to_dict(), "python": "/trt/bin/python",
                        "transformers": "4.57.1", "trtllm_transformers": "==4.57.1",
                        "project": tcm.python_side()["dflash2_trt"], "project_source": tcm.source_digest(),
                        "python_version": "3.10.12", "torch": "2.9.0+cu130"})


def test_the_engine_side_runs_in_the_other_interpreter(standin_trt_engine, tmp_path):
    cpu_engine = standin_trt_engine[1]          # the session's tiny-hybrid CPU engine
    prompts = [[187, 95, 235], [5, 6, 7, 8, 9]]
    here = engine_outputs(cpu_engine, prompts, 12, eos=(2,))
    there = engine_outputs_in(_wrapper(tmp_path), cpu_engine, prompts, 12, eos=(2,))
    assert there == here and all(len(o) == 12 for o in here)


def test_a_failing_engine_side_is_one_line(tmp_path):
    py = _wrapper(tmp_path)
    kept = tmp_path / "eng.verify-failed.log"
    with pytest.raises(VerifyError, match=r"failed in .*python \(exit 1\) \(its output: .*eng.verify-failed.log\): "
                                          r"FileNotFoundError: .*engine.json"):
        engine_outputs_in(py, tmp_path / "no-engine", [[1, 2, 3]], 4, kept_log=kept)
    assert "Traceback" in kept.read_text()

    def answers(argv, **kw):
        Path(argv[-1]).write_text(json.dumps({"outputs": [[7]]}))
        return 0

    # a later run whose engine side answers takes the earlier failure's log away
    assert engine_outputs_in("/x/python", tmp_path, [[1]], 1, runner=answers, kept_log=kept) == [[7]]
    assert not kept.exists()

    def liar(argv, **kw):      # an engine side that exits 0 without its outputs
        return 0

    with pytest.raises(VerifyError, match="failed in /x/python \\(exit 0\\): no output"):
        engine_outputs_in("/x/python", tmp_path, [[1, 2, 3]], 4, runner=liar)

    def short(argv, **kw):     # one output for two prompts
        Path(argv[-1]).write_text(json.dumps({"outputs": [[1]]}))
        return 0

    with pytest.raises(VerifyError, match="returned 1 outputs for 2 prompts"):
        engine_outputs_in("/x/python", tmp_path, [[1], [2]], 4, runner=short)


def test_verify_gate_compares_the_other_sides_tokens_with_the_target(pair, tmp_path, toolchain_other):
    """The whole gate with the engine side in another interpreter: the engine directory is a TensorRT one (fake
    ranks, its config as trtllm-build writes it); the runner plays the engine side with the target's own tokens,
    then with one token changed, which the gate must catch."""
    out = tmp_path / "eng"
    _build(pair, out, toolchain_other, FakeRunner())
    from dflash2_trt.engine.verify import reference_outputs

    def side(tamper: bool):
        def run(argv, **kw):
            assert argv[:3] == ["/trt/bin/python", "-m", "dflash2_trt.engine.run"]
            req = json.loads(Path(argv[3]).read_text())
            assert req["engine_dir"] == str(out.absolute())
            outs = reference_outputs(pair.target_dir, req["prompts"], req["new"], tuple(req["eos"]),
                                     dtype="float32")
            if tamper:
                outs[0][3] = (outs[0][3] + 1) % 256
            Path(argv[4]).write_text(json.dumps({"outputs": outs}))
            return 0
        return run

    rep = verify_trtllm_engine(out, target_dir=pair.target_dir, target_key="tiny", python="/trt/bin/python",
                               runner=side(False))
    assert rep["passed"] and rep["engine_side"] == "/trt/bin/python" and rep["tokens"] > 0
    with pytest.raises(VerifyError, match="prompt 0 .*output token 3"):
        verify_trtllm_engine(out, target_dir=pair.target_dir, target_key="tiny", python="/trt/bin/python",
                             runner=side(True))


def test_cli_refuses_trtllm_python_for_a_cpu_build(tmp_path):
    r = CliRunner().invoke(main, ["build", "--target", "tiny", "--backend", "cpu", "--output", str(tmp_path / "e"),
                                  "--trtllm-python", sys.executable])
    assert r.exit_code == 1 and r.output.strip().splitlines()[-1].startswith("error: --trtllm-python: applies to "
                                                                             "--backend trtllm"), r.output
    assert not (tmp_path / "e").exists()


def test_dry_run_names_the_other_interpreter(tmp_path):
    py = _wrapper(tmp_path)
    r = CliRunner().invoke(main, ["build", "--target", "tiny", "--dry-run", "--json", "--trtllm-python", py],
                           env={"DFLASH2_TRTLLM_PYTHON": None})
    assert r.exit_code == 0, r.output
    plan = json.loads(r.output[r.output.index("{"):])
    assert plan["backend"] == "trtllm" and plan["machine"]["python"] == py
    assert any(m.startswith(f"tensorrt_llm (TensorRT-LLM 1.2.x) in {py}") for m in plan["machine"]["missing"])
    # the environment variable says the same
    r2 = CliRunner().invoke(main, ["build", "--target", "tiny", "--dry-run", "--json"],
                            env={"DFLASH2_TRTLLM_PYTHON": py})
    assert json.loads(r2.output[r2.output.index("{"):])["machine"]["python"] == py
    assert os.environ.get("DFLASH2_TRTLLM_PYTHON") is None


def test_a_failing_import_of_tensorrt_llm_is_one_line(monkeypatch, tmp_path):
    """What a GPU user gets from TensorRT-LLM 1.2 beside transformers 5: its package fails at a module-level import
    of a class transformers 5 removed (facts/trtllm_requirements.yaml). A package of that name whose ``__init__``
    makes that very import stands in for it: one line saying where the TensorRT side runs, not a traceback."""
    from dflash2_trt import transformers_support as ts
    from dflash2_trt.trtllm.register import import_tensorrt_llm

    fact = load_yaml_file(Path(tcm.__file__).with_name("facts") / "trtllm_requirements.yaml")["import_on_transformers_5"]
    pkg = tmp_path / "site" / "tensorrt_llm"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(f"from transformers import {fact['name']}\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "tensorrt_llm", raising=False)
    with pytest.raises(MissingDependencyError) as ei:
        import_tensorrt_llm()
    msg = str(ei.value)
    assert msg.startswith(f"`import tensorrt_llm` failed: ImportError: cannot import name '{fact['name']}'")
    assert "\n" not in msg and f"transformers {ts.installed_version()} is installed here" in msg
    assert "docs/trt-session.md §11" in msg
    # not installed at all: said as such, without blaming transformers
    monkeypatch.setitem(sys.modules, "tensorrt_llm", None)
    with pytest.raises(MissingDependencyError, match=r"^TensorRT-LLM is not importable by .*its own environment") as ei:
        import_tensorrt_llm()
    assert "transformers" not in str(ei.value).split("(docs")[0].split(": it runs")[0].split(") ")[-1]


def test_the_build_stops_before_converting_where_tensorrt_llm_cannot_import(pair, tmp_path):
    """TensorRT-LLM 1.2 in the named interpreter beside transformers 5: said before anything is converted or built
    (trtllm-build would fail on its import hours later), nothing written."""
    tc = Toolchain(**{**declared_toolchain(tmp_path).to_dict(), "python": "/trt/bin/python", "transformers": "5.25.0",
                      "trtllm_transformers": "==4.57.1", "project": tcm.python_side()["dflash2_trt"],
                      "project_source": tcm.source_digest()})
    r = FakeRunner()
    with pytest.raises(MissingDependencyError, match=r"^the TensorRT-LLM side /trt/bin/python cannot build: "
                                                     r"TensorRT-LLM 1.2.0 in /trt/bin/python sits beside transformers "
                                                     r"5.25.0"):
        _build(pair, tmp_path / "eng", tc, r)
    assert r.calls == [] and not (tmp_path / "eng").exists() and not (tmp_path / "eng.checkpoint").exists()


def test_the_engine_side_writes_a_new_file_only(tmp_path):
    from dflash2_trt.engine.run import engine_side_main

    req = tmp_path / "request.json"
    req.write_text("{}")
    assert engine_side_main([str(req), str(req)]) == 2 and req.read_text() == "{}"
    other = tmp_path / "out.json"
    other.write_text("keep")
    assert engine_side_main([str(req), str(other)]) == 2 and other.read_text() == "keep"
    assert engine_side_main([str(req)]) == 2


def test_the_environment_variable_leaves_cpu_builds_alone(tmp_path):
    """$DFLASH2_TRTLLM_PYTHON says where TensorRT-LLM is; a cpu build goes on (only the flag is refused there), and an
    auto build plans TensorRT-LLM's with it, its trtllm-build and trtllm-bench lines run by it."""
    py = _wrapper(tmp_path)
    r = CliRunner().invoke(main, ["build", "--target", "tiny", "--backend", "cpu", "--dry-run", "--json"],
                           env={"DFLASH2_TRTLLM_PYTHON": str(tmp_path / "absent")})
    assert r.exit_code == 0 and json.loads(r.output[r.output.index("{"):])["backend"] == "cpu", r.output
    r = CliRunner().invoke(main, ["build", "--target", "tiny", "--dry-run", "--json"], env={"DFLASH2_TRTLLM_PYTHON": py})
    plan = json.loads(r.output[r.output.index("{"):])
    assert plan["backend"] == "trtllm" and plan["trtllm_build"]["argv"][0] == py, plan.get("trtllm_build")
    assert plan["trtllm_bench"]["argv"][0] == py


def test_an_interpreter_without_tensorrt_llm_in_the_variable_does_not_decide_auto(tmp_path):
    """README's GPU setup exports $DFLASH2_TRTLLM_PYTHON; where that interpreter has no TensorRT-LLM, `build
    --backend auto` is decided by this machine (here: cpu), with a note. It used to take trtllm: convert the whole
    checkpoint, then refuse (a reviewer's README quick-start build failed that way)."""
    out = tmp_path / "e"
    r = CliRunner().invoke(main, ["build", "--target", "tiny", "--output", str(out), "--no-verify", "--json"],
                           env={"DFLASH2_TRTLLM_PYTHON": sys.executable})
    assert r.exit_code == 0 and json.loads(r.stdout)["backend"] == "cpu", r.output
    assert f"note: $DFLASH2_TRTLLM_PYTHON ({sys.executable}) has no TensorRT-LLM" in r.stderr
    assert "--backend auto does not take it" in r.stderr


def test_commands_that_need_only_the_tokenizer_run_on_tensorrt_llms_transformers(monkeypatch, standin_trt_engine):
    """Under TensorRT-LLM's transformers (4.57.1: what the refusal sees patched in) `run` of an engine goes on; a
    Hugging Face stage of the same process refuses (the converter's Gated DeltaNet check included)."""
    from dflash2_trt import transformers_support as ts
    from dflash2_trt.convert.torch_forward import ConvertedCheckpoint, target_forward

    monkeypatch.setattr(ts, "installed_version", lambda: "4.57.1")
    cpu_engine = standin_trt_engine[1]
    r = CliRunner().invoke(main, ["run", "--engine-dir", str(cpu_engine), "--prompt-ids", "187,95,235",
                                  "--max-new-tokens", "6", "--json"])
    assert r.exit_code == 0, r.output
    ck = ConvertedCheckpoint(cpu_engine / "checkpoint")
    import torch

    with pytest.raises(MissingDependencyError, match="the converter's Gated DeltaNet check needs .*4.57.1"):
        target_forward(ck, torch.tensor([[187, 95, 235]]))


def test_python_m_dflash2_trt_is_the_command_line():
    """RUN.md spells the command line of another interpreter as ``PY -m dflash2_trt``."""
    import subprocess

    r = subprocess.run([sys.executable, "-m", "dflash2_trt", "--version"], capture_output=True, text=True, cwd="/")
    assert r.returncode == 0 and r.stdout.startswith("dflash2-trt, version "), r
