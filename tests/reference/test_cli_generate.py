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


def _one_line_error(r, option):
    assert r.exit_code == 1 and isinstance(r.exception, SystemExit), (r.exception, r.output)
    assert r.output.startswith(f"error: {option}") and r.output.count("\n") == 1, r.output
    assert "Traceback" not in r.output


def test_generate_prompt_ids_are_strict_base_10():
    """`1,,2` was silently [1, 2] and `1_0` was 10 (Python's int() literal rules): the ids are
    strictly comma-separated base-10 non-negative integers; whitespace around an item is fine."""
    warnings.filterwarnings("ignore")
    runner = CliRunner()
    p = tiny_pair("qwen3")
    dirs = ["--drafter", str(p.drafter_dir), "--target-dir", str(p.target_dir)]
    for bad in ("1,,2", "1_0", "1,2,", ",1", "+1", "-1", "0x10", "1e2", "1.0", "\u0661", "1 2", "", " , "):
        r = runner.invoke(main, ["generate", *dirs, "--prompt-ids", bad, "--max-new-tokens", "2"])
        _one_line_error(r, "--prompt-ids")
    r = runner.invoke(main, ["generate", *dirs, "--prompt-ids", " 1 , 2,3 ", "--max-new-tokens", "2", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout[r.stdout.index("{"):])["prompt_ids"] == [1, 2, 3]


def test_generate_seed_range():
    """--seed 2**70 was an overflow traceback from torch: seeds outside [0, 2**63-1] are refused."""
    warnings.filterwarnings("ignore")
    runner = CliRunner()
    p = tiny_pair("qwen3")
    dirs = ["--drafter", str(p.drafter_dir), "--target-dir", str(p.target_dir), "--prompt-ids", "1,2"]
    for bad in (str(2**70), str(2**64), str(2**63), "-1"):
        r = runner.invoke(main, ["generate", *dirs, "--max-new-tokens", "2", "--seed", bad])
        _one_line_error(r, "--seed")
    r = runner.invoke(main, ["generate", *dirs, "--max-new-tokens", "2", "--seed", str(2**63 - 1), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout[r.stdout.index("{"):])["seed"] == 2**63 - 1


def test_generate_refuses_more_positions_than_the_target_has():
    """The tiny target has max_position_embeddings 512: a longer prompt, or prompt + new tokens
    beyond it, is one line naming the limit (a 600-token prompt with 700 new tokens exited 0, and
    --max-new-tokens 10**9 ran until killed)."""
    warnings.filterwarnings("ignore")
    runner = CliRunner()
    p = tiny_pair("qwen3")
    dirs = ["--drafter", str(p.drafter_dir), "--target-dir", str(p.target_dir)]

    def ids(n):
        return ",".join(str(1 + i % 200) for i in range(n))
    for n, new, option in ((513, 1, "--prompt-ids"), (600, 700, "--prompt-ids"), (500, 13, "--max-new-tokens"),
                           (3, 10**9, "--max-new-tokens")):
        r = runner.invoke(main, ["generate", *dirs, "--prompt-ids", ids(n), "--max-new-tokens", str(new)])
        _one_line_error(r, option)
        assert "max_position_embeddings 512" in r.output, r.output
    r = runner.invoke(main, ["generate", *dirs, "--prompt-ids", ids(500), "--max-new-tokens", "12", "--json"])
    assert r.exit_code == 0, r.output  # exactly at the limit: fine


def test_generate_prompt_names_a_tokenizer_that_does_not_load(tmp_path):
    """A corrupt tokenizer.json was reported as "no tokenizer found" (inspect and run said what it was)."""
    import shutil

    from dflash2_trt.assets import trained_pair

    pair = trained_pair("qwen3")
    target = tmp_path / "target"
    shutil.copytree(pair.target_dir, target)
    (target / "tokenizer.json").write_text("{bad")
    r = CliRunner().invoke(main, ["generate", "--drafter", str(pair.drafter_dir), "--target-dir", str(target),
                                  "--prompt", "puni kiku"])
    lines = r.output.strip().splitlines()
    assert r.exit_code == 1 and len(lines) == 1, r.output
    assert lines[0].startswith(f"error: {target}: has tokenizer files that cannot be loaded ("), r.output
