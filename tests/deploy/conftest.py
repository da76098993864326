"""Shared fixtures of the deployment tests: a CPU engine of the trained tiny pair (max batch 16),
the target's own greedy continuations of the shipped prompts (the oracle), and real tritonservers
on 127.0.0.1 that are always stopped (finalizers kill their process groups; a test asserts none is
left)."""

from __future__ import annotations

import json
import os

import pytest

from dflash2_trt.assets import ASSET_ROOT, trained_pair

from deploy_helpers import EOS, MAX_NEW, SERVERS, stop_and_check, start_server  # noqa: E402


@pytest.fixture(scope="session")
def engine(tmp_path_factory):
    """`dflash2-trt build --target tiny --backend cpu --max-batch-size 16` (with its tokenizer copy)."""
    from click.testing import CliRunner

    from dflash2_trt.cli import main

    out = tmp_path_factory.mktemp("deploy") / "engine"
    r = CliRunner().invoke(main, ["build", "--target", "tiny", "--backend", "cpu", "--output", str(out),
                                  "--max-batch-size", "16"])
    assert r.exit_code == 0, r.output
    return out


@pytest.fixture(scope="session")
def engine_without_tokenizer(tmp_path_factory, tiny_dense):
    """A CPU engine of the seeded random tiny pair, whose target has no tokenizer."""
    from click.testing import CliRunner

    from dflash2_trt.cli import main

    out = tmp_path_factory.mktemp("deploy") / "engine-no-tokenizer"
    r = CliRunner().invoke(main, ["build", "--drafter", str(tiny_dense.drafter_dir), "--target-dir",
                                  str(tiny_dense.target_dir), "--backend", "cpu", "--output", str(out)])
    assert r.exit_code == 0, r.output
    return out


@pytest.fixture(scope="session")
def prompts():
    """The first 10 of the pair's 16 held-out prompts (the oracle decodes one token per target pass)."""
    return json.loads((ASSET_ROOT / "qwen3" / "prompts.json").read_text())["prompts"][:10]


@pytest.fixture(scope="session")
def target():
    from dflash2_trt.reference.loop import load_pair

    pair = trained_pair("qwen3")
    t, _ = load_pair(pair.target_dir, pair.drafter_dir)
    return t


@pytest.fixture(scope="session")
def greedy(target, prompts):
    """The target's own greedy continuation of every shipped prompt (MAX_NEW tokens, EOS stops). None of them reaches
    EOS, so they are also what a Triton response carries (which leaves the end token out: serving.response_tokens)
    and the tests compare both with them as they are."""
    from dflash2_trt.reference.loop import target_generate

    out = [target_generate(target, p, MAX_NEW, stop_token_ids=EOS) for p in prompts]
    assert not any(g and g[-1] in EOS for g in out), "a continuation ends at EOS: compare responses with response_tokens"
    return out


@pytest.fixture(scope="session")
def tokenizer(engine):
    from dflash2_trt.tokenizer import find_tokenizer

    tok = find_tokenizer(engine / "tokenizer")
    assert tok is not None
    return tok


def _server(tmp_path_factory, engine, *, decoupled):
    from dflash2_trt.deploy.triton.repository import deploy_triton

    repo = tmp_path_factory.mktemp("repo") / ("decoupled" if decoupled else "plain")
    deploy_triton(engine, repo, decoupled=decoupled)
    return start_server(repo)


@pytest.fixture(scope="session")
def server_plain(tmp_path_factory, engine):
    """Not decoupled: HTTP and gRPC infer (the tensorrt_llm model batches each execute's requests)."""
    srv = _server(tmp_path_factory, engine, decoupled=False)
    yield srv
    stop_and_check(srv)


@pytest.fixture(scope="session")
def server_stream(tmp_path_factory, engine):
    """Decoupled: in-flight batching across requests, one response per engine step."""
    srv = _server(tmp_path_factory, engine, decoupled=True)
    yield srv
    stop_and_check(srv)


def pytest_sessionfinish(session, exitstatus):
    """Belt and braces: a server a failing fixture did not stop is stopped here."""
    for srv in SERVERS:
        srv.close()


os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
