"""The one validated way in: what every command checks before any weight reaches transformers,
the reference or a converter.

:func:`validate_pair` is the entry point for commands that load a drafter + target pair
(``generate``, ``analyze``, and later ``build`` / ``run``); ``inspect`` reports the same checks
(:func:`check_dir`) without stopping at the first. In order, and with the same messages:

1. each directory's ``config.json`` through the typed configs (:mod:`dflash2_trt.config`);
2. each directory's safetensors headers and index through the strict reader
   (:class:`~dflash2_trt.checkpoint.SafetensorsCheckpoint`: truncation, overlapping or untiled
   byte ranges, duplicate names, shards);
3. each tensor inventory: the drafter's published contract, the target's from transformers' own
   model on the meta device (missing, unexpected, wrong shape, wrong dtype) - transformers would
   otherwise fill a missing tensor with random values and say nothing;
4. values (NaN/Inf), see ``check_values`` below;
5. pairing (vocab, widths, ``fc`` width, layer ids, mask id, dtype).

Every failure is a :class:`~dflash2_trt.errors.DFlash2Error` of one line naming the file (and the
tensor or field); with several problems the first is reported, with a count and the ``inspect``
command that lists them all.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Union

from .checkpoint import SafetensorsCheckpoint, check_inventory, expected_drafter_tensors, expected_target_tensors
from .checkpoint import has_weights
from .checkpoint.inventory import IGNORED_TARGET_PREFIXES, Expected, InventoryReport
from .config import DFlash2Config, TargetConfig, pairing_problems
from .config._fields import load_config_dict
from .errors import CheckpointError, DFlash2Error, PairingError

__all__ = ["CheckValues", "DirCheck", "ValidatedPair", "FULL_SCAN_BYTES", "check_dir", "is_drafter_config",
           "scan_values", "validate_pair", "validate_target", "validate_drafter"]

CheckValues = Union[bool, Literal["auto", "critical"]]
# check_values="auto" scans every tensor of a pair up to this size (a bit-level scan of a few GB
# costs seconds); above it, only the tensors whose NaN/Inf would not surface as NaN logits.
FULL_SCAN_BYTES = 4 << 30


def is_drafter_config(data: dict) -> bool:
    return "DFlash2DraftModel" in (data.get("architectures") or []) or "dflash_config" in data


@dataclass
class DirCheck:
    """The checks of one drafter or target directory, all problems collected."""

    path: Path
    kind: str                                   # "drafter" | "target"
    cfg: Any                                    # DFlash2Config | TargetConfig
    expected: dict[str, Expected]
    ckpt: SafetensorsCheckpoint | None = None   # None: config-only directory
    inventory: InventoryReport | None = None
    value_errors: list[CheckpointError] = field(default_factory=list)   # NaN/Inf, one per bad tensor
    values_checked: str = "none"                # "all" | "critical" | "none"

    @property
    def ignore_prefixes(self) -> tuple[str, ...]:
        return IGNORED_TARGET_PREFIXES if self.kind == "target" else ()

    def problems(self) -> list[str]:
        """Inventory problems (bare, as ``inspect`` lists them) then value problems (whole messages)."""
        return (self.inventory.problems() if self.inventory is not None else []) + [str(e) for e in self.value_errors]

    def errors(self) -> list[DFlash2Error]:
        """:meth:`problems` as one-line errors naming the directory (value errors name their file)."""
        out: list[DFlash2Error] = []
        if self.inventory is not None:
            out += [CheckpointError(p, file=self.path) for p in self.inventory.problems()]
        return out + list(self.value_errors)


def _critical(check: DirCheck) -> list[str]:
    """Tensors whose NaN/Inf would NOT show up as NaN logits at run time, so a scan must find them:
    the embedding (only rows of the prompt's tokens are read), the LM head (an Inf row is a token
    that always wins the argmax), every 1-D tensor (norm scales, biases, decay parameters: cheap),
    and all of the drafter (small next to its target)."""
    assert check.ckpt is not None
    if check.kind == "drafter":
        return check.ckpt.keys()
    out = []
    for name, info in check.ckpt.infos().items():
        if name in check.expected and (len(info.shape) <= 1 or name.endswith(("embed_tokens.weight",
                                                                                "lm_head.weight"))):
            out.append(name)
    return out


def scan_values(ckpt: SafetensorsCheckpoint, names: list[str] | None = None, *,
                desc: str | None = None) -> list[CheckpointError]:
    """NaN/Inf errors (one per bad tensor, naming file and tensor and counting NaN and Inf) among
    ``names`` (default: every tensor), read one tensor at a time, in row chunks."""
    import torch

    from tqdm import tqdm

    names = ckpt.keys() if names is None else names
    infos = ckpt.infos()
    bad = []
    with tqdm(total=sum(infos[n].nbytes for n in names), unit="B", unit_scale=True, desc=desc or "scanning",
              disable=not sys.stderr.isatty(), leave=False) as bar:
        for name in names:
            info = infos[name]
            t = ckpt.get(name, check_finite=False)
            if t.is_floating_point() and t.numel():
                rows = t.reshape(t.shape[0] if t.dim() > 1 else 1, -1)
                step = max(1, (64 << 20) // max(1, rows[0].numel() * t.element_size()))
                finite = all(bool(torch.isfinite(rows[i:i + step]).all()) for i in range(0, rows.shape[0], step))
                if not finite:
                    try:
                        ckpt.get(name, check_finite=True)   # the reader's own message (counts NaN / Inf)
                    except CheckpointError as exc:
                        bad.append(exc)
            bar.update(info.nbytes)
    return bad


def check_dir(path: str | Path, *, kind: str | None = None, check_values: CheckValues = False,
              target_hidden_size: int | None = None, require_weights: bool = False) -> DirCheck:
    """Config, headers, inventory and (``check_values``) values of one directory.

    Config and header errors are raised (nothing else can be checked without them); inventory and
    value problems are collected in the result. ``kind`` (``"drafter"``/``"target"``) insists on
    one; a config-only directory is a problem only with ``require_weights``.
    """
    path = Path(path)
    data, _ = load_config_dict(path)
    found = "drafter" if is_drafter_config(data) else "target"
    if kind is not None and kind != found:
        want = "a DFlash2 drafter" if kind == "drafter" else "a target model"
        got = "a target" if found == "target" else "a DFlash2 drafter"
        raise DFlash2Error(f"{path}: expected {want}, found {got} config")
    if found == "drafter":
        cfg: Any = DFlash2Config.from_hugging_face(path)
        expected = expected_drafter_tensors(cfg, target_hidden_size)
    else:
        cfg = TargetConfig.from_hugging_face(path)
        expected = expected_target_tensors(cfg)
    check = DirCheck(path, found, cfg, expected)
    if not has_weights(path):
        if require_weights:
            raise CheckpointError("no weights (*.safetensors or model.safetensors.index.json): only a config "
                                  "was found", file=path)
        return check
    check.ckpt = SafetensorsCheckpoint(path)
    check.inventory = check_inventory(check.ckpt, expected, ignore_prefixes=check.ignore_prefixes)
    if check_values == "auto":
        check_values = "all" if check.ckpt.total_bytes <= FULL_SCAN_BYTES else "critical"
    elif check_values is True:
        check_values = "all"
    if check_values in ("all", "critical"):
        names = None if check_values == "all" else _critical(check)
        check.value_errors = scan_values(check.ckpt, names, desc=f"scanning {path.name}")
        check.values_checked = check_values
    return check


def _raise_first(errors: list[DFlash2Error], drafter_dir: Path | None, target_dir: Path | None) -> None:
    """Raise the first of ``errors``, saying how many more there are and how to list them."""
    if not errors:
        return
    first = errors[0]
    if len(errors) > 1:
        where = (f"--drafter {drafter_dir} --target-dir {target_dir}" if drafter_dir and target_dir
                 else str(drafter_dir or target_dir))
        first.args = (f"{first} (and {len(errors) - 1} more problem(s): `dflash2-trt inspect {where} "
                      "--check-values` lists them all)",)
    raise first


@dataclass(frozen=True)
class ValidatedPair:
    """A drafter + target pair that passed every check of :func:`validate_pair`."""

    drafter_dir: Path
    target_dir: Path
    drafter: DFlash2Config
    target: TargetConfig
    drafter_ckpt: SafetensorsCheckpoint
    target_ckpt: SafetensorsCheckpoint
    values_checked: str   # "all" | "critical" | "none" (for the larger of the two)


def _pair_scan(check_values: CheckValues, drafter_dir: Path, target_dir: Path) -> CheckValues:
    """``auto`` decides once for the pair (both sides scanned in full, or both critical-only)."""
    if check_values != "auto":
        return check_values
    total = 0
    for d in (drafter_dir, target_dir):
        try:
            total += sum(p.stat().st_size for p in Path(d).glob("*.safetensors"))
        except OSError:
            pass
    return True if total <= FULL_SCAN_BYTES else "critical"


def validate_drafter(drafter_dir: str | Path, *, check_values: CheckValues = "auto",
                     target_hidden_size: int | None = None) -> tuple[DFlash2Config, SafetensorsCheckpoint]:
    """:func:`validate_pair` for a drafter alone (the ``fc`` width needs ``target_hidden_size``)."""
    c = check_dir(drafter_dir, kind="drafter", check_values=check_values, target_hidden_size=target_hidden_size,
                  require_weights=True)
    _raise_first(c.errors(), Path(drafter_dir), None)
    return c.cfg, c.ckpt


def validate_target(target_dir: str | Path, *, check_values: CheckValues = "auto"
                    ) -> tuple[TargetConfig, SafetensorsCheckpoint]:
    """:func:`validate_pair` for a target alone."""
    c = check_dir(target_dir, kind="target", check_values=check_values, require_weights=True)
    _raise_first(c.errors(), None, Path(target_dir))
    return c.cfg, c.ckpt


def validate_pair(drafter_dir: str | Path, target_dir: str | Path, *, check_values: CheckValues = "auto",
                  cast_dtype: str | None = None) -> ValidatedPair:
    """Check a drafter + target pair completely, before anything loads it; raise the first problem.

    ``check_values``: ``True`` scans every tensor for NaN/Inf; ``False`` none (headers and
    inventory only); ``"auto"`` (default) every tensor when the pair's safetensors total at most
    :data:`FULL_SCAN_BYTES`, otherwise the tensors whose NaN/Inf would not surface as NaN logits
    at run time (embedding, LM head, 1-D tensors, the whole drafter; see :func:`_critical`) -
    ``convert`` checks all values while streaming, and the reference loop checks its logits.
    ``cast_dtype``: the weights will be cast to it, so the two sides' stored dtypes need not agree.
    """
    drafter_dir, target_dir = Path(drafter_dir), Path(target_dir)
    scan = _pair_scan(check_values, drafter_dir, target_dir)
    d = check_dir(drafter_dir, kind="drafter", check_values=scan, require_weights=True)
    errors = d.errors()
    t = check_dir(target_dir, kind="target", check_values=scan, require_weights=True)
    errors += t.errors()
    assert d.ckpt is not None and t.ckpt is not None
    fc = d.ckpt.info("fc.weight").shape if "fc.weight" in d.ckpt else None
    dcfg = replace(d.cfg, dtype=t.cfg.dtype) if cast_dtype else d.cfg
    pair = pairing_problems(dcfg, t.cfg, fc_weight_shape=fc)
    from .config.pairing import warn_pairing

    warn_pairing(d.cfg)
    errors += [PairingError(f"drafter and target do not pair: {p}") for p in pair]
    _raise_first(errors, drafter_dir, target_dir)
    return ValidatedPair(drafter_dir, target_dir, d.cfg, t.cfg, d.ckpt, t.ckpt,
                         max(d.values_checked, t.values_checked, key=("none", "critical", "all").index))
