"""Ways to break a checkpoint directory, for the tests of every command's error path.

Each corruption edits a copy in place (never the shipped or cached tiny pairs) and is named, so
that one catalogue drives the reader tests, ``inspect`` and the commands that load weights
(``generate``, ``analyze``, ``convert``): all of them must report the same one-line error.
"""

from __future__ import annotations

import json
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

SAFETENSORS = "model.safetensors"


# ---- raw header surgery ---------------------------------------------------------------------

def copy_with_json(src: Path, dst: Path, name: str, **changes) -> Path:
    """A copy of directory ``src`` at ``dst`` whose JSON file ``name`` (config.json, engine.json) has ``changes`` set
    at its top level."""
    src, dst = Path(src), Path(dst)
    shutil.copytree(src, dst)
    doc = json.loads((dst / name).read_text())
    doc.update(changes)
    (dst / name).write_text(json.dumps(doc))
    return dst


def split_file(path: Path) -> tuple[bytes, bytes]:
    """(header JSON bytes, data bytes) of a safetensors file."""
    raw = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return raw[8:8 + n], raw[8 + n:]


def write_raw(path: Path, header: bytes | str, data: bytes) -> None:
    """Write a safetensors file from header text (padded to 8 bytes like safetensors does) and data."""
    hb = header.encode() if isinstance(header, str) else header
    hb += b" " * (-len(hb) % 8)
    Path(path).write_bytes(struct.pack("<Q", len(hb)) + hb + data)


def edit_header(path: Path, fn: Callable[[dict], object]) -> None:
    """Rewrite the header of ``path`` through ``fn(header_dict)``, which edits the dict in place
    (its return value is ignored), keeping the data bytes exactly as they are."""
    header, data = split_file(path)
    h = json.loads(header)
    fn(h)
    write_raw(path, json.dumps(h), data)


def alias_offsets(path: Path, victim: str, source: str) -> None:
    """Point ``victim``'s data_offsets at ``source``'s bytes (same size): overlapping ranges, and
    the victim's own bytes become a gap."""
    def fn(h):
        assert h[victim]["shape"] == h[source]["shape"] and h[victim]["dtype"] == h[source]["dtype"]
        h[victim]["data_offsets"] = list(h[source]["data_offsets"])
    edit_header(path, fn)


def duplicate_name(path: Path, name: str, other: str) -> None:
    """Name ``name`` twice in the header: its own entry, then a second one pointing at ``other``'s
    bytes (same shape). ``json.loads`` keeps the last, so a lax reader reads ``other``'s bytes
    under ``name`` (and ``name``'s own bytes become a gap)."""
    header, data = split_file(path)
    h = json.loads(header)
    entries = list(h.items()) + [(name, h[other])]
    text = "{" + ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in entries) + "}"
    write_raw(path, text, data)


# ---- tensor edits (re-saved through safetensors: the header stays well formed) ----------------

def edit_tensors(directory: Path, fn: Callable[[dict[str, torch.Tensor]], object]) -> None:
    from safetensors.torch import load_file, save_file

    path = Path(directory) / SAFETENSORS
    sd = load_file(str(path))
    fn(sd)
    save_file(sd, str(path), metadata={"format": "pt"})


def shard(directory: Path, n: int = 2) -> list[str]:
    """Split ``model.safetensors`` into ``n`` shards plus ``model.safetensors.index.json``, the way
    ``save_pretrained`` lays out big checkpoints. Returns the shard file names."""
    from safetensors.torch import load_file, save_file

    directory = Path(directory)
    sd = load_file(str(directory / SAFETENSORS))
    names = sorted(sd)
    files = [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    weight_map = {}
    for i, fname in enumerate(files):
        part = names[i::n]
        save_file({k: sd[k] for k in part}, str(directory / fname), metadata={"format": "pt"})
        weight_map.update({k: fname for k in part})
    (directory / SAFETENSORS).unlink()
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}, indent=2))
    return files


def edit_index(directory: Path, fn: Callable[[dict], object]) -> None:
    p = Path(directory) / "model.safetensors.index.json"
    idx = json.loads(p.read_text())
    fn(idx)
    p.write_text(json.dumps(idx, indent=2))


# ---- the catalogue --------------------------------------------------------------------------

@dataclass(frozen=True)
class Corruption:
    """One way to break the drafter or the target directory of a copied tiny pair.

    ``apply(directory)`` breaks the directory in place; ``needle`` is a piece of the one-line error
    every command must give (together with the file or directory it names).
    """

    name: str
    side: str            # "drafter" | "target"
    apply: Callable[[Path], None]
    needle: str
    stage: str = "reader"  # who catches it: "reader" (headers, index), "inventory", or "values"
                           # (a NaN/Inf scan: inspect needs --check-values)


def _truncate(cut: int) -> Callable[[Path], None]:
    def fn(d: Path) -> None:
        p = d / SAFETENSORS
        data = p.read_bytes()
        p.write_bytes(data[:cut])
    return fn


def _append(d: Path) -> None:
    with open(d / SAFETENSORS, "ab") as fh:
        fh.write(b"\0" * 16)


def _garbage_header(d: Path) -> None:
    (d / SAFETENSORS).write_bytes((20).to_bytes(8, "little") + b"{this is not json!!}" + b"\0" * 8)


def _set(name: str, value: Callable[[], torch.Tensor]) -> Callable[[Path], None]:
    return lambda d: edit_tensors(d, lambda sd: sd.update({name: value()}))


def _pop(name: str) -> Callable[[Path], None]:
    return lambda d: edit_tensors(d, lambda sd: sd.pop(name))


def _poke(name: str, index: tuple[int, ...], value: float) -> Callable[[Path], None]:
    def fn(sd):
        sd[name][index] = value
    return lambda d: edit_tensors(d, fn)


def _sharded_then(fn: Callable[[Path, list[str]], None]) -> Callable[[Path], None]:
    def apply(d: Path) -> None:
        files = shard(d)
        fn(d, files)
    return apply


def _missing_shard(d: Path, files: list[str]) -> None:
    (d / files[1]).unlink()


def _index_ghost(d: Path, files: list[str]) -> None:
    edit_index(d, lambda idx: idx["weight_map"].update({"ghost.weight": files[0]}))


def _index_unlisted(d: Path, files: list[str]) -> None:
    edit_index(d, lambda idx: idx["weight_map"].pop("norm.weight"))


def _index_wrong_shard(d: Path, files: list[str]) -> None:
    def fn(idx):
        wm = idx["weight_map"]
        wm["norm.weight"] = files[1] if wm["norm.weight"] == files[0] else files[0]
    edit_index(d, fn)


def _index_escapes(d: Path, files: list[str]) -> None:
    (d.parent / "outside.safetensors").write_bytes((d / files[1]).read_bytes())
    (d / files[1]).unlink()
    edit_index(d, lambda idx: idx["weight_map"].update(
        {k: "../outside.safetensors" for k, v in idx["weight_map"].items() if v == files[1]}))


def _index_absolute(d: Path, files: list[str]) -> None:
    target = (d / files[1]).resolve()
    edit_index(d, lambda idx: idx["weight_map"].update(
        {k: str(target) for k, v in idx["weight_map"].items() if v == files[1]}))


def _dangling_symlink(d: Path, files: list[str]) -> None:
    (d / files[1]).unlink()
    (d / files[1]).symlink_to("../blobs/nowhere")


def _same_name_two_shards(d: Path, files: list[str]) -> None:
    """``norm.weight`` stored in both shards (the index lists one of them)."""
    from safetensors.torch import load_file, save_file

    a, b = load_file(str(d / files[0])), load_file(str(d / files[1]))
    src, dst, dst_name = (a, b, files[1]) if "norm.weight" in a else (b, a, files[0])
    dst["norm.weight"] = src["norm.weight"].clone()
    save_file(dst, str(d / dst_name), metadata={"format": "pt"})


def _bad_metadata(d: Path) -> None:
    edit_header(d / SAFETENSORS, lambda h: h.update({"__metadata__": {"format": "pt", "step": 3}}))


def _gap(d: Path) -> None:
    def fn(h):
        # drop one tensor from the header: its bytes stay in the file, owned by nobody
        del h["layers.0.self_attn.q_norm.weight"]
    edit_header(d / SAFETENSORS, fn)


D_Q, D_K = "layers.0.self_attn.q_norm.weight", "layers.0.self_attn.k_norm.weight"

CORRUPTIONS: tuple[Corruption, ...] = (
    # reader: file structure
    Corruption("truncated length", "drafter", _truncate(3), "truncated"),
    Corruption("truncated header", "drafter", _truncate(40), "truncated"),
    Corruption("truncated data", "target", _truncate(-1), "truncated"),
    Corruption("corrupt header", "drafter", _garbage_header, "corrupt safetensors header"),
    Corruption("trailing garbage", "target", _append, "does not match its header"),
    Corruption("overlapping offsets", "drafter", lambda d: alias_offsets(d / SAFETENSORS, D_Q, D_K), "overlap"),
    Corruption("gap between tensors", "drafter", _gap, "belong to no tensor"),
    Corruption("duplicate name in a header", "drafter", lambda d: duplicate_name(d / SAFETENSORS, D_Q, D_K),
               "appears twice"),
    Corruption("metadata not string to string", "drafter", _bad_metadata, "__metadata__"),
    # reader: sharded index
    Corruption("missing shard", "drafter", _sharded_then(_missing_shard), "is missing"),
    Corruption("index lists an absent tensor", "drafter", _sharded_then(_index_ghost), "ghost.weight"),
    Corruption("tensor unlisted by the index", "drafter", _sharded_then(_index_unlisted), "not listed"),
    Corruption("index names the wrong shard", "drafter", _sharded_then(_index_wrong_shard), "lacks it"),
    Corruption("index shard outside the directory", "drafter", _sharded_then(_index_escapes),
               "not a file inside the checkpoint directory"),
    Corruption("index shard absolute path", "drafter", _sharded_then(_index_absolute),
               "not a file inside the checkpoint directory"),
    Corruption("dangling symlink shard", "drafter", _sharded_then(_dangling_symlink), "does not exist"),
    Corruption("same name in two shards", "drafter", _sharded_then(_same_name_two_shards), "two shards"),
    # inventory (the corruptions of tests/convert/test_convert_errors.py and tests/test_cli_inspect.py)
    Corruption("missing target tensor", "target", _pop("model.layers.1.mlp.up_proj.weight"),
               "missing tensor model.layers.1.mlp.up_proj.weight", stage="inventory"),
    Corruption("missing lm_head", "target", _pop("lm_head.weight"), "missing tensor lm_head.weight",
               stage="inventory"),
    Corruption("missing drafter tensor", "drafter", _pop("layers.0.mlp_conv.base_kernel"),
               "missing tensor layers.0.mlp_conv.base_kernel", stage="inventory"),
    Corruption("wrong shape", "target", _set("model.layers.1.self_attn.k_proj.weight", lambda: torch.zeros(16, 64)),
               "shape [16, 64], expected [32, 64]", stage="inventory"),
    Corruption("extra target tensor", "target", _set("model.layers.0.extra.weight", lambda: torch.zeros(4)),
               "unexpected tensor model.layers.0.extra.weight", stage="inventory"),
    Corruption("extra drafter tensor", "drafter", _set("layers.0.extra_conv.weight", lambda: torch.zeros(4)),
               "unexpected tensor layers.0.extra_conv.weight", stage="inventory"),
    Corruption("wrong dtype", "target", _set("model.norm.weight", lambda: torch.zeros(64, dtype=torch.float16)),
               "dtype F16, expected F32", stage="inventory"),
    Corruption("integer dtype", "drafter", _set("norm.weight", lambda: torch.zeros(64, dtype=torch.int32)),
               "dtype I32, expected F32", stage="inventory"),
    Corruption("narrow fc", "drafter", _set("fc.weight", lambda: torch.zeros(64, 64)), "fc.weight: shape [64, 64]",
               stage="inventory"),
    # values
    Corruption("inf lm_head", "target", _poke("lm_head.weight", (7, 3), float("inf")),
               "tensor 'lm_head.weight': non-finite values (0 NaN, 1 Inf)", stage="values"),
    Corruption("nan target weight", "target", _poke("model.layers.3.mlp.down_proj.weight", (5, 7), float("nan")),
               "tensor 'model.layers.3.mlp.down_proj.weight': non-finite values (1 NaN, 0 Inf)", stage="values"),
    Corruption("nan drafter norm", "drafter", _poke("norm.weight", (0,), float("nan")),
               "tensor 'norm.weight': non-finite values (1 NaN, 0 Inf)", stage="values"),
)


def copy_pair(pair, root: Path) -> tuple[Path, Path]:
    """Copy ``pair`` (a TinyPair or any object with drafter_dir/target_dir) to ``root/drafter`` and
    ``root/target``. Returns (drafter_dir, target_dir)."""
    root = Path(root)
    d, t = root / "drafter", root / "target"
    shutil.copytree(pair.drafter_dir, d)
    shutil.copytree(pair.target_dir, t)
    return d, t


def corrupt_copy(pair, corruption: Corruption, root: Path) -> tuple[Path, Path]:
    """:func:`copy_pair`, then ``corruption`` applied to its side. Returns (drafter_dir, target_dir)."""
    d, t = copy_pair(pair, root)
    corruption.apply(d if corruption.side == "drafter" else t)
    return d, t
