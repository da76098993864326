"""README is the front page: short (at most 120 lines, none over 160 characters), its status table names every
registered target once with its family and a column for each backend, its test command is the one CI runs, and every
document it points to exists."""

from __future__ import annotations

import re
from pathlib import Path

from dflash2_trt.targets import TARGETS
from dflash2_trt.trtllm.backend import BACKENDS

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
COLUMNS = ["target", "family", "cpu", "cuda", "TRT-LLM, project runtime", "TRT-LLM, C++ executor"]


def _table() -> list[list[str]]:
    rows = [ln for ln in README.splitlines() if ln.startswith("| ")]
    return [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in rows]


def test_front_page_is_short():
    lines = README.splitlines()
    assert len(lines) <= 120, f"README has {len(lines)} lines"
    long = [(i + 1, len(ln)) for i, ln in enumerate(lines) if len(ln) > 160]
    assert not long, f"lines over 160 characters: {long}"


def test_status_table_rows_are_the_registry():
    head, sep, *rows = _table()
    assert head == COLUMNS and set(sep) == {"---"}
    # one column per backend: cpu, cuda, and TensorRT-LLM's two runtimes
    assert {"cpu", "cuda"} <= set(head) and "trtllm" in BACKENDS and sum("TRT-LLM" in c for c in head) == 2
    got = {r[0]: r[1] for r in rows}
    assert len(got) == len(rows), "a target is listed twice"
    assert got == {k: t.family for k, t in TARGETS.items()}
    assert all(len(r) == len(COLUMNS) and all(r) for r in rows)


def test_status_cells_are_what_targets_prints():
    """The status cells live once, in the registry (`dflash2-trt targets`, the dry run); README shows the same words,
    and its legend the same meanings."""
    from dflash2_trt.targets import STATUS_COLUMNS, STATUS_LEGEND, status_of

    head, _sep, *rows = _table()
    assert tuple(head[2:]) == STATUS_COLUMNS
    for r in rows:
        assert dict(zip(STATUS_COLUMNS, r[2:])) == status_of(TARGETS[r[0]]), r[0]
    legend = " ".join(README.split("## Status", 1)[1].split("\n\n")[1].split())
    for term in STATUS_LEGEND.split("; "):
        word, meaning = term.split(": ", 1)
        assert f"`{word}`: {meaning}" in legend, term


def test_the_test_command_is_cis():
    cmd = re.search(r"```bash\n(python3 -m venv .venv && .*pytest -q)\n```", README).group(1)
    assert cmd in (ROOT / ".ci" / "run").read_text()


def test_documents_it_points_to_exist():
    for doc in set(re.findall(r"(?:docs|plugins)/[\w-]+\.md", README)):
        assert (ROOT / doc).is_file(), doc


def test_the_tensorrt_llm_build_commands_plan_without_a_blocker():
    """README's TensorRT-LLM commands, planned as the build would plan them (configs only: --download and --output
    dropped, --dry-run added): each published pair builds, on the runtime path README names."""
    import json
    import shlex

    from click.testing import CliRunner

    from dflash2_trt.cli import main

    block = README.split("With TensorRT-LLM 1.2", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    parts = [c.strip() for ln in block.replace("\\\n", " ").splitlines() for c in ln.split("&&")]
    cmds = [c for c in parts if c.startswith("dflash2-trt build")]
    assert {shlex.split(c)[3] for c in cmds} == {"qwen3.8-27b", "muse-glimmer-30b"}, cmds
    for c in cmds:
        argv = shlex.split(c)[1:]
        i = argv.index("--output")
        argv = [a for a in argv[:i] + argv[i + 2:] if a != "--download"]
        r = CliRunner().invoke(main, [*argv, "--dry-run", "--json", "--backend", "trtllm"])
        assert r.exit_code == 0, (c, r.output)
        plan = json.loads(r.stdout)          # stderr: the note that the shipped configs stand in for the checkpoints
        assert plan["supported"]["trtllm_engine"] is True and plan["trtllm_blockers"] == [], (c, plan["trtllm_blockers"])


def test_the_tensorrt_llm_setup_is_the_one_docs_trt_session_gives():
    """README's setup of TensorRT-LLM's own environment is docs/trt-session.md §11's, step for step: it once left out
    the CUDA 13 torch line (without it pip takes PyPI's torch 2.9.0) and Open MPI's headers (a new user's check)."""
    section = (ROOT / "docs" / "trt-session.md").read_text(encoding="utf-8")
    section = section[section.index("## 11."):]
    block = section[section.index("```bash"):]
    block = block[:block.index("```", 7)]
    steps = []
    for ln in block.splitlines()[1:]:
        cmd = ln.split("#")[0].strip()
        if cmd.startswith(("sudo apt-get", "python3 -m venv ~/trt", "~/trt/bin/pip install")):
            steps += [c.strip() for c in cmd.split("&&") if "~/trt" in c or "apt-get" in c]
    assert len(steps) >= 4, steps
    flat = " ".join(README.replace("\\\n", " ").split())
    for step in steps:
        assert " ".join(step.split()) in flat, f"README's TensorRT-LLM setup lacks docs/trt-session.md §11's: {step}"
