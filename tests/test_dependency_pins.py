"""The pins say what the suite has passed on.

pyproject's transformers range ends at the newest minor release this suite has passed on, so that
``pip install`` next month resolves a version known to work, not the newest one (transformers 5.25
changed the Qwen3.5 cache under a test that passed on 5.24: a fresh clone went red with nothing
changed here). ``TESTED`` is the record: the exact versions the whole suite passed on. A run on any
other minor fails here, loudly, before the rest of the suite says why in a stranger way; to move the
range, run the suite on the new version, add it to ``TESTED``, raise the bound in pyproject.toml and
``SUPPORTED_MINORS`` in dflash2_trt/transformers_support.py (the Hugging Face stages' refusal).
The resolved versions are printed at the end of every pytest run (tests/conftest.py).
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# package -> the versions the whole suite has passed on
TESTED = {"transformers": ("5.24.0", "5.25.0")}


def _minor(version: str) -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", version)
    assert m, version
    return int(m[1]), int(m[2])


def _pin(package: str) -> str:
    text = (REPO / "pyproject.toml").read_text()
    deps = text[text.index("dependencies = ["):]
    m = re.search(rf'"{package}([^"]*)"', deps[:deps.index("]")])
    assert m, f"pyproject.toml lists no {package} dependency"
    return m[1]


def test_pins_end_at_the_newest_tested_minor():
    for package, versions in TESTED.items():
        minors = sorted({_minor(v) for v in versions})
        lo, hi = minors[0], minors[-1]
        want = f">={lo[0]}.{lo[1]},<{hi[0]}.{hi[1] + 1}"
        assert _pin(package) == want, (
            f"pyproject.toml pins {package}{_pin(package)}; the suite has passed on {', '.join(versions)}, "
            f"so the pin is {package}{want}")


def test_installed_versions_are_tested_ones():
    from importlib.metadata import version

    for package, versions in TESTED.items():
        have = version(package)
        tested = {_minor(v) for v in versions}
        assert _minor(have) in tested, (
            f"{package} {have} is installed, a minor release this suite has never passed on (tested: "
            f"{', '.join(versions)}). Install {package}{_pin(package)} (pyproject.toml's pin), or run the whole "
            f"suite on {have}, add it to TESTED in tests/test_dependency_pins.py and raise the pin")


# torch has no upper bound: a GPU user installs the CUDA build of their choice first (README), and CI installs the CPU
# wheel 2.13.0. Its lower bound is the oldest release the whole suite has passed on; these are the ones it passed on.
TORCH_TESTED = ("2.6.0", "2.13.0", "2.14.1", "2.15.0")


def test_the_torch_bound_is_the_oldest_tested_release():
    lo = min(_minor(v) for v in TORCH_TESTED)
    assert _pin("torch") == f">={lo[0]}.{lo[1]}", (
        f"pyproject.toml pins torch{_pin('torch')}; the oldest torch the suite has passed on is {lo[0]}.{lo[1]}")


def test_the_torch_bound_is_one_the_pinned_transformers_uses():
    """transformers 5.x turns torch off below its own minimum ("Disabling PyTorch because PyTorch >= 2.6 is required",
    transformers/utils/import_utils.py): every Hugging Face stage here would then fail in a stranger way. The minimum is
    the installed transformers' own requirement for its ``torch`` extra."""
    from importlib.metadata import requires

    need = [r.split(";")[0].split(">=")[1].strip() for r in requires("transformers") or ()
            if r.replace(" ", "").startswith("torch>=") and 'extra == "torch"' in r]
    assert need, "transformers' metadata names no torch>= requirement for its torch extra"
    assert _minor(_pin("torch")[2:]) >= _minor(need[0]), (
        f"pyproject.toml pins torch{_pin('torch')}, below transformers' own torch>={need[0]}")
