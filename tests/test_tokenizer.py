"""Prompt text goes through one tokenizer loader and one encoding rule (no special tokens) in
every command. A word-level tokenizer is built in the test (nothing is downloaded)."""

from __future__ import annotations

import json
import shutil

import pytest

from dflash2_trt.tokenizer import encode_text, find_tokenizer


@pytest.fixture(scope="module")
def target_with_tokenizer(tmp_path_factory, tiny_dense):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    d = tmp_path_factory.mktemp("tok") / "target"
    shutil.copytree(tiny_dense.target_dir, d)
    vocab = {f"w{i}": i for i in range(256)}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="w0"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    # a BOS post-processor that add_special_tokens=True would apply: the rule must not use it
    from tokenizers import processors

    tk.post_processor = processors.TemplateProcessing(single="w1 $A", special_tokens=[("w1", 1)])
    PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="w1", eos_token="w2", unk_token="w0").save_pretrained(d)
    return d


def test_no_tokenizer_files_means_none(tiny_dense):
    assert find_tokenizer(tiny_dense.target_dir) is None


def test_text_encodes_without_special_tokens(target_with_tokenizer):
    tok = find_tokenizer(target_with_tokenizer)
    assert tok is not None
    assert tok("w5 w6")["input_ids"] == [1, 5, 6]  # the BOS the shared rule must not add
    assert encode_text(tok, "w5 w6 w7") == [5, 6, 7]


def test_generate_and_analyze_agree_on_text_prompts(target_with_tokenizer, tiny_dense, tmp_path):
    from dflash2_trt.analyze import load_prompts
    from dflash2_trt.reference.generate import run_generate

    rep = run_generate(tiny_dense.drafter_dir, target_with_tokenizer, prompt="w5 w6 w7", max_new_tokens=3)
    assert rep["prompt_ids"] == [5, 6, 7]
    assert isinstance(rep["output_text"], str) and len(rep["output_text"].split()) == len(rep["output_ids"])
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps(["w5 w6 w7", [9, 10]]))
    assert load_prompts(prompts, target_with_tokenizer) == [[5, 6, 7], [9, 10]]
