"""Helpers every benchmark module shares, with no imports from the other bench modules: what an engine
directory's ``engine.json`` says (without loading the engine), the ``--concurrency`` list, the progress bar."""

from __future__ import annotations

import sys
from pathlib import Path

from ..engine.format import ENGINE_FORMAT
from ..errors import ConfigError
from ..textfiles import json_loads

STEPS_FORMAT = "dflash2-trt bench steps"
"""``format`` of a ``bench steps`` report (``dflash2_trt/bench/steps.py``)."""
SERVE_FORMAT = "dflash2-trt bench serve report"
"""``format`` of a ``bench serve`` report (``dflash2_trt/bench/serve.py``)."""
ROOFLINE_KIND = "roofline model (not a measurement)"
MEASURED_KIND = "measured step costs (not a roofline model)"
PROJECTION_KINDS = (ROOFLINE_KIND, MEASURED_KIND)
"""``kind`` of a ``bench project`` projection: the roofline model's, or from a ``bench steps`` report's costs."""


def engine_backend(engine_dir) -> tuple[str, dict, dict | None]:
    """(backend, manifest, engine config or None) of an engine directory, without loading it."""
    d = Path(engine_dir)
    if not d.is_dir():
        raise ConfigError("not a directory", source=d)
    man_path = d / "engine.json"
    if not man_path.is_file():
        raise ConfigError("not an engine directory (no engine.json; build one with `dflash2-trt build`)", source=d)
    try:
        man = json_loads(man_path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read: {exc}", source=man_path) from None
    if not isinstance(man, dict) or man.get("format") != ENGINE_FORMAT:
        raise ConfigError(f"format {man.get('format') if isinstance(man, dict) else None!r}, expected "
                          f"{ENGINE_FORMAT!r}", source=man_path, field="format")
    backend = man.get("backend")
    if backend not in ("cpu", "cuda", "trtllm"):
        raise ConfigError(f"unknown backend {backend!r}", source=man_path, field="backend")
    cfg = None
    try:
        cfg = json_loads((d / "config.json").read_text())
    except (OSError, ValueError):
        pass
    return backend, man, cfg


def paired_target(target_key: str, field: str = "--target"):
    """The registry entry of ``target_key`` for the commands that read a registered pair's shapes and take no
    ``--drafter`` (``bench steps``, ``bench project``, ``bench run --project-target``): a target without a published
    drafter (``qwen3-8b``) is refused here, not with a hint to pass an option these commands do not have."""
    from ..targets import TARGETS, get_target

    entry = get_target(target_key)
    if entry.drafter_id is None and entry.tiny_family is None:
        pairs = ", ".join(k for k, e in TARGETS.items() if e.drafter_id is not None or e.tiny_family is not None)
        raise ConfigError(f"target {target_key!r} has no published drafter, and this command reads a published pair's "
                          f"shapes (it takes no --drafter); one of: {pairs}", field=field)
    return entry


def parse_concurrency(text) -> list[int]:
    """``"1,4,16"`` -> ``[1, 4, 16]``; each >= 1, no repeats."""
    if isinstance(text, (list, tuple)):
        items = [str(t) for t in text]
    else:
        items = [t.strip() for t in str(text).split(",")]
    if not items or any(not t.isdigit() or not t.isascii() for t in items):
        raise ConfigError(f"expected comma-separated positive integers, got {text!r}", field="--concurrency")
    vals = [int(t) for t in items]
    if any(v < 1 for v in vals):
        raise ConfigError(f"every concurrency must be >= 1, got {text!r}", field="--concurrency")
    if len(set(vals)) != len(vals):
        raise ConfigError(f"a concurrency is repeated in {text!r}", field="--concurrency")
    return vals


def progress_bar(enabled: bool, total: int, desc: str):
    """A bar of requests done on stderr (``enabled``: on a terminal only; tqdm's ``disable=None`` is off where stderr
    is not a TTY, e.g. in CI logs)."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="req", file=sys.stderr, disable=None if enabled else True, leave=False,
                dynamic_ncols=True)
