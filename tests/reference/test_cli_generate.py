"""`dflash2-trt generate` on the seeded tiny pair (explicit directories, so the test does not
depend on which checkpoints the registry's `--target tiny` currently resolves to)."""

import json
import warnings

from click.testing import CliRunner

from dflash2_trt.cli import main
from dflash2_trt.testing.tiny import tiny_pair


def test_generate_json_and_errors():
    warnings.filterwarnings("ignore")
    runner = CliRunner()
    p = tiny_pair("qwen3")
    dirs = ["--drafter", str(p.drafter_dir), "--target-dir", str(p.target_dir)]
    r = runner.invoke(main, ["generate", *dirs, "--prompt-ids", "1,2,3", "--max-new-tokens", "6",
                             "--block-size", "4", "--json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout[r.stdout.index("{"):])
    assert len(rep["output_ids"]) <= 6 and rep["prompt_ids"] == [1, 2, 3]
    assert rep["target_passes"] == len(rep["acceptance_lengths"]) + 1
    assert abs(rep["mean_acceptance_length"] - sum(rep["acceptance_lengths"]) / len(rep["acceptance_lengths"])) < 1e-9
    r2 = runner.invoke(main, ["generate", *dirs, "--prompt-ids", "1,2,3", "--max-new-tokens", "6",
                              "--block-size", "4"])
    assert r2.exit_code == 0 and "acceptance length: mean" in r2.output
    assert str(rep["output_ids"]) in r2.output
    r3 = runner.invoke(main, ["generate", *dirs, "--prompt", "hello"])
    assert r3.exit_code == 1 and "--prompt-ids" in r3.output
    r4 = runner.invoke(main, ["generate", *dirs, "--prompt-ids", "1,999"])
    assert r4.exit_code == 1 and "outside the vocabulary" in r4.output
    r5 = runner.invoke(main, ["generate", *dirs, "--prompt-ids", "1", "--selector", "sample"])
    assert r5.exit_code == 1 and "temperature" in r5.output


def test_generate_bad_numbers_are_one_line_errors():
    """Out-of-range --max-new-tokens / --top-k are reported as one clear line naming the option
    (not a ValueError traceback from deep in the loop), and --top-k 0 is refused instead of being
    silently replaced by the drafter's default width."""
    warnings.filterwarnings("ignore")
    runner = CliRunner()
    p = tiny_pair("qwen3")
    dirs = ["--drafter", str(p.drafter_dir), "--target-dir", str(p.target_dir)]
    for extra, option in ((["--max-new-tokens", "0"], "--max-new-tokens"),
                          (["--top-k", "0"], "--top-k"),
                          (["--top-k", "257"], "--top-k"),
                          (["--top-k", "300", "--temperature", "0.5"], "--top-k"),
                          (["--temperature", "nan"], "--temperature"),    # was an IndexError traceback
                          (["--temperature", "inf"], "--temperature")):   # was silently uniform sampling
        r = runner.invoke(main, ["generate", *dirs, "--prompt-ids", "1,2,3", "--max-new-tokens", "4", *extra])
        assert r.exit_code == 1 and isinstance(r.exception, SystemExit), (extra, r.exception, r.output)
        assert f"error: {option}" in r.output, (extra, r.output)
