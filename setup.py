"""Packaging glue (all metadata is in pyproject.toml).

The per-target build configs have one source, the repository's top-level ``build_configs/``.
A checkout (editable install) reads them there; a wheel (``pip install .``) cannot see the
checkout, so its ``build_py`` copies them in as package data ``dflash2_trt/build_configs/``,
which :func:`dflash2_trt.targets.build_config_dir` reads when there is no checkout.
tests/test_build_configs_packaging.py checks the copy byte for byte.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py as _build_py

ROOT = Path(__file__).resolve().parent
BUILD_CONFIGS = ROOT / "build_configs"


class build_py(_build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads ROOT/build_configs directly
        configs = sorted(BUILD_CONFIGS.glob("*.yaml"))
        if not configs:  # e.g. an sdist made without MANIFEST.in: fail the build, not the user later
            raise SystemExit(f"no build configs in {BUILD_CONFIGS}")
        dest = Path(self.build_lib) / "dflash2_trt" / "build_configs"
        self.mkpath(str(dest))
        for src in configs:
            self.copy_file(str(src), str(dest / src.name))


setup(cmdclass={"build_py": build_py})
