"""TensorRT-LLM 1.2's own requirements, as read in its sources (dflash2_trt/engine/trtllm/facts/trtllm_requirements.yaml),
against this project's pins: why the two take two environments, and that the second one needs nothing but
``pip install --no-deps`` of this project (docs/trt-session.md §11)."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from dflash2_trt import transformers_support as ts
from dflash2_trt.engine.trtllm.toolchain import _satisfies
from dflash2_trt.yaml_files import load_yaml_file

ROOT = Path(__file__).resolve().parents[1]
FACTS = load_yaml_file(ROOT / "dflash2_trt" / "engine" / "trtllm" / "facts" / "trtllm_requirements.yaml")


def _project_dependencies() -> dict[str, str]:
    text = (ROOT / "pyproject.toml").read_text()
    block = text[text.index("dependencies = ["):]
    block = block[:block.index("]")]
    out = {}
    for dep in re.findall(r'"([^"]+)"', block):
        m = re.match(r"([A-Za-z0-9_.-]+)\s*(.*)", dep)
        out[m[1].lower().replace("_", "-")] = m[2].strip()
    return out


def test_the_record_names_its_sources():
    src = FACTS["sources"]
    assert src["requirements"]["repo"] == "NVIDIA/TensorRT-LLM" and src["requirements"]["path"] == "requirements.txt"
    assert re.match(r"[0-9a-f]{40} ", src["requirements"]["revision"])
    assert FACTS["install_requires_from"] == "requirements.txt"


def test_one_environment_cannot_hold_both_pins():
    pin = FACTS["pins"]["transformers"]
    trt = SpecifierSet(pin)
    ours = SpecifierSet(ts.supported_range())
    # no transformers release satisfies both: TensorRT-LLM's is an exact 4.57 pin, ours starts at 5.24
    assert pin.startswith("==4.57.") and not ours.contains(pin[2:])
    assert not any(trt.contains(v) for v in ("5.24.0", "5.25.0"))
    assert ts.version_problem(pin[2:]) is not None                 # so the Hugging Face stages refuse it
    assert not _satisfies("5.25.0", pin)                           # and the toolchain warns of the other way round
    assert (int(FACTS["pins"]["transformers_line"].split(".")[1]),) == (Version(pin[2:]).minor,)


def test_tensorrt_llms_environment_already_holds_every_other_dependency():
    """``pip install --no-deps`` of this project into TensorRT-LLM's environment: each declared dependency but
    transformers is there (TensorRT-LLM's own or transformers 4.57.1's), at a version both sides accept."""
    deps = _project_dependencies()
    assert "transformers" in deps and "tensorrt-llm" not in deps
    there = {**{k.lower(): v for k, v in FACTS["pins"].items()}, **{n: "" for n in FACTS["transformers_4_57_1_requires"]}}
    for name, spec in deps.items():
        if name == "transformers":
            continue
        assert name in there, f"{name}: not in TensorRT-LLM's environment by the record"
    # where both sides constrain a version, a release exists that satisfies both
    witnesses = {"torch": "2.9.0", "numpy": "1.26.4"}
    for name, v in witnesses.items():
        assert SpecifierSet(deps[name]).contains(v) and SpecifierSet(FACTS["pins"][name]).contains(v, prereleases=True)


def test_no_extra_pulls_tensorrt_llm_beside_the_pins():
    text = (ROOT / "pyproject.toml").read_text()
    extras = text[text.index("[project.optional-dependencies]"):text.index("[project.scripts]")]
    assert not re.search(r'"tensorrt-llm[^"]*"', extras), "an extra that can never resolve beside transformers' pin"


def test_the_metadata_reader_takes_the_records_pin(monkeypatch):
    line = f"transformers{FACTS['pins']['transformers']}"
    monkeypatch.setattr(importlib.metadata, "requires", lambda dist: ["accelerate>=1.7.0", line])
    assert ts.trtllm_transformers_requirement() == FACTS["pins"]["transformers"]


def test_the_name_tensorrt_llm_imports_is_gone_from_this_transformers():
    """The record says `import tensorrt_llm` (1.2) fails on transformers 5 at one module-level import; the name is
    indeed absent from the transformers installed here (were it back, the record and the refusal built on it,
    toolchain.environment_problems, would need another look)."""
    import pytest

    fact = FACTS["import_on_transformers_5"]
    assert fact["chain"][0] == "tensorrt_llm/__init__.py" and fact["chain"][-1] == fact["fails_at"]
    with pytest.raises(ImportError, match=fact["name"]):
        exec(f"from transformers import {fact['name']}", {})
    for other in fact["also_fails"]:
        with pytest.raises(ImportError, match=other["name"]):
            exec(f"from {other['module']} import {other['name']}", {})
