"""The engine I/O contract (``engine_io.yaml``) as data: inputs and outputs with symbolic shapes."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from ..yaml_files import load_yaml_file

CONTRACT = Path(__file__).resolve().parent / "engine_io.yaml"


@dataclass(frozen=True)
class Port:
    name: str
    dtype: str
    shape: tuple
    memory: str | None
    filled_by: str
    when: str | None = None    # None: every engine; "tp_size > 1": tensor-parallel engines only; "sliding_path
    # context": engines whose target's sliding-window layers take the context route

    def applies(self, tp_size: int = 1, sliding_context: bool = False) -> bool:
        if self.when is None:
            return True
        if self.when == "tp_size > 1":
            return tp_size > 1
        if self.when == "sliding_path context":
            return bool(sliding_context)
        raise ValueError(f"engine_io.yaml: {self.name}: unknown when {self.when!r}")


@lru_cache(maxsize=1)
def load_contract() -> dict:
    data = load_yaml_file(CONTRACT)
    def ports(key):
        return [Port(p["name"], p["dtype"], tuple(p["shape"]), p.get("memory"), p["filled_by"], p.get("when"))
                for p in data[key]]
    return {"engine_config": data["engine_config"], "inputs": ports("inputs"), "outputs": ports("outputs")}


def concrete_shape(shape: tuple, *, K: int, NL: int, V: int | None = None, tp_size: int | None = None) -> tuple:
    """Symbolic shape -> declared shape: batch/token/block dims become -1 (dynamic), K-sized dims numbers."""
    table = {"K": K, "K+1": K + 1, "NL": NL, "W": (K + 32) // 32}   # bs, T, G, GT, NLOG, MB: dynamic
    if tp_size is not None:
        table["AR"] = 7 * tp_size + 3
    out = []
    for s in shape:
        if isinstance(s, int):
            out.append(s)
        elif s in table:
            out.append(table[s])
        elif s == "V" and V is not None:
            out.append(V)
        else:
            out.append(-1)
    return tuple(out)
