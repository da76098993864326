"""scripts/bench_engine.py (docs/benchmarks.md): the usage line its docstring prints names only options it takes."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "bench_engine.py"


def test_the_documented_usage_names_only_real_options():
    usage = next(ln for ln in SCRIPT.read_text().splitlines() if "python scripts/bench_engine.py" in ln)
    documented = set(re.findall(r"--[a-z][a-z-]*", usage))
    help_text = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, check=True,
                               cwd=ROOT).stdout
    taken = set(re.findall(r"--[a-z][a-z-]*", help_text)) - {"--help"}
    assert documented == taken, (documented, taken)
