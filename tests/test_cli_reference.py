"""docs/cli.md's command table is held to the CLI itself: every command it names exists, and every option it lists
for a command is one of that command's options (click's own parameter table, what ``--help`` prints), so the
reference cannot name a flag the CLI does not take."""

from __future__ import annotations

import re
from pathlib import Path

import click

from dflash2_trt.cli import main

DOC = Path(__file__).resolve().parents[1] / "docs" / "cli.md"


def _rows():
    for line in DOC.read_text(encoding="utf-8").splitlines():
        m = re.match(r"\| `dflash2-trt ([^`]*)`", line)
        if m:
            yield m.group(1)


def _command(words: list[str]):
    cmd, path = main, []
    for w in words:
        if not isinstance(cmd, click.Group) or w not in cmd.commands:
            break
        cmd, path = cmd.commands[w], path + [w]
    return cmd, path


def _options(cmd) -> set[str]:
    out = set()
    for p in cmd.params:
        out.update(o for o in (*p.opts, *getattr(p, "secondary_opts", ())) if o.startswith("--"))
    return out


def test_every_documented_command_and_option_exists():
    rows = list(_rows())
    assert len(rows) >= 15, "the command table was not found"
    seen = set()
    for cell in rows:
        cmd, path = _command(cell.split())
        assert path, f"docs/cli.md names a command the CLI does not have: {cell[:60]}"
        seen.add(" ".join(path))
        unknown = set(re.findall(r"--[a-z][a-z0-9-]*", cell)) - _options(cmd)
        assert not unknown, f"`dflash2-trt {' '.join(path)}`: docs/cli.md lists {sorted(unknown)}, which it does not take"
    # and the table covers every command there is
    every = {" ".join(p) for p in _all(main, [])}
    assert every <= seen | {"bench", "deploy"}, f"commands missing from docs/cli.md: {sorted(every - seen)}"


def test_every_option_is_named_in_its_commands_row():
    """"Every command, its options": each option a command takes appears in its row (the cell or the text beside
    it); `--download`, shared by the pair options, is documented once under the registered targets. The rows had left
    out build's --max-input-len / --max-num-tokens, generate's --block-size / --top-k, most of analyze's and four of
    bench run's."""
    text = DOC.read_text(encoding="utf-8")
    assert "`--download` allows fetching from the hub" in text
    rows: dict[str, str] = {}
    for line in text.splitlines():
        m = re.match(r"\| `dflash2-trt ([^`]*)`", line)
        if m:
            key = " ".join(_command(m.group(1).split())[1])
            rows[key] = rows.get(key, "") + line
    for key, row in rows.items():
        missing = _options(_command(key.split())[0]) - set(re.findall(r"--[a-z][a-z0-9-]*", row)) - {"--help",
                                                                                                    "--download"}
        assert not missing, f"docs/cli.md's `dflash2-trt {key}` row does not name {sorted(missing)}"


def _all(group, prefix):
    for name, c in group.commands.items():
        yield prefix + [name]
        if isinstance(c, click.Group):
            yield from _all(c, prefix + [name])
