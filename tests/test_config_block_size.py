"""dflash_config.block_size / --block-size have an upper bound: the block (after at least one prompt token) must fit
in max_position_embeddings, the drafter's (its config) and the target's (where the pair runs). A huge block used
to pass ``inspect`` and crash ``generate`` with a raw allocation traceback (or run for minutes)."""

from __future__ import annotations

import json
import shutil
import warnings

import pytest
from click.testing import CliRunner

from dflash2_trt.assets import ASSET_ROOT
from dflash2_trt.cli import main
from dflash2_trt.config import DFlash2Config, TargetConfig
from dflash2_trt.errors import ConfigError

DRAFTER = ASSET_ROOT / "qwen3" / "drafter"
TARGET = ASSET_ROOT / "qwen3" / "target"
MPE = 512   # both tiny configs' max_position_embeddings


def _drafter_data(**dflash):
    data = json.loads((DRAFTER / "config.json").read_text())
    data["dflash_config"].update(dflash)
    return data


def _drafter_copy(tmp_path, block_size):
    d = tmp_path / "drafter"
    shutil.copytree(DRAFTER, d)
    (d / "config.json").write_text(json.dumps(_drafter_data(block_size=block_size)))
    return d


def _one_line_error(r, start):
    assert r.exit_code == 1 and isinstance(r.exception, SystemExit), (r.exception, r.output)
    assert r.output.startswith(start) and r.output.count("\n") == 1, r.output
    assert "Traceback" not in r.output and "RESULT: OK" not in r.output


def test_max_block_size_is_positions_minus_the_first_prompt_token():
    from dflash2_trt.config.drafter import max_block_size

    assert max_block_size(MPE) == MPE - 1


@pytest.mark.parametrize("bs", [MPE, MPE + 1, 20000, 100000])
def test_config_refuses_a_block_longer_than_its_positions(tmp_path, bs):
    d = _drafter_copy(tmp_path, bs)
    with pytest.raises(ConfigError) as e:
        DFlash2Config.from_hugging_face(d)
    assert e.value.field == "dflash_config.block_size"
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{d / 'config.json'}: dflash_config.block_size: must be at most 511")
    assert f"got {bs}" in msg and f"max_position_embeddings={MPE}" in msg


def test_config_accepts_the_longest_block_that_fits():
    assert DFlash2Config.from_hugging_face(_drafter_data(block_size=MPE - 1)).block_size == MPE - 1
    data = _drafter_data(block_size=8)
    data["max_position_embeddings"] = 9
    assert DFlash2Config.from_hugging_face(data).block_size == 8
    data["max_position_embeddings"] = 8
    with pytest.raises(ConfigError, match="dflash_config.block_size: must be at most 7"):
        DFlash2Config.from_hugging_face(data)


def test_block_size_override_is_bounded():
    cfg = DFlash2Config.from_hugging_face(DRAFTER)
    assert cfg.with_block_size(MPE - 1).block_size == MPE - 1
    for bs in (MPE, 100000):
        with pytest.raises(ConfigError) as e:
            cfg.with_block_size(bs)
        assert e.value.field == "--block-size" and str(e.value).startswith("--block-size: must be at most 511")


def test_the_target_positions_bound_the_block_too():
    """A drafter with more positions than its target: the target's max_position_embeddings decides."""
    from dflash2_trt.reference.loop import check_block_fits_target

    data = _drafter_data(block_size=300)
    dcfg = DFlash2Config.from_hugging_face(data)
    tdata = json.loads((TARGET / "config.json").read_text())
    tdata["max_position_embeddings"] = 256
    tcfg = TargetConfig.from_hugging_face(tdata)
    with pytest.raises(ConfigError) as e:
        check_block_fits_target(dcfg, tcfg)
    assert e.value.field == "dflash_config.block_size" and "at most 255" in str(e.value)
    assert "max_position_embeddings=256" in str(e.value)
    with pytest.raises(ConfigError) as e:
        check_block_fits_target(dcfg, tcfg, 256)
    assert e.value.field == "--block-size"
    check_block_fits_target(dcfg, tcfg, 255)
    tdata["max_position_embeddings"] = 301
    check_block_fits_target(dcfg, TargetConfig.from_hugging_face(tdata))
    # inspect's pair check says the same as one of its problems (before the pair is loaded to run)
    from dflash2_trt.config.pairing import pairing_problems

    assert not any("block_size" in p for p in pairing_problems(dcfg, TargetConfig.from_hugging_face(tdata)))
    problems = [p for p in pairing_problems(dcfg, tcfg) if p.startswith("dflash_config.block_size")]
    assert len(problems) == 1 and "300" in problems[0] and "max_position_embeddings=256" in problems[0], problems


def test_inspect_and_generate_refuse_a_huge_drafter_block(tmp_path):
    warnings.filterwarnings("ignore")
    d = _drafter_copy(tmp_path, 100000)
    pair = ["--drafter", str(d), "--target-dir", str(TARGET)]
    start = f"error: {d / 'config.json'}: dflash_config.block_size: must be at most 511"
    _one_line_error(CliRunner().invoke(main, ["inspect", *pair]), start)
    _one_line_error(CliRunner().invoke(main, ["generate", *pair, "--prompt-ids", "1,2,3",
                                              "--max-new-tokens", "4"]), start)


@pytest.mark.parametrize("bs", ["100000", "20000", str(MPE)])
def test_generate_refuses_a_huge_block_size_override(bs):
    warnings.filterwarnings("ignore")
    r = CliRunner().invoke(main, ["generate", "--drafter", str(DRAFTER), "--target-dir", str(TARGET),
                                  "--prompt-ids", "1,2,3", "--max-new-tokens", "4", "--block-size", bs])
    _one_line_error(r, "error: --block-size: must be at most 511")
    assert f"got {bs}" in r.output
