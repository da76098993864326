"""The analysis arithmetic on synthetic data (no models): recall table -> implied acceptance vs a
direct per-anchor computation, the orderings the definitions force, and counter-examples to
the orderings they do not force."""

import itertools
import json

import pytest
import torch

from dflash2_trt.analyze import (
    AnchorData,
    accepted_prefix,
    direct_acceptance,
    implied_acceptance,
    load_prompts,
    method_hits,
    parse_top_k,
    recall_table,
)
from dflash2_trt.errors import ConfigError
from dflash2_trt.reference.selector import PairwiseSelector


def test_hand_worked_example():
    # leading hits n = [2, 1, 0, 3] -> direct 1 + 6/4 = 2.5
    hits = torch.tensor([[1, 1, 0], [1, 0, 1], [0, 1, 1], [1, 1, 1]], dtype=torch.bool)
    assert accepted_prefix(hits).tolist() == [2, 1, 0, 3]
    t = recall_table(hits)
    assert t["conditional"] == [3 / 4, 2 / 3, 1 / 2]      # 3/4 survive l=1, 2 of 3 l=2, 1 of 2 l=3
    assert t["reached"] == [4, 3, 2] and t["hits"] == [3, 2, 1]
    assert t["unconditional"] == [0.75, 0.75, 0.75]
    assert implied_acceptance(t["conditional"]) == pytest.approx(1 + 0.75 + 0.5 + 0.25)
    assert direct_acceptance(hits) == pytest.approx(2.5)


def test_unreached_positions_are_none_and_count_zero():
    hits = torch.zeros(5, 4, dtype=torch.bool)
    t = recall_table(hits)
    assert t["conditional"] == [0.0, None, None, None]
    assert implied_acceptance(t["conditional"]) == 1.0 == direct_acceptance(hits)


@pytest.mark.parametrize("seed", range(20))
def test_implied_equals_direct_on_random_hits(seed):
    g = torch.Generator().manual_seed(seed)
    n, L = int(torch.randint(1, 200, (1,), generator=g)), int(torch.randint(1, 16, (1,), generator=g))
    p = torch.rand(1, L, generator=g)           # per-position hit rates, some near 0 or 1
    hits = torch.rand(n, L, generator=g) < p
    t = recall_table(hits)
    assert implied_acceptance(t["conditional"]) == pytest.approx(direct_acceptance(hits), abs=1e-12)


# ---------------------------------------------------------------------------------------------
# synthetic anchors with a random selector
# ---------------------------------------------------------------------------------------------
def _synthetic(seed, n=300, L=7, V=40, K=16, R=8, skill=2.0):
    """Anchors whose labels are often (not always) high in a noisy unary ranking."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, V, (n, L), generator=g)
    anchors = torch.randint(0, V, (n,), generator=g)
    unary = torch.randn(n, L, V, generator=g)
    unary.scatter_add_(-1, labels[..., None], skill * torch.rand(n, L, 1, generator=g) * 2)
    scores, ids = torch.sort(unary, dim=-1, descending=True, stable=True)
    sel = PairwiseSelector(hidden_size=R, vocab_size=V, rank=R, top_k=K)
    with torch.no_grad():
        sel.predecessor_codebook.normal_(0, 1, generator=g)
        sel.successor_codebook.normal_(0, 1, generator=g)
    data = AnchorData(anchors=anchors, labels=labels, cand_ids=ids[..., :K], cand_scores=scores[..., :K],
                      proj_hidden=torch.randn(n, L, R, generator=g), prompt_index=torch.zeros(n, dtype=torch.long),
                      position=torch.arange(n), continuations=[])
    return data, sel


@pytest.mark.parametrize("seed", range(4))
def test_forced_orderings(seed):
    data, sel = _synthetic(seed)
    ks = [1, 2, 4, 8, 16]
    top1 = accepted_prefix(method_hits(data, "top1", 1))
    oracle = {k: accepted_prefix(method_hits(data, "oracle", k)) for k in ks}
    # oracle@1 is top-1
    assert torch.equal(oracle[1], top1)
    for k in ks:
        g = accepted_prefix(method_hits(data, "greedy", k, sel))
        v = accepted_prefix(method_hits(data, "viterbi", k, sel))
        # per anchor: a selector hit is a top-k hit, so no selector beats the oracle
        assert bool((g <= oracle[k]).all()) and bool((v <= oracle[k]).all()) and bool((top1 <= oracle[k]).all())
    for a, b in zip(ks, ks[1:]):
        # wider lists only add candidates: oracle acceptance and per-position recall grow
        assert bool((oracle[a] <= oracle[b]).all())
        ua = method_hits(data, "oracle", a).float().mean(0)
        ub = method_hits(data, "oracle", b).float().mean(0)
        assert bool((ua <= ub).all())
    # the data is not degenerate: the orderings above are strict somewhere
    assert oracle[16].float().mean() > oracle[1].float().mean()


def _teacher_forced_greedy_hits(data, sel, k):
    """Independent of the walk: at each position score the candidates from the TRUE predecessor's
    row, S(c) = U(c) + sum_r A[pred, r] * Hp[r] * B[cand_c, r], take the first maximum."""
    n, L = data.labels.shape
    A = sel.predecessor_codebook.detach()
    B = sel.successor_codebook.detach()
    hits = torch.zeros(n, L, dtype=torch.bool)
    for i in range(n):
        for l in range(L):
            pred = int(data.anchors[i]) if l == 0 else int(data.labels[i, l - 1])
            best, best_c = None, None
            for c in range(k):
                tok = int(data.cand_ids[i, l, c])
                s = float(data.cand_scores[i, l, c]) + float((A[pred] * data.proj_hidden[i, l] * B[tok]).sum())
                if best is None or s > best:
                    best, best_c = s, tok
            hits[i, l] = best_c == int(data.labels[i, l])
    return hits


@pytest.mark.parametrize("k", [4, 16])
def test_greedy_walk_prefix_equals_teacher_forced_recall(k):
    """The recall table of greedy@k is 'conditional on earlier positions being right': on the
    surviving anchors the walk reads the true predecessor's row. So the walk's accepted prefix
    equals the teacher-forced one per anchor (the implied acceptance from a teacher-forced recall
    table equals the direct walk)."""
    data, sel = _synthetic(7, n=120)
    walk = method_hits(data, "greedy", k, sel)
    tf = _teacher_forced_greedy_hits(data, sel, k)
    assert torch.equal(accepted_prefix(walk), accepted_prefix(tf))
    assert implied_acceptance(recall_table(tf)["conditional"]) == pytest.approx(direct_acceptance(walk))


def _two_by_two(unary, pair_scores, labels, anchor=0):
    """One anchor, L=2 positions, k=2 candidates (ids: position 0 -> [1, 2], position 1 -> [3, 4]).
    ``pair_scores[(a, b)]`` is the pairwise term; realised with one-hot codebooks (rank = V)."""
    V = 5
    sel = PairwiseSelector(hidden_size=V, vocab_size=V, rank=V, top_k=2)
    with torch.no_grad():
        sel.predecessor_codebook.copy_(torch.eye(V))
        sel.successor_codebook.zero_()
    # pair(a, b) = sum_r A[a, r] * Hp[r] * B[b, r] with A = I, Hp = 1:  B[b, a] = pair(a, b)
    with torch.no_grad():
        for (a, b), v in pair_scores.items():
            sel.successor_codebook[b, a] = v
    data = AnchorData(anchors=torch.tensor([anchor]), labels=torch.tensor([labels]),
                      cand_ids=torch.tensor([[[1, 2], [3, 4]]]), cand_scores=torch.tensor([unary]),
                      proj_hidden=torch.ones(1, 2, V), prompt_index=torch.zeros(1, dtype=torch.long),
                      position=torch.zeros(1, dtype=torch.long), continuations=[])
    return data, sel


def test_viterbi_is_not_guaranteed_above_greedy():
    # greedy takes 1 (score 1.0 > 0.9) then 3; viterbi prefers 2 -> 4 (0.9 + 5) over 1 -> 3 (1 + 1).
    # Labels [1, 3]: greedy accepts 2, viterbi 0.
    data, sel = _two_by_two([[1.0, 0.9], [1.0, 0.0]], {(2, 4): 5.0}, labels=[1, 3])
    g = accepted_prefix(method_hits(data, "greedy", 2, sel))
    v = accepted_prefix(method_hits(data, "viterbi", 2, sel))
    assert g.tolist() == [2] and v.tolist() == [0]
    # ... and the other way round with labels [2, 4]
    data, sel = _two_by_two([[1.0, 0.9], [1.0, 0.0]], {(2, 4): 5.0}, labels=[2, 4])
    assert accepted_prefix(method_hits(data, "greedy", 2, sel)).tolist() == [0]
    assert accepted_prefix(method_hits(data, "viterbi", 2, sel)).tolist() == [2]


def test_selector_is_not_guaranteed_above_top1():
    # top-1 at position 1 is 3; the pair term (1 -> 4) makes greedy choose 4; labels [1, 3]
    data, sel = _two_by_two([[1.0, 0.0], [1.0, 0.5]], {(1, 4): 2.0}, labels=[1, 3])
    assert accepted_prefix(method_hits(data, "top1", 1)).tolist() == [2]
    assert accepted_prefix(method_hits(data, "greedy", 2, sel)).tolist() == [1]


def test_method_errors():
    data, sel = _synthetic(0, n=4)
    with pytest.raises(Exception, match="outside the collected"):
        method_hits(data, "oracle", 17)
    with pytest.raises(ValueError, match="candidate_selector"):
        method_hits(data, "greedy", 4)
    with pytest.raises(ValueError, match="unknown method"):
        method_hits(data, "beam", 4, sel)


def test_parse_top_k():
    assert parse_top_k("4,8,16") == [4, 8, 16]
    for bad in ("", "4,x", "0,4"):
        with pytest.raises(ConfigError, match="top"):
            parse_top_k(bad)


def test_load_prompts_forms(tmp_path):
    a = tmp_path / "a.json"
    a.write_text(json.dumps({"prompts": [[1, 2, 3], [4]]}))
    assert load_prompts(a) == [[1, 2, 3], [4]]
    b = tmp_path / "b.jsonl"
    b.write_text("[5, 6]\n\n[7]\n")
    assert load_prompts(b) == [[5, 6], [7]]
    c = tmp_path / "c.json"
    c.write_text(json.dumps([[1], [2.5]]))
    with pytest.raises(ConfigError, match=r"prompts\[1\]"):
        load_prompts(c)
    d = tmp_path / "d.json"
    d.write_text(json.dumps(["some text"]))
    with pytest.raises(ConfigError, match="tokenizer"):
        load_prompts(d)
    e = tmp_path / "e.jsonl"
    e.write_text("[1]\nnot json\n")
    with pytest.raises(ConfigError, match="line 2"):
        load_prompts(e)
    with pytest.raises(ConfigError, match="empty"):
        f = tmp_path / "f.json"
        f.write_text("[[]]")
        load_prompts(f)
    # an object whose prompts field is not a list names that field (it said "prompt 0 must be a list of token ids")
    g = tmp_path / "g.json"
    for doc, got in (({"prompts": 5}, "got int"), ({"x": [[1]]}, "missing from the JSON object")):
        g.write_text(json.dumps(doc))
        with pytest.raises(ConfigError) as exc:
            load_prompts(g)
        assert str(exc.value) == f"{g}: prompts: must be a list of prompts (token id lists or strings), {got}"


def test_analyze_pair_refuses_bad_options_before_loading(tmp_path):
    """A negative --temperature was silently ignored (no sampled runs) and a negative
    --max-prompts silently dropped prompts from the end (prompts[:-1]); both are refused, before
    any model is loaded (the directories here do not exist)."""
    from dflash2_trt.analyze import analyze_pair

    for kw, field in (({"temperature": -0.5}, "temperature"), ({"temperature": float("nan")}, "temperature"),
                      ({"max_prompts": -1}, "--max-prompts"),
                      ({"max_prompts": 0}, "--max-prompts")):
        with pytest.raises(ConfigError, match=field):
            analyze_pair(tmp_path / "no-drafter", tmp_path / "no-target", **kw)


def test_a_bad_block_size_names_the_option_not_the_config_file():
    """analyze / generate --block-size 0 used to say "drafter/config.json: block_size: must be >= 2, got 0", blaming
    a file that says 8: the value is the option's."""
    from click.testing import CliRunner

    from dflash2_trt.cli import main

    for cmd in (["analyze", "--target", "tiny"], ["generate", "--target", "tiny", "--prompt-ids", "1,2"]):
        r = CliRunner().invoke(main, [*cmd, "--block-size", "0"])
        lines = [ln for ln in r.output.splitlines() if ln.startswith("error:")]
        assert r.exit_code == 1 and lines == ["error: --block-size: must be >= 2, got 0 (the drafter's config has 8)"], \
            r.output


def test_a_temperature_without_measured_runs_is_refused():
    """--temperature only adds measured sampling runs: with --no-measure the report was byte-identical, the option
    silently ignored (a new user's review)."""
    from click.testing import CliRunner

    from dflash2_trt.cli import main

    r = CliRunner().invoke(main, ["analyze", "--target", "tiny", "--no-measure", "--temperature", "1"])
    assert r.exit_code == 1 and r.output.strip() == ("error: --temperature: applies to the measured runs, which "
                                                     "--no-measure skips"), r.output
