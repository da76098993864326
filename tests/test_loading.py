"""One validated loading path (issue 9): ``generate`` and ``analyze`` check a pair exactly like
``inspect`` (configs, headers, inventories against transformers' meta model, values, pairing)
before transformers sees a file, and report the same one-line error. Before, transformers filled
a missing target tensor with random values, an Inf lm_head went unnoticed, and NaN logits came
out as token 0 with exit status 0."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from dflash2_trt import loading
from dflash2_trt.cli import main
from dflash2_trt.errors import CheckpointError, DFlash2Error, NumericsError
from dflash2_trt.loading import validate_pair
from dflash2_trt.reference.loop import load_target
from dflash2_trt.testing.corrupt import CORRUPTIONS, copy_pair, corrupt_copy, edit_tensors


def _invoke(*args):
    r = CliRunner().invoke(main, [str(a) for a in args])
    assert isinstance(r.exception, SystemExit) or r.exception is None, (args, r.exception, r.output)
    return r


def _error_line(r) -> str:
    """The one error line (transformers' weight-loading bar may precede it on stderr)."""
    assert r.exit_code == 1, r.output
    lines = [x for x in r.output.replace("\r", "\n").splitlines() if x.strip()]
    assert lines[-1].startswith("error: ") and sum(x.startswith("error: ") for x in lines) == 1, r.output
    return lines[-1]


def _pair(d, t):
    return ["--drafter", d, "--target-dir", t]


def _generate(d, t, *extra):
    return _invoke("generate", *_pair(d, t), "--prompt-ids", "1,2,3", "--max-new-tokens", "3", *extra)


def _analyze(d, t, *extra):
    return _invoke("analyze", *_pair(d, t), "--max-prompts", "1", "--max-new-tokens", "9", "--top-k", "4", *extra)


@pytest.fixture
def no_transformers_load(monkeypatch):
    """Fail if a checkpoint reaches transformers' loader (it must be refused before)."""
    import transformers

    def refuse(*a, **kw):
        raise AssertionError(f"transformers was handed {a[:1]} before the checks failed")
    for cls in (transformers.AutoModelForCausalLM, transformers.AutoModelForImageTextToText):
        monkeypatch.setattr(cls, "from_pretrained", refuse)


def test_validate_pair_on_the_tiny_pairs(tiny):
    v = validate_pair(tiny.drafter_dir, tiny.target_dir)
    assert v.target.family == tiny.family and v.drafter.block_size == 8
    assert v.values_checked == "all" and len(v.drafter_ckpt) == 36 and "lm_head.weight" in v.target_ckpt


def _expected_line(case, d, t, inspect_result) -> str:
    """What every command must print: inspect's own error line, or its first problem in one line."""
    if inspect_result.exit_code == 1 and inspect_result.output.startswith("error: "):
        return inspect_result.output.strip()          # raised while reading (config, header, index)
    rep = json.loads(inspect_result.output)
    assert inspect_result.exit_code == 1 and not rep["ok"], rep
    firsts = [(d, p) for p in rep["drafter"]["problems"]] + [(t, p) for p in rep["target"]["problems"]] \
        + [(None, f"drafter and target do not pair: {p}") for p in rep["pairing"]["problems"]]
    where, first = firsts[0]
    assert case.needle in first, (case.name, first)
    if where is None or first.startswith(str(where)):   # value problems already name their file
        return f"error: {first}"
    return f"error: {where}: {first}"


@pytest.mark.parametrize("case", CORRUPTIONS, ids=lambda c: c.name)
def test_generate_and_analyze_report_what_inspect_reports(tiny_dense, tmp_path, case, no_transformers_load):
    d, t = corrupt_copy(tiny_dense, case, tmp_path)
    inspected = _invoke("inspect", *_pair(d, t), "--check-values", "--json")
    expected = _expected_line(case, d, t, inspected)
    assert case.needle in expected and (str(d) in expected or str(t) in expected)
    for name, r in (("generate", _generate(d, t)), ("analyze", _analyze(d, t))):
        line = r.output.strip()
        assert r.exit_code == 1 and "\n" not in line, (name, r.output)
        assert line == expected or line.startswith(expected + " (and "), (name, line, expected)


def test_missing_target_tensor_is_never_random(tiny_dense, tmp_path):
    """load_target refuses a target missing a tensor; even past the project's checks
    (validated=True), transformers' own missing-key report is an error, not random init."""
    case = next(c for c in CORRUPTIONS if c.name == "missing target tensor")
    _, t = corrupt_copy(tiny_dense, case, tmp_path)
    with pytest.raises(CheckpointError, match="missing tensor model.layers.1.mlp.up_proj.weight"):
        load_target(t)
    with pytest.raises(CheckpointError, match="transformers found 1 tensor.*random values"):
        load_target(t, validated=True)


def test_check_values_modes(tiny_dense, tmp_path, monkeypatch):
    """auto = everything for small pairs; above FULL_SCAN_BYTES only the tensors a NaN/Inf would
    poison silently (embedding, lm_head, 1-D, drafter); False = none; True = all."""
    nan_mlp = next(c for c in CORRUPTIONS if c.name == "nan target weight")
    d, t = corrupt_copy(tiny_dense, nan_mlp, tmp_path / "mlp")
    for mode in ("auto", True):
        with pytest.raises(DFlash2Error, match="down_proj.weight': non-finite"):
            validate_pair(d, t, check_values=mode)
    assert validate_pair(d, t, check_values=False).values_checked == "none"
    monkeypatch.setattr(loading, "FULL_SCAN_BYTES", 0)
    assert validate_pair(d, t).values_checked == "critical"   # a big layer weight: left to the logits check
    inf_head = next(c for c in CORRUPTIONS if c.name == "inf lm_head")
    d, t = corrupt_copy(tiny_dense, inf_head, tmp_path / "head")
    with pytest.raises(DFlash2Error, match="lm_head.weight': non-finite values \\(0 NaN, 1 Inf\\)"):
        validate_pair(d, t)


@pytest.fixture
def overflowing(tiny_dense, tmp_path):
    """Finite weights that overflow float32 in the forward pass: only the logits can tell."""
    d, t = copy_pair(tiny_dense, tmp_path)

    edit_tensors(t, lambda sd: sd["model.norm.weight"].fill_(3e38))   # lm_head sums overflow to +-inf, NaN
    validate_pair(d, t)   # every value is finite
    return d, t


@pytest.mark.parametrize("extra", [[], ["--temperature", "0.7"]])
def test_nan_logits_at_run_time_are_one_line(overflowing, extra):
    d, t = overflowing
    r = _generate(d, t, *extra)     # was exit 0 with output ids [0, 0, 0] (argmax of NaN)
    assert _error_line(r).startswith("error: target logits of the prefill pass are not finite")
    assert re.match(r"error: target logits \(position \d+\) are not finite \(\d+ NaN", _error_line(_analyze(d, t)))


def test_drafter_nan_at_run_time(tiny_dense, tmp_path):
    from dflash2_trt.reference.loop import load_pair, speculative_generate

    d, t = copy_pair(tiny_dense, tmp_path)
    edit_tensors(d, lambda sd: sd["norm.weight"].fill_(3e38))
    target, drafter = load_pair(t, d)
    with pytest.raises(NumericsError, match="drafter logits .* are not finite"):
        speculative_generate(target, drafter, [1, 2, 3], max_new_tokens=4)
    assert _error_line(_generate(d, t)).startswith("error: drafter logits (block at position 3) are not finite")
