"""dflash2_trt.yaml_files: the package's YAML data parsed with libyaml, once per text, handed out as copies."""

from __future__ import annotations

from pathlib import Path

import yaml

from dflash2_trt.yaml_files import load_yaml_file

ROOT = Path(__file__).resolve().parents[1]


def test_every_packaged_yaml_reads_as_safe_load_reads_it():
    files = sorted((ROOT / "dflash2_trt").rglob("*.yaml")) + sorted((ROOT / "plugins").glob("*/*.yaml"))
    assert len(files) >= 10
    for f in files:
        assert load_yaml_file(f) == yaml.safe_load(f.read_text(encoding="utf-8")), f


def test_copies_out_and_a_changed_file_is_read_again(tmp_path):
    f = tmp_path / "facts.yaml"
    f.write_text("a: {b: [1, 2]}\n")
    first = load_yaml_file(f)
    first["a"]["b"].append(3)                        # the caller's copy
    assert load_yaml_file(f) == {"a": {"b": [1, 2]}}
    f.write_text("a: {b: [1, 9]}\n")                 # same size, maybe the same mtime: keyed by the text
    assert load_yaml_file(f) == {"a": {"b": [1, 9]}}
