"""The package's own YAML data (the engine contract ``engine_io.yaml``, facts recorded from TensorRT-LLM's sources,
the plugins' specs), parsed with libyaml where PyYAML has it, each text once per process.

Every CLI process, Triton python model and MPI rank that opens an engine reads several of these files (the contract
alone four times, from different modules): with PyYAML's pure-Python loader that was ~0.3 s per process; its C
loader (``CSafeLoader``, the same safe YAML 1.1 documents) takes a tenth of it. The cache is keyed by the file's text,
so a changed file is parsed again; callers get deep copies, free to change them.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path

import yaml

SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's safe loader where PyYAML was built with it (its wheels are), else the pure-Python one."""


@functools.lru_cache(maxsize=32)
def _parsed(text: str):
    return yaml.load(text, Loader=SAFE_LOADER)


def load_yaml_file(path: str | Path):
    """``yaml.safe_load`` of ``path`` (UTF-8, whatever the locale: the python-backend stub embeds Python without its
    UTF-8 mode), parsed once per distinct text; raises as ``safe_load`` and ``read_text`` do."""
    return copy.deepcopy(_parsed(Path(path).read_text(encoding="utf-8")))
