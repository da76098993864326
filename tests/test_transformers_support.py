"""The Hugging Face stages refuse a transformers they were not tested on, in one line, before any work; what needs no
transformers model class (running an engine) is not held to it. A TensorRT-LLM 1.2 environment carries
transformers 4.57.x (its wheel's pin), and there the refusal names that pin."""

from __future__ import annotations

import importlib.metadata

import pytest
from click.testing import CliRunner

from dflash2_trt import transformers_support as ts
from dflash2_trt.cli import main
from dflash2_trt.errors import MissingDependencyError

from test_dependency_pins import _pin


def test_supported_minors_are_pyprojects_pin():
    assert f"transformers{ts.supported_range()}" == f"transformers{_pin('transformers')}", (
        "moving the transformers pin (tests/test_dependency_pins.py says how) moves SUPPORTED_MINORS in "
        "dflash2_trt/transformers_support.py with it")


def test_installed_transformers_passes():
    assert ts.version_problem(ts.installed_version()) is None
    ts.require_supported_transformers("a stage")


@pytest.mark.parametrize("version", ["4.57.1", "4.57.3", "5.23.0", "5.26.0", "6.0.0", "not-a-version"])
def test_other_versions_are_refused(version):
    p = ts.version_problem(version)
    assert p and version in p and ts.supported_range() in p and "TensorRT-LLM" not in p


def test_the_refusal_names_tensorrt_llms_pin():
    p = ts.version_problem("4.57.1", trtllm_pin="==4.57.1")
    assert "pins transformers==4.57.1" in p and "docs/trt-session.md" in p
    assert "not installed" in ts.version_problem(None)


@pytest.mark.parametrize("requires, want", [
    (["transformers==4.57.1"], "==4.57.1"),
    (["transformers (==4.57.3)"], "==4.57.3"),
    (['transformers==4.57.1; python_version >= "3.10"'], "==4.57.1"),
    (["transformers[torch] == 4.57.1"], "==4.57.1"),
    (["transformers-stream-generator", "accelerate>=1.7.0"], None),
    (["Transformers>=4.56,<5"], ">=4.56,<5"),
    ([], None),
])
def test_tensorrt_llms_requirement_is_read_from_its_metadata(monkeypatch, requires, want):
    monkeypatch.setattr(importlib.metadata, "requires", lambda dist: requires if dist == ts.TRTLLM_DIST else [])
    assert ts.trtllm_transformers_requirement() == want


def test_no_tensorrt_llm_means_no_pin():
    # this machine has no TensorRT-LLM: its real metadata lookup says so
    assert ts.trtllm_transformers_requirement() is None


def test_hf_stage_refuses_in_one_line(monkeypatch):
    monkeypatch.setattr(ts, "installed_version", lambda: "4.57.1")
    monkeypatch.setattr(ts, "trtllm_transformers_requirement", lambda: "==4.57.1")
    with pytest.raises(MissingDependencyError, match="the target's inventory check needs"):
        ts.require_supported_transformers("the target's inventory check")
    r = CliRunner().invoke(main, ["inspect", "--target", "tiny"])
    assert r.exit_code == 1, r.output
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert lines[-1].startswith("error: the target's inventory check needs transformers' own model classes: "
                                "transformers 4.57.1 is installed"), r.output
    assert "pins transformers==4.57.1" in lines[-1] and "Traceback" not in r.output


def test_reference_decoding_refuses(monkeypatch, tiny_dense):
    from dflash2_trt.reference.loop import load_target

    monkeypatch.setattr(ts, "installed_version", lambda: "5.26.0")
    with pytest.raises(MissingDependencyError, match="the target's reference decoding needs .* 5.26.0 is installed"):
        load_target(tiny_dense.target_dir)
