"""The network package (``dflash2_trt/trtllm/network/``) and the model class file in front of it.

The package is loaded once per backend by ``backend.load_network`` (every module takes its TensorRT-LLM names
from the backend current while it is imported), and ``trtllm/model.py`` — the file ``trtllm-build
--model_cls_file`` takes — exposes that instance's ``DFlash2ForCausalLM``, the class ``register()`` puts into
MODEL_MAP. The graph itself is compared with the split-before network by the conformance harness
(``scripts/trtllm_conformance.py``: per-rank layer digests) and by the engine tests.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import pytest

from dflash2_trt.trtllm import backend
from dflash2_trt.trtllm.backend import MODEL_FILE, NETWORK_PACKAGE, load_network

TRTLLM = Path(backend.__file__).resolve().parent


def _network_modules() -> list[str]:
    """Dotted names (relative to the package) of every module file under network/."""
    out = []
    for p in sorted(NETWORK_PACKAGE.rglob("*.py")):
        parts = list(p.relative_to(NETWORK_PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts:
            out.append(".".join(parts))
    return out


def test_every_module_is_loaded_eagerly_into_the_backends_instance():
    net = load_network("cpu")
    assert net.__name__ == "dflash2_trt_network_cpu" and net.__path__ == [str(NETWORK_PACKAGE)]
    mods = _network_modules()
    assert {"common", "layers", "families.qwen3", "families.qwen3_5", "families.muse_glimmer", "drafter",
            "selector", "accept", "io", "combined", "target_only"} <= set(mods)
    for m in mods:
        mod = sys.modules.get(f"dflash2_trt_network_cpu.{m}")
        assert mod is not None, m
        assert Path(mod.__file__).resolve().is_relative_to(NETWORK_PACKAGE), m
    assert net.common.api is backend.current("cpu")
    assert load_network("cpu") is net   # one instance per backend and process


def test_the_package_reexports_what_its_consumers_use():
    net = load_network("cpu")
    for name in ("TARGET_FAMILIES", "check_kv_compatible", "kv_layer_windows", "rope_tables", "counter_uniforms",
                 "inverse_cdf", "leading_true", "GatedDeltaNet", "KeyValueCacheParams", "AttentionParams",
                 "SpecDecodingParams", "RecurrentStateParams", "total_kv_layers", "DFlash2ForCausalLM",
                 "TargetOnlyForCausalLM", "SELECTOR_PLUGIN_MODE", "api"):
        assert hasattr(net, name), name
    assert net.TargetOnlyForCausalLM.__module__ == "dflash2_trt_network_cpu.target_only"
    assert net.DFlash2ForCausalLM is net.combined.DFlash2ForCausalLM
    assert net.TARGET_FAMILIES == {"qwen3": net.Qwen3Transformer, "qwen3_5": net.Qwen3_5Transformer,
                                   "muse_glimmer": net.MuseGlimmerTransformer}


def test_model_class_file_exposes_the_networks_classes_and_nothing_else(monkeypatch):
    """trtllm-build loads the class file by path (not as a package module); what it gets must be the very class
    objects of the backend's network instance (the combined engine's, and the target alone's for ``build
    --baseline``), so register()'s MODEL_MAP entries and the built class agree."""
    monkeypatch.setenv("DFLASH2_TRT_BACKEND", "cpu")
    spec = importlib.util.spec_from_file_location("model_cls_file_under_test", MODEL_FILE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    net = load_network("cpu")
    assert mod.DFlash2ForCausalLM is net.DFlash2ForCausalLM
    assert mod.TargetOnlyForCausalLM is net.TargetOnlyForCausalLM
    assert {k for k in vars(mod) if not k.startswith("_")} == {"backend", "DFlash2ForCausalLM", "TargetOnlyForCausalLM"}

    from dflash2_trt.trtllm.register import architectures, register

    mm = register({}, mod.DFlash2ForCausalLM)
    assert set(mm) == set(architectures()) and all(v is net.DFlash2ForCausalLM for v in mm.values())


def test_a_failed_load_leaves_no_half_loaded_modules(tmp_path, monkeypatch):
    """A module of the package that fails to import takes the whole instance with it: the next load_network
    starts from scratch instead of finding the package or its first modules in sys.modules."""
    pkg = tmp_path / "network"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from . import good, bad\n")
    (pkg / "good.py").write_text("X = 1\n")
    (pkg / "bad.py").write_text("raise RuntimeError('broken module')\n")
    for k in [k for k in sys.modules if k.startswith("dflash2_trt_network_cpu")]:
        monkeypatch.delitem(sys.modules, k)
    monkeypatch.setattr(backend, "NETWORK_PACKAGE", pkg)
    with pytest.raises(RuntimeError, match="broken module"):
        load_network("cpu")
    assert not [k for k in sys.modules if k.startswith("dflash2_trt_network_cpu")]


def _project_module(path: Path) -> str:
    return ".".join(path.relative_to(TRTLLM.parents[1]).with_suffix("").parts)


@pytest.mark.parametrize("path", sorted(TRTLLM.rglob("*.py")), ids=lambda p: str(p.relative_to(TRTLLM)))
def test_no_module_takes_a_private_name_from_another(path):
    """Names other modules use are public: no ``from .x import _name`` between the project's own files."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("dflash2_trt")):
            bad += [f"line {node.lineno}: {a.name}" for a in node.names if a.name.startswith("_")
                    and a.name != "__version__"]
    assert not bad, f"{_project_module(path)} imports private names: {bad}"


def test_a_plain_import_of_the_network_package_is_refused():
    # It would bind whatever backend `auto` picks, a third copy of every class beside load_network's two.
    import importlib

    import pytest as _pytest

    with _pytest.raises(ImportError, match="load_network"):
        importlib.import_module("dflash2_trt.trtllm.network")


def test_forget_gives_a_fresh_instance_as_a_new_process_would():
    import sys

    from dflash2_trt.trtllm import backend

    first = backend.load_network("cpu")
    saved = {k: v for k, v in sys.modules.items() if k.startswith("dflash2_trt_network_cpu")}
    saved_api = backend._cache.get("cpu")
    try:
        assert backend.load_network("cpu") is first
        backend.forget("cpu")
        assert not any(k.startswith("dflash2_trt_network_cpu") for k in sys.modules)
        again = backend.load_network("cpu")
        assert again is not first and again.DFlash2ForCausalLM is not first.DFlash2ForCausalLM
        assert backend.current("cpu").name == "cpu"
    finally:   # the rest of the session keeps the instance its fixtures already hold
        backend.forget("cpu")
        sys.modules.update(saved)
        if saved_api is not None:
            backend._cache["cpu"] = saved_api
