"""The shipped tokenizer of the tiny pairs: a real HF ``tokenizers`` tokenizer matching their
vocabulary (256 ids: pad 0, BOS 1, EOS 2, words 3..254, MASK 255), text round trips, streamed
pieces decode to the whole, and `build` copies it into the engine so `run --prompt` works."""

from __future__ import annotations

import json
import random

import pytest
from click.testing import CliRunner

from dflash2_trt.assets import ASSET_ROOT
from dflash2_trt.assets.phrase_tokenizer import EOS, MASK, PAD, BOS, WORDS, build_tokenizer
from dflash2_trt.cli import main
from dflash2_trt.errors import ConfigError
from dflash2_trt.tokenizer import encode_text, find_tokenizer


@pytest.fixture(scope="module", params=["qwen3", "qwen3_5"])
def shipped(request):
    tok = find_tokenizer(ASSET_ROOT / request.param / "target")
    assert tok is not None, "no tokenizer shipped with the tiny target"
    return request.param, tok


def _config(family):
    cfg = json.loads((ASSET_ROOT / family / "target" / "config.json").read_text())
    return cfg.get("text_config", cfg)


def test_vocabulary_matches_the_target(shipped):
    family, tok = shipped
    cfg = _config(family)
    assert len(tok) == cfg["vocab_size"] == 256
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (PAD, BOS, EOS) == (
        cfg["pad_token_id"], cfg["bos_token_id"], cfg["eos_token_id"])
    drafter = json.loads((ASSET_ROOT / family / "drafter" / "config.json").read_text())
    mask = drafter.get("dflash_config", drafter).get("mask_token_id", drafter.get("mask_token_id"))
    assert tok.mask_token_id == MASK == mask
    assert len(set(WORDS)) == 256 and all(w.isalpha() for w in WORDS[3:255])


def test_every_word_round_trips(shipped):
    _, tok = shipped
    for i in range(3, 255):
        assert encode_text(tok, WORDS[i]) == [i]
        assert tok.decode([i]) == " " + WORDS[i]


def test_shipped_prompts_round_trip_without_bos(shipped):
    family, tok = shipped
    prompts = json.loads((ASSET_ROOT / family / "prompts.json").read_text())["prompts"]
    for p in prompts:
        text = tok.decode(p)
        assert encode_text(tok, text) == p           # no BOS added, nothing lost
        assert encode_text(tok, "  " + text.replace(" ", "\n  ") + " ") == p   # any whitespace separates


def test_pieces_decode_to_the_whole(shipped):
    """Streaming decodes each response on its own: every split must concatenate to the full text."""
    _, tok = shipped
    rng = random.Random(0)
    for _ in range(50):
        ids = [rng.randrange(3, 255) for _ in range(rng.randrange(1, 30))]
        cuts = sorted(set(rng.sample(range(1, len(ids)), k=min(3, len(ids) - 1))) | {len(ids)})
        pieces = [ids[a:b] for a, b in zip([0] + cuts, cuts)]
        assert sum(pieces, []) == ids
        assert "".join(tok.decode(p) for p in pieces) == tok.decode(ids)


def test_special_tokens_and_chat_template(shipped):
    _, tok = shipped
    assert tok.decode([BOS, 5, EOS, 6], skip_special_tokens=True) == " " + WORDS[5] + " " + WORDS[6]
    assert tok.decode([5, EOS], skip_special_tokens=False) == " " + WORDS[5] + "</s>"
    chat = tok.apply_chat_template([{"role": "user", "content": WORDS[7]},
                                    {"role": "assistant", "content": WORDS[8]}], tokenize=False)
    assert chat == f"{WORDS[7]} {WORDS[8]}"


def test_unknown_word_is_one_clear_error(shipped):
    _, tok = shipped
    with pytest.raises(ConfigError, match="'hello' is not in its vocabulary"):
        encode_text(tok, f"{WORDS[3]} hello {WORDS[4]}")


def test_shipped_files_are_the_generator_output(shipped):
    """The files are what phrase_tokenizer.build_tokenizer makes (scripts/make_tiny_tokenizer.py)."""
    family, _ = shipped
    ours = json.loads(build_tokenizer().to_str())
    shipped_tk = json.loads((ASSET_ROOT / family / "target" / "tokenizer.json").read_text())
    for key in ("model", "pre_tokenizer", "decoder", "added_tokens", "normalizer", "post_processor"):
        assert shipped_tk[key] == ours[key], key


def test_build_copies_the_tokenizer_and_run_takes_text(engine, tokenizer, prompts, greedy):
    man = json.loads((engine / "engine.json").read_text())
    assert man["tokenizer"] == "tokenizer"
    assert {"tokenizer/tokenizer.json", "tokenizer/tokenizer_config.json"} <= set(man["files"])
    text = tokenizer.decode(prompts[0])
    r = CliRunner().invoke(main, ["run", "--engine-dir", str(engine), "--prompt", text, "--max-new-tokens", "16",
                                  "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)["requests"][0]
    assert out["output_ids"] == greedy[0]
    assert out["text"] == tokenizer.decode(greedy[0])


def test_run_prints_the_text_of_id_prompts_too(engine, tokenizer, prompts, greedy, engine_without_tokenizer):
    """README's first run (`run --prompt-ids ...`) on an engine with a tokenizer prints the output's text beside its
    ids, as `generate` does and as docs/cli.md says ("token ids (text with a tokenizer)"); it printed ids only. An
    engine without a tokenizer still prints ids only."""
    r = CliRunner().invoke(main, ["run", "--engine-dir", str(engine), "--prompt-ids", ",".join(map(str, prompts[0])),
                                  "--max-new-tokens", "4"])
    assert r.exit_code == 0, r.output
    assert f"  text: {tokenizer.decode(greedy[0][:4])}" in r.output.splitlines(), r.output
    r = CliRunner().invoke(main, ["run", "--engine-dir", str(engine_without_tokenizer), "--prompt-ids", "5,6,7",
                                  "--max-new-tokens", "1", "--json"])
    assert r.exit_code == 0 and "text" not in json.loads(r.output)["requests"][0], r.output


def test_run_text_on_an_engine_without_tokenizer(engine_without_tokenizer):
    """The seeded random tiny pair has no tokenizer: text prompts are one clear error."""
    eng = engine_without_tokenizer
    assert not (eng / "tokenizer").exists() and json.loads((eng / "engine.json").read_text())["tokenizer"] is None
    r = CliRunner().invoke(main, ["run", "--engine-dir", str(eng), "--prompt", WORDS[5]])
    assert r.exit_code == 1 and r.output.startswith("error: ") and "has none" in r.output, r.output


def test_a_text_that_encodes_to_nothing_is_an_error():
    """A tokenizer whose pipeline ignores its vocabulary (AutoTokenizer's substitute class for
    qwen3_5 did exactly that to the word-level file) would turn every prompt into no tokens."""
    class Broken:
        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": []}

    with pytest.raises(ConfigError, match="no tokens"):
        encode_text(Broken(), WORDS[3])
    assert encode_text(Broken(), "   ") == []
