"""``bench prepare-dataset``: the output loads as trtllm-bench's dataset (a schema written from the 1.2
sources), synthetic datasets are reproducible by seed, every source works, bad input is one line."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from dflash2_trt.bench.dataset import load_bench_requests, prepare_dataset
from dflash2_trt.cli import main
from dflash2_trt.engine.common import read_prompts_file
from dflash2_trt.errors import ConfigError
from dflash2_trt.targets import TARGETS
from trtllm_bench_schema import validate_file, validate_line


def _cli(*args):
    r = CliRunner().invoke(main, list(args))
    return r.exit_code, r.output


def _one_error_line(code, text) -> str:
    assert code != 0
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), text
    return lines[0]


@pytest.fixture(scope="module")
def target_with_tokenizer(tmp_path_factory):
    """The trained tiny target with a word-level tokenizer "w0".."w255" (built here, nothing downloaded)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from dflash2_trt.assets import trained_pair

    d = tmp_path_factory.mktemp("tok") / "target"
    shutil.copytree(trained_pair("qwen3").target_dir, d)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (d / f).unlink(missing_ok=True)
    tk = Tokenizer(models.WordLevel(vocab={f"w{i}": i for i in range(256)}, unk_token="w0"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="w2", unk_token="w0").save_pretrained(d)
    return d


def test_builtin_dataset_is_a_trtllm_bench_dataset(tmp_path):
    out = tmp_path / "ds.jsonl"
    code, text = _cli("bench", "prepare-dataset", "--builtin", "tiny", "--output", str(out), "--output-tokens", "48")
    assert code == 0, text
    rows = validate_file(out)
    shipped = json.loads((__import__("dflash2_trt.assets", fromlist=["ASSET_ROOT"]).ASSET_ROOT
                          / "qwen3" / "prompts.json").read_text())["prompts"]
    assert [r["input_ids"] for r in rows] == shipped
    assert [r["task_id"] for r in rows] == list(range(len(shipped)))
    assert {r["output_tokens"] for r in rows} == {48}
    # the project's own reader (run --prompts, bench run) reads the same lines
    assert [it["input_ids"] for it in read_prompts_file(out)] == shipped


@pytest.mark.parametrize("key", [k for k, e in TARGETS.items() if e.tiny_family is not None])
def test_every_tiny_pair_has_its_builtin_dataset(tmp_path, key):
    """`--builtin` offers each registered tiny pair's shipped prompts (tiny-muse's were refused by click's choice
    list, so a tiny-muse engine had no shipped dataset for `bench run`)."""
    from dflash2_trt.assets import ASSET_ROOT

    out = tmp_path / "ds.jsonl"
    code, text = _cli("bench", "prepare-dataset", "--builtin", key, "--output", str(out))
    assert code == 0, text
    shipped = json.loads((ASSET_ROOT / TARGETS[key].tiny_family / "prompts.json").read_text())["prompts"]
    assert [r["input_ids"] for r in validate_file(out)] == shipped


def test_num_requests_repeats_or_cuts_the_prompts(tmp_path):
    out = tmp_path / "ds.jsonl"
    prepare_dataset(source="builtin", builtin="tiny", output=out, num_requests=20, vocab_size=256)
    rows = validate_file(out)
    assert len(rows) == 20 and [r["task_id"] for r in rows] == list(range(20))
    assert rows[16]["input_ids"] == rows[0]["input_ids"] and rows[19]["input_ids"] == rows[3]["input_ids"]
    prepare_dataset(source="builtin", builtin="tiny", output=out, num_requests=3, force=True)
    assert len(validate_file(out)) == 3


@pytest.mark.parametrize("kind,args", [
    ("token-norm-dist", {"input_mean": 12, "input_stdev": 4, "output_mean": 20, "output_stdev": 6}),
    ("token-unif-dist", {"input_min": 3, "input_max": 9, "output_min": 5, "output_max": 7}),
])
def test_synthetic_datasets_are_reproducible_by_seed(tmp_path, kind, args):
    a, b, c = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "c.jsonl"
    for p, seed in ((a, 5), (b, 5), (c, 6)):
        prepare_dataset(source=kind, output=p, num_requests=40, vocab_size=256, stop_ids=(2,), seed=seed, **args)
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()
    rows = validate_file(a)
    assert len(rows) == 40
    for r in rows:
        assert all(0 <= t < 256 and t != 2 for t in r["input_ids"])          # in the vocabulary, never EOS
        assert r["input_ids"] and r["output_tokens"] >= 1
    if kind == "token-unif-dist":
        assert {len(r["input_ids"]) for r in rows} <= set(range(3, 10))
        assert {r["output_tokens"] for r in rows} <= {5, 6, 7}
        assert len({len(r["input_ids"]) for r in rows}) > 1                   # lengths do vary
    else:
        lens = [len(r["input_ids"]) for r in rows]
        assert 8 < sum(lens) / len(lens) < 16                                # mean 12, stdev 4, n = 40


def test_synthetic_cli_reads_the_vocabulary_from_the_target(tmp_path):
    out = tmp_path / "s.jsonl"
    code, text = _cli("bench", "prepare-dataset", "--synthetic", "token-unif-dist", "--target", "tiny", "--num-requests",
                      "5", "--input-min", "300", "--input-max", "300", "--output-min", "4", "--output-max", "4",
                      "--output", str(out))
    assert code == 0, text
    rows = validate_file(out)
    assert all(len(r["input_ids"]) == 300 and max(r["input_ids"]) < 256 for r in rows)   # longer than the vocab


def test_prompts_and_corpus_sources_tokenize_text(tmp_path, target_with_tokenizer):
    prompts = tmp_path / "p.json"
    prompts.write_text(json.dumps(["w5 w6 w7", [9, 10]]))
    out = tmp_path / "ds.jsonl"
    prepare_dataset(source="prompts", prompts_file=prompts, output=out, tokenizer_dir=target_with_tokenizer,
                    vocab_size=256)
    assert [r["input_ids"] for r in validate_file(out)] == [[5, 6, 7], [9, 10]]
    corpus = tmp_path / "c.txt"
    corpus.write_text("w11 w12\n\n  w13  \n")
    code, text = _cli("bench", "prepare-dataset", "--corpus", str(corpus), "--target-dir", str(target_with_tokenizer),
                      "--output", str(out), "--max-input-len", "1", "--output-tokens", "3", "--force")
    assert code == 0, text
    assert [(r["input_ids"], r["output_tokens"]) for r in validate_file(out)] == [([11], 3), ([13], 3)]
    # a leading byte order mark (Windows editors write one) is not part of the text
    prompts.write_bytes(b"\xef\xbb\xbf" + json.dumps(["w5 w6 w7"]).encode())
    corpus.write_bytes(b"\xef\xbb\xbfw11 w12\n")
    prepare_dataset(source="prompts", prompts_file=prompts, output=out, tokenizer_dir=target_with_tokenizer,
                    vocab_size=256, force=True)
    assert [r["input_ids"] for r in validate_file(out)] == [[5, 6, 7]]
    prepare_dataset(source="corpus", corpus=corpus, output=out, tokenizer_dir=target_with_tokenizer, vocab_size=256,
                    force=True)
    assert [r["input_ids"] for r in validate_file(out)] == [[11, 12]]
    jl = tmp_path / "p.jsonl"
    jl.write_bytes(b"\xef\xbb\xbf" + json.dumps({"task_id": 1, "input_ids": [3, 4]}).encode() + b"\n")
    assert [r["input_ids"] for r in read_prompts_file(jl)] == [[3, 4]]


def test_a_prepared_dataset_replaces_the_old_file_atomically(tmp_path, monkeypatch):
    out = tmp_path / "ds.jsonl"
    out.write_text("old\n")
    import os

    def boom(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(Exception) as exc:
        prepare_dataset(source="builtin", builtin="tiny", output=out, force=True)
    assert "No space left" in str(exc.value) and str(out) in str(exc.value)
    assert out.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds.jsonl"]        # no temporary left behind


def test_an_existing_output_needs_force(tmp_path):
    """Like every other writer: an existing --output is refused in one line and left as it was; --force
    replaces it."""
    out = tmp_path / "ds.jsonl"
    out.write_text("old\n")
    line = _one_error_line(*_cli("bench", "prepare-dataset", "--builtin", "tiny", "--output", str(out)))
    assert line == f"error: --output: {out} exists (pass --force to replace it)", line
    assert out.read_text() == "old\n"
    code, text = _cli("bench", "prepare-dataset", "--builtin", "tiny", "--output", str(out), "--force")
    assert code == 0, text
    assert len(validate_file(out)) > 1


@pytest.mark.parametrize("args,needle", [
    (["--output", "{tmp}/x.jsonl"], "error: give exactly one source: --builtin, --prompts, --corpus or --synthetic"),
    (["--builtin", "tiny", "--synthetic", "token-norm-dist", "--output", "{tmp}/x.jsonl"], "give exactly one source"),
    (["--synthetic", "token-norm-dist", "--num-requests", "2", "--output", "{tmp}/x.jsonl"], "vocabulary"),
    (["--synthetic", "token-norm-dist", "--target", "tiny", "--output", "{tmp}/x.jsonl"], "--num-requests"),
    (["--synthetic", "token-unif-dist", "--target", "tiny", "--num-requests", "2", "--input-min", "5", "--input-max",
      "4", "--output-min", "1", "--output-max", "1", "--output", "{tmp}/x.jsonl"], "--input-max"),
    (["--synthetic", "token-norm-dist", "--target", "tiny", "--num-requests", "2", "--input-mean", "5",
      "--output", "{tmp}/x.jsonl"], "--output-mean"),
    (["--builtin", "tiny", "--num-requests", "0", "--output", "{tmp}/x.jsonl"], "--num-requests"),
    # made in memory: a count of a few digits too many is refused before it exhausts the machine
    (["--builtin", "tiny", "--num-requests", "1000001", "--output", "{tmp}/x.jsonl"],
     "--num-requests: must be at most 1,000,000"),
    (["--synthetic", "token-unif-dist", "--target", "tiny", "--num-requests", "1000001", "--input-min", "1",
      "--input-max", "2", "--output-min", "1", "--output-max", "1", "--output", "{tmp}/x.jsonl"], "at most 1,000,000"),
    # and so are lengths past any context (2e9 tokens ran out of memory after a minute) or too many tokens in all
    (["--synthetic", "token-norm-dist", "--target", "tiny", "--num-requests", "1", "--input-mean", "2000000000",
      "--input-stdev", "0", "--output-mean", "10", "--output-stdev", "0", "--output", "{tmp}/x.jsonl"],
     "--input-mean: must be at most 1,048,576 tokens"),
    (["--synthetic", "token-norm-dist", "--target", "tiny", "--num-requests", "100", "--input-mean", "10",
      "--input-stdev", "0", "--output-mean", "1048576", "--output-stdev", "1048576", "--output", "{tmp}/x.jsonl"],
     "--output-mean / --output-stdev: draw a length of"),
    (["--synthetic", "token-unif-dist", "--target", "tiny", "--num-requests", "1", "--input-min", "1",
      "--input-max", "2", "--output-min", "1", "--output-max", "5000000", "--output", "{tmp}/x.jsonl"],
     "--output-max: must be at most 1,048,576 tokens"),
    (["--synthetic", "token-unif-dist", "--target", "tiny", "--num-requests", "1000000", "--input-min", "1000",
      "--input-max", "1000", "--output-min", "1", "--output-max", "1", "--output", "{tmp}/x.jsonl"],
     "--num-requests: 1,000,000,000 prompt tokens in all: at most 134,217,728"),
    (["--builtin", "tiny", "--output-tokens", "0", "--output", "{tmp}/x.jsonl"], "--output-tokens"),
    (["--synthetic", "token-unif-dist", "--target", "tiny", "--num-requests", "2", "--input-min", "1", "--input-max",
      "2", "--output-min", "1", "--output-max", "1", "--seed", "-1", "--output", "{tmp}/x.jsonl"], "--seed: must be"),
    # options the source does not read are refused, not ignored (the file would not have the lengths asked for)
    (["--builtin", "tiny", "--input-mean", "5", "--output", "{tmp}/x.jsonl"],
     "--input-mean: applies to --synthetic token-norm-dist only, not to --builtin"),
    (["--synthetic", "token-unif-dist", "--target", "tiny", "--num-requests", "2", "--input-min", "1", "--input-max",
      "2", "--output-min", "1", "--output-max", "1", "--output-stdev", "3", "--output", "{tmp}/x.jsonl"],
     "--output-stdev: applies to --synthetic token-norm-dist only, not to --synthetic token-unif-dist"),
    (["--synthetic", "token-norm-dist", "--target", "tiny", "--num-requests", "2", "--input-mean", "5", "--input-stdev",
      "1", "--output-mean", "5", "--output-stdev", "1", "--output-tokens", "9", "--output", "{tmp}/x.jsonl"],
     "--output-tokens: applies to prompt sources"),
    (["--builtin", "tiny", "--seed", "3", "--output", "{tmp}/x.jsonl"], "--seed: applies to --synthetic datasets only"),
    (["--builtin", "tiny", "--output", "{tmp}"], "is a directory"),
    (["--builtin", "tiny", "--output", "{tmp}/missing/x.jsonl"], "does not exist"),
    (["--corpus", "{tmp}/empty.txt", "--target", "tiny", "--output", "{tmp}/x.jsonl"], "no non-empty line"),
    (["--corpus", "{tmp}/text.txt", "--target-dir", "{plain}", "--output", "{tmp}/x.jsonl"], "tokenizer"),
    (["--prompts", "{tmp}/bad.json", "--target", "tiny", "--output", "{tmp}/x.jsonl"], "prompt 0"),
    (["--prompts", "{tmp}/oov.json", "--target", "tiny", "--output", "{tmp}/x.jsonl"], "outside the target's"),
])
def test_bad_input_is_one_error_line(tmp_path, args, needle):
    from dflash2_trt.assets import trained_pair

    plain = tmp_path / "plain"
    shutil.copytree(trained_pair("qwen3").target_dir, plain)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (plain / f).unlink(missing_ok=True)
    (tmp_path / "empty.txt").write_text("\n  \n")
    (tmp_path / "text.txt").write_text("w1 w2\n")
    (tmp_path / "bad.json").write_text(json.dumps([{"ids": [1]}]))
    (tmp_path / "oov.json").write_text(json.dumps([[1, 999]]))
    args = [a.format(tmp=tmp_path, plain=plain) for a in args]
    line = _one_error_line(*_cli("bench", "prepare-dataset", *args))
    assert needle in line, line
    assert not (tmp_path / "x.jsonl").exists()


def test_bench_reader_errors_name_the_file_and_line(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text("")
    with pytest.raises(ConfigError, match="no prompts"):
        load_bench_requests(p, vocab_size=256, default_output_tokens=8, num_requests=None)
    p.write_text('{"task_id": 0, "input_ids": [1, 2], "output_tokens": 4}\n{"task_id": 1, "input_ids": [1,\n')
    with pytest.raises(ConfigError, match=r"d.jsonl: line 2: invalid JSON"):
        load_bench_requests(p, vocab_size=256, default_output_tokens=8, num_requests=None)
    p.write_text('{"task_id": 0, "input_ids": [1, 300], "output_tokens": 4}\n')
    with pytest.raises(ConfigError, match=r"d.jsonl:1.*outside the vocabulary"):
        load_bench_requests(p, vocab_size=256, default_output_tokens=8, num_requests=None)
    p.write_text('{"task_id": 0, "input_ids": [1, 2], "output_tokens": 4}\n')
    with pytest.raises(ConfigError, match="2 requests asked, the dataset has 1"):
        load_bench_requests(p, vocab_size=256, default_output_tokens=8, num_requests=2)


def test_the_schema_check_itself_rejects_what_trtllm_bench_would():
    for bad in ('{"input_ids": [1], "output_tokens": 2}', '{"task_id": 0, "input_ids": [1]}',
                '{"task_id": "0", "input_ids": [1], "output_tokens": 2}', '{"task_id": 0, "output_tokens": 2}',
                '{"task_id": 0, "input_ids": [1.5], "output_tokens": 2}', '[1, 2]'):
        with pytest.raises(AssertionError):
            validate_line(bad)
    assert validate_line('{"task_id":0,"prompt":"hi","output_tokens":2}')["prompt"] == "hi"


def test_written_files_get_the_umask_mode_not_mkstemp_0600(tmp_path):
    """A dataset (or report, plot) is written beside its place by mkstemp, which makes it 0600; the renamed file must
    get the mode a plain open() gives under the umask, or a benchmark run as another user (a container) cannot read
    the dataset."""
    import os

    from dflash2_trt.bench.io import atomic_write_json

    old = os.umask(0o022)
    try:
        out = tmp_path / "ds.jsonl"
        prepare_dataset(source="builtin", builtin="tiny", output=out)
        assert out.stat().st_mode & 0o777 == 0o644
        os.umask(0o027)
        atomic_write_json(tmp_path / "r.json", {"a": 1})
        assert (tmp_path / "r.json").stat().st_mode & 0o777 == 0o640
    finally:
        os.umask(old)


def test_a_registered_target_needs_no_drafter_for_a_dataset(tmp_path, monkeypatch):
    """A dataset needs the target's vocabulary (and tokenizer), never the drafter: `--target qwen3.8-27b` used to
    demand the 27B drafter checkpoint, and `--target qwen3-8b` (no published drafter) said "pass --drafter DIR", an
    option prepare-dataset does not have. Without a local checkpoint the shipped published config gives the
    vocabulary of a synthetic dataset."""
    from dflash2_trt.assets import trained_pair

    models = tmp_path / "models"
    models.mkdir()
    monkeypatch.setenv("DFLASH2_TRT_MODELS", str(models))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    unif = ["--synthetic", "token-unif-dist", "--num-requests", "3", "--input-min", "2", "--input-max", "3",
            "--output-min", "1", "--output-max", "2"]
    code, text = _cli("bench", "prepare-dataset", *unif, "--target", "qwen3.8-27b", "--output", str(tmp_path / "a.jsonl"))
    assert code == 0, text
    assert max(t for ln in validate_file(tmp_path / "a.jsonl") for t in ln["input_ids"]) >= 256   # the 248k vocabulary
    # no local qwen3-8b and no shipped config of it: the advice names what prepare-dataset takes (no --download)
    code, text = _cli("bench", "prepare-dataset", *unif, "--target", "qwen3-8b", "--output", str(tmp_path / "c.jsonl"))
    line = _one_error_line(code, text)
    assert line.startswith("error: --target: target Qwen/Qwen3-8B is not available locally") and "--target-dir DIR" in line
    assert "--download" not in line and "--drafter" not in line, line
    shutil.copytree(trained_pair("qwen3").target_dir, models / "Qwen__Qwen3-8B")   # a local target, no drafter
    code, text = _cli("bench", "prepare-dataset", "--corpus", str(_corpus(tmp_path)), "--target", "qwen3-8b",
                      "--output", str(tmp_path / "b.jsonl"))
    assert code == 0, text


def _corpus(tmp_path):
    p = tmp_path / "corpus.txt"
    p.write_text("puni kiku kito\nlasa sake rako\n")
    return p


def test_prompts_longer_than_the_engine_takes_are_said(tmp_path, target_with_tokenizer):
    """Written as asked (the user may cut later), but said: `run` and `bench run` refuse such prompts."""
    prompts = tmp_path / "p.json"
    prompts.write_text(json.dumps(["w5 " * 600, "w6 w7"]))
    code, text = _cli("bench", "prepare-dataset", "--prompts", str(prompts), "--target-dir", str(target_with_tokenizer),
                      "--output", str(tmp_path / "ds.jsonl"))
    assert code == 0, text
    assert "note: 1 of 2 prompts are longer than the target's max_position_embeddings" in text, text
    assert "--max-input-len" in text


def test_a_builtin_set_is_refused_for_a_target_of_another_language(tmp_path):
    """The shipped prompt sets are token ids of the tiny pairs' phrase language (one tokenizer for all three): for a
    published target they are ids of another vocabulary, meaningless text that was written without a word. Refused,
    naming the option and how to give that target prompts; any tiny target (same tokenizer) still takes any set."""
    from dflash2_trt.assets import trained_pair
    from dflash2_trt.targets import fixtures_dir

    out = tmp_path / "d.jsonl"
    line = _one_error_line(*_cli("bench", "prepare-dataset", "--builtin", "tiny", "--target", "qwen3.8-27b",
                                 "--output", str(out)))
    assert line.startswith("error: --builtin: 'tiny' is token ids of the tiny pairs' phrase language (vocabulary "
                           "256); --target qwen3.8-27b speaks another"), line
    qwen = fixtures_dir() / "Qwen__Qwen3.8-27B"      # its published config: no tokenizer, the vocabulary decides
    line = _one_error_line(*_cli("bench", "prepare-dataset", "--builtin", "tiny-muse", "--target-dir", str(qwen),
                                 "--output", str(out)))
    assert "speaks another (vocabulary 248,320)" in line and "--prompts, --corpus or --synthetic" in line, line
    assert not out.exists()
    code, text = _cli("bench", "prepare-dataset", "--builtin", "tiny-muse", "--target", "tiny",
                      "--output", str(out))
    assert code == 0, text
    code, text = _cli("bench", "prepare-dataset", "--builtin", "tiny", "--target-dir",
                      str(trained_pair("qwen3_5").target_dir), "--output", str(out), "--force")
    assert code == 0, text
