"""``dflash2-trt inspect``: read a drafter or target directory (or a registered pair) and report
family, parameters by module, dtypes, numerics-relevant config and the contract checks."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from .config import pairing_problems
from .loading import check_dir, is_drafter_config  # noqa: F401  (is_drafter_config: re-exported)


def _module_of(name: str) -> str:
    """Group a tensor name into a module bucket: layers.N.x.y -> layers.*.x."""
    name = re.sub(r"^model\.language_model\.|^model\.", "", name)
    m = re.match(r"layers\.\d+\.([^.]+)", name)
    if m:
        return f"layers.*.{m.group(1)}"
    parts = name.split(".")
    return parts[0] if parts[0] != "candidate_selector" else ".".join(parts[:2]).replace(".weight", "")


def _count(shapes: dict[str, tuple[int, ...]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for name, shape in shapes.items():
        key = _module_of(name)
        out[key] = out.get(key, 0) + math.prod(shape)
    return dict(sorted(out.items()))


def inspect_dir(path: str | Path, *, check_values: bool = False, kind: str | None = None) -> dict[str, Any]:
    """Report for one directory. Raises DFlash2Error on unreadable configs and headers; contract
    failures are reported in the result (``ok: false``) so that all of them are shown at once.

    The checks are :func:`dflash2_trt.loading.check_dir`'s, the ones every loading command runs."""
    path = Path(path)
    check = check_dir(path, kind=kind, check_values=check_values)
    cfg = check.cfg
    report: dict[str, Any] = {"path": str(path.resolve())}
    if check.kind == "drafter":
        report.update(kind="drafter", family="dflash2", architecture="DFlash2DraftModel")
        if cfg.ignored_keys:
            report["ignored_config_keys"] = list(cfg.ignored_keys)
    else:
        report.update(kind="target", family=cfg.family, architecture=cfg.architecture)
    ignore = check.ignore_prefixes
    report["config"] = cfg.numerics()
    report["problems"] = []
    if check.ckpt is None:
        report["weights_checked"] = False
        report["note"] = "no weights found (config only): the config was checked, no tensors were"
        report["parameters"] = _count({k: v.shape for k, v in check.expected.items()})
        report["parameters_source"] = "config"
    else:
        ckpt, inv = check.ckpt, check.inventory
        report["weights_checked"] = True
        report["files"] = [str(p.name) for p in ckpt.files]
        report["bytes"] = ckpt.total_bytes
        report["inventory"] = inv.as_dict()
        infos = ckpt.infos()
        report["parameters"] = _count({k: i.shape for k, i in infos.items()
                                       if not any(k.startswith(p) for p in ignore)})
        report["parameters_source"] = "weights"
        dtypes: dict[str, int] = {}
        for i in infos.values():
            dtypes[i.dtype] = dtypes.get(i.dtype, 0) + 1
        report["dtypes"] = dtypes
        if kind_is_drafter(report) and "fc.weight" in infos:
            report["_fc_shape"] = list(infos["fc.weight"].shape)
        if check_values:
            report["values_checked"] = True
        report["problems"] += check.problems()
    report["total_parameters"] = sum(report["parameters"].values())
    if check.kind != "drafter":
        report["warnings"] = tokenizer_warnings(path, cfg.vocab_size)
    report["ok"] = not report["problems"]
    report["_cfg"] = cfg
    return report


def tokenizer_warnings(target_dir: Path, vocab_size: int) -> list[str]:
    """What ``run --prompt`` / ``serve`` would meet with the target's tokenizer: files that do not load, or ids the
    target's embedding has no row for (a tokenizer of another model). Warnings, not contract failures: the engine
    itself takes token ids, and builds without a tokenizer."""
    from .errors import ConfigError
    from .tokenizer import find_tokenizer, out_of_vocab_ids

    try:
        tok = find_tokenizer(target_dir, strict=True)
    except ConfigError as e:
        return [f"tokenizer: {e}: --prompt and served text will fail"]
    if tok is None:
        return []
    bad = out_of_vocab_ids(tok, vocab_size)
    if not bad:
        return []
    return [f"tokenizer: {len(bad)} token id(s) from {bad[0]} to {bad[-1]} are outside vocab_size {vocab_size} "
            f"(config.json): not this target's tokenizer? A prompt that encodes to them is refused"]


def kind_is_drafter(report: dict) -> bool:
    return report.get("kind") == "drafter"


def inspect_pair(drafter_dir: str | Path, target_dir: str | Path, *, check_values: bool = False) -> dict[str, Any]:
    drafter = inspect_dir(drafter_dir, check_values=check_values, kind="drafter")
    target = inspect_dir(target_dir, check_values=check_values, kind="target")
    pair = pairing_problems(drafter["_cfg"], target["_cfg"], fc_weight_shape=drafter.get("_fc_shape"))
    from .config.pairing import pairing_warnings

    return {
        "drafter": drafter,
        "target": target,
        "pairing": {"ok": not pair, "problems": pair, "warnings": pairing_warnings(drafter["_cfg"])},
        "ok": drafter["ok"] and target["ok"] and not pair,
    }


def public(report: dict) -> dict:
    """The report without private keys (for JSON output)."""
    if isinstance(report, dict):
        return {k: public(v) for k, v in report.items() if not k.startswith("_")}
    if isinstance(report, list):
        return [public(v) for v in report]
    return report


def _fmt_params(n: int) -> str:
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return f"{n / div:.2f}{unit}"
    return str(n)


def render(report: dict) -> str:
    """Human-readable text for a dir report or a pair report."""
    if "pairing" in report:
        lines = [render(report["drafter"]), "", render(report["target"]), "", "pairing:"]
        if report["pairing"]["ok"]:
            lines.append("  OK (vocab, hidden size, fc width, target layers, mask id, dtype)")
        lines += [f"  FAIL {p}" for p in report["pairing"]["problems"]]
        lines += [f"  WARN {w}" for w in report["pairing"].get("warnings", ())]
        lines.append("")
        lines.append("RESULT: " + ("OK" if report["ok"] else "FAILED"))
        return "\n".join(lines)
    r = report
    lines = [f"{r['kind']}: {r['path']}", f"  family: {r['family']} ({r['architecture']})"]
    lines.append(f"  parameters ({r['parameters_source']}): {_fmt_params(r['total_parameters'])}")
    for mod, n in r["parameters"].items():
        lines.append(f"    {mod:<40} {_fmt_params(n):>10}")
    if r.get("dtypes"):
        lines.append("  dtypes: " + ", ".join(f"{k} x{v}" for k, v in r["dtypes"].items()))
    lines.append("  config:")
    for k, v in r["config"].items():
        lines.append(f"    {k}: {json.dumps(v)}")
    if r.get("ignored_config_keys"):
        lines.append("  ignored config keys: " + ", ".join(r["ignored_config_keys"]))
    if not r["weights_checked"]:
        lines.append("  weights: NOT CHECKED - " + r["note"])
    else:
        inv = r["inventory"]
        lines.append(f"  weights: {len(r['files'])} file(s), {r['bytes']:,} bytes; {inv['checked']} tensors checked")
        for prefix, n in inv["ignored"].items():
            lines.append(f"    ignored {n} tensors under {prefix} (not part of the language model)")
    for p in r["problems"]:
        lines.append(f"  FAIL {p}")
    lines += [f"  WARN {w}" for w in r.get("warnings", ())]
    lines.append("  contract: " + ("OK" if r["ok"] else "FAILED"))
    return "\n".join(lines)
