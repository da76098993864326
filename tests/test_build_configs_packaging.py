"""Build configs have one source, the top-level ``build_configs/``: a checkout reads it there, and
an installed wheel carries a byte-identical copy as package data (setup.py's ``build_py``)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dflash2_trt.targets import TARGETS, build_config_dir

REPO = Path(__file__).resolve().parents[1]
TOP = REPO / "build_configs"


def _top_files() -> dict[str, bytes]:
    files = {p.name: p.read_bytes() for p in sorted(TOP.glob("*.yaml"))}
    assert files, TOP
    return files


def test_checkout_reads_the_top_level_directory():
    assert build_config_dir() == TOP
    for e in TARGETS.values():
        assert e.build_config_path == TOP / e.build_config and e.build_config_path.is_file(), e.key
    assert not (REPO / "dflash2_trt" / "build_configs").exists()  # no second copy to drift apart
    assert {e.build_config for e in TARGETS.values()} <= set(_top_files())


@pytest.mark.skipif(importlib.util.find_spec("setuptools") is None, reason="setuptools not installed")
def test_wheel_build_carries_a_byte_identical_copy(tmp_path):
    """Run the wheel's build step (``build_py``, what ``pip install .`` runs) into a temp dir, then
    import the package from there, as an installed package, and read every build config."""
    egg, lib = tmp_path / "egg", tmp_path / "lib"
    egg.mkdir()
    r = subprocess.run([sys.executable, "setup.py", "-q", "egg_info", "--egg-base", str(egg),
                        "build_py", "--build-lib", str(lib)], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    packaged = lib / "dflash2_trt" / "build_configs"
    assert {p.name: p.read_bytes() for p in sorted(packaged.glob("*.yaml"))} == _top_files()
    probe = ("import json, dflash2_trt, dflash2_trt.targets as t; print(json.dumps({'pkg': dflash2_trt.__file__, "
             "'dir': str(t.build_config_dir()), 'paths': {k: str(e.build_config_path) for k, e in t.TARGETS.items()}}))")
    env = dict(os.environ, PYTHONPATH=str(lib))
    r = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert Path(got["pkg"]).resolve().is_relative_to(lib.resolve()), got["pkg"]  # the built copy, not the checkout
    assert Path(got["dir"]).resolve() == packaged.resolve()
    top = _top_files()
    for key, path in got["paths"].items():
        assert Path(path).read_bytes() == top[Path(path).name], key
