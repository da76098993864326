"""Lazy, strict reading of Hugging Face safetensors checkpoints (single file or sharded).

Headers are parsed and validated up front (cheap: no tensor data is touched), so that a truncated
file, a bad header or a shard missing from the index is reported with its file name before any
work starts. Tensor data is memory-mapped and materialised one tensor at a time by :meth:`get`.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import TYPE_CHECKING, Iterator

from ..errors import CheckpointError
from ..textfiles import json_loads

if TYPE_CHECKING:
    import torch

# safetensors dtype tag -> bytes per element. torch is imported only when a tensor is read
# (:meth:`SafetensorsCheckpoint.get`): parsing headers, which conversion needs first, does not pay for it.
_ITEMSIZE = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
             "F8_E4M3": 1, "F8_E5M2": 1}
_TORCH_NAMES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64", "I64": "int64",
                "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool",
                "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}


def torch_dtype_of(tag: str):
    """The torch dtype of a safetensors dtype tag (imports torch)."""
    import torch

    return getattr(torch, _TORCH_NAMES[tag])


def __getattr__(name: str):
    if name == "TORCH_TO_TAG":  # torch dtype -> tag, built on first use (imports torch)
        table = {torch_dtype_of(t): t for t in _TORCH_NAMES}
        globals()["TORCH_TO_TAG"] = table
        return table
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


DTYPE_NAMES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}
_MAX_HEADER = 100 * 1024 * 1024
INDEX_NAME = "model.safetensors.index.json"


@dataclass(frozen=True)
class TensorInfo:
    name: str
    file: Path
    dtype: str  # safetensors tag, e.g. "BF16"
    shape: tuple[int, ...]
    offsets: tuple[int, int]  # [begin, end) within the data section

    @property
    def nbytes(self) -> int:
        return self.offsets[1] - self.offsets[0]

    @property
    def torch_dtype(self) -> "torch.dtype":
        return torch_dtype_of(self.dtype)


class _DuplicateKey(ValueError):
    def __init__(self, key: str, value: object):
        super().__init__(key)
        self.key = key
        self.is_tensor = isinstance(value, dict) and "data_offsets" in value  # a header's tensor entry


def _strict_object(pairs: list[tuple[str, object]]) -> dict:
    """``json`` object hook that refuses duplicate keys (``json.loads`` silently keeps the last one,
    so a header naming a tensor twice would read the second entry's bytes under that name)."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key, value)
        out[key] = value
    return out


def load_json_strict(text: str | bytes):
    """``json.loads`` that raises :class:`_DuplicateKey` on a key repeated in one object."""
    return json_loads(text, object_pairs_hook=_strict_object)


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _describe_missing(path: Path) -> str:
    if path.is_symlink():
        return f"is a symlink to {os.readlink(path)!r}, which does not exist"
    return "does not exist"


def read_header(path: Path) -> tuple[dict[str, TensorInfo], dict[str, str], int]:
    """Parse and validate one safetensors file's header: (tensors, metadata, data offset).

    Beyond the JSON itself: every entry is ``{dtype, shape, data_offsets}`` with JSON integers;
    no tensor name appears twice; ``__metadata__`` is a string-to-string map; and the tensors'
    byte ranges tile the data section exactly (sorted by offset, each begins where the previous
    ends, the first at 0 and the last at the end of the file). Overlapping ranges would hand two
    tensors the same bytes and a gap means bytes no tensor owns: both are corrupt files that
    would otherwise load without a word.
    """
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            raw_len = fh.read(8)
            if len(raw_len) < 8:
                raise CheckpointError(f"file is truncated: {size} bytes, not even a header length", file=path)
            (n,) = struct.unpack("<Q", raw_len)
            if n > _MAX_HEADER or 8 + n > size:
                raise CheckpointError(
                    f"file is truncated or not safetensors: header length {n} but file has {size} bytes", file=path
                )
            header_bytes = fh.read(n)
    except FileNotFoundError:
        raise CheckpointError(f"cannot read: the file {_describe_missing(path)}", file=path) from None
    except OSError as exc:
        raise CheckpointError(f"cannot read: {exc.strerror or exc}", file=path) from None
    try:
        header = load_json_strict(header_bytes)
    except _DuplicateKey as exc:
        if exc.is_tensor:
            raise CheckpointError("corrupt safetensors header: this tensor name appears twice in the header",
                                  file=path, tensor=exc.key) from None
        raise CheckpointError(f"corrupt safetensors header: key {exc.key!r} appears twice in one object",
                              file=path) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"corrupt safetensors header: {exc}", file=path) from None
    if not isinstance(header, dict):
        raise CheckpointError("corrupt safetensors header: not a JSON object", file=path)
    metadata = header.pop("__metadata__", None)
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise CheckpointError(f"corrupt safetensors header: __metadata__ must map strings to strings, got "
                              f"{json.dumps(metadata)[:200]}", file=path)
    data_start = 8 + n
    data_len = size - data_start
    tensors: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        ok = isinstance(entry, dict) and {"dtype", "shape", "data_offsets"} <= set(entry)
        if ok:
            dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
            ok = (isinstance(dtype, str) and isinstance(shape, list) and all(_is_int(s) and s >= 0 for s in shape)
                  and isinstance(offsets, list) and len(offsets) == 2 and all(_is_int(o) for o in offsets))
        if not ok:
            raise CheckpointError(f"corrupt header entry {json.dumps(entry)[:200]} (expected dtype, shape and "
                                  "data_offsets [begin, end] as non-negative integers)", file=path, tensor=name)
        shape = tuple(shape)
        begin, end = offsets
        if dtype not in _ITEMSIZE:
            raise CheckpointError(f"unsupported dtype {dtype!r}", file=path, tensor=name)
        expected = math.prod(shape) * _ITEMSIZE[dtype]
        if end - begin != expected or begin < 0:
            raise CheckpointError(
                f"corrupt header: offsets [{begin}, {end}) hold {end - begin} bytes but shape {list(shape)} "
                f"{dtype} needs {expected}", file=path, tensor=name)
        if end > data_len:
            raise CheckpointError(
                f"file is truncated: tensor data ends at byte {data_start + end} but the file has {size} bytes",
                file=path, tensor=name)
        tensors[name] = TensorInfo(name, path, dtype, shape, (begin, end))
    ordered = sorted(tensors.values(), key=lambda i: (i.offsets, i.name))
    prev = None
    for info in ordered:  # overlaps first: they are the worse fault (two tensors read the same bytes)
        if prev is not None and info.offsets[0] < prev.offsets[1]:
            raise CheckpointError(
                f"corrupt header: data_offsets {list(info.offsets)} overlap tensor '{prev.name}' "
                f"{list(prev.offsets)} (two tensors would share bytes)", file=path, tensor=info.name)
        if prev is None or info.offsets[1] > prev.offsets[1]:
            prev = info
    pos, prev = 0, None
    for info in ordered:
        begin, end = info.offsets
        if begin > pos:
            where = f"after tensor '{prev.name}' {list(prev.offsets)}" if prev else "at the start of the data"
            raise CheckpointError(
                f"corrupt header: bytes [{pos}, {begin}) {where} belong to no tensor (data_offsets must tile "
                "the data section exactly)", file=path, tensor=info.name)
        pos, prev = max(pos, end), info
    if pos != data_len:
        raise CheckpointError(
            f"file size {size} does not match its header (data should end at byte {data_start + pos}); "
            "the file is corrupt or was not fully written", file=path)
    return tensors, metadata, data_start


def _read_index(index: Path) -> dict[str, str]:
    """The ``weight_map`` of a sharded checkpoint's index: tensor name -> shard file name."""
    try:
        data = load_json_strict(index.read_text(encoding="utf-8"))
    except _DuplicateKey as exc:
        raise CheckpointError(f"invalid index: key {exc.key!r} appears twice (a tensor listed twice?)",
                              file=index) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        data = None
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict):
        raise CheckpointError("invalid index: expected a JSON object with a 'weight_map'", file=index)
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or not shard:
            raise CheckpointError(f"invalid index: weight_map entry {shard!r} is not a file name", file=index,
                                  tensor=name)
    return weight_map


def _shard_path(directory: Path, index: Path, shard: str, weight_map: dict[str, str]) -> Path:
    """The shard file the index names, which must lie inside the checkpoint directory.

    ``..`` components and absolute paths are refused (an index must not make the reader open
    files elsewhere). Symlinked shard files are allowed: the Hugging Face cache stores every
    snapshot file as a symlink into its ``blobs/`` directory.
    """
    first = next(n for n, s in weight_map.items() if s == shard)
    rel = PurePosixPath(shard.replace("\\", "/"))
    if rel.is_absolute() or PureWindowsPath(shard).drive or ".." in rel.parts:
        raise CheckpointError(f"invalid index: shard path {shard!r} is not a file inside the checkpoint "
                              "directory (absolute paths and '..' are refused)", file=index, tensor=first)
    p = directory / rel
    if not p.is_file():
        n = sum(1 for v in weight_map.values() if v == shard)
        if p.is_symlink():
            raise CheckpointError(f"shard {shard!r} named by the index ({n} tensors) {_describe_missing(p)}",
                                  file=p)
        raise CheckpointError(f"shard {shard!r} named by the index ({n} tensors) is missing", file=p)
    return p


class SafetensorsCheckpoint:
    """All tensors of one checkpoint directory, by name, read lazily.

    ``prefix`` restricts the view to names starting with it and strips it (e.g.
    ``model.language_model.`` for the language model inside a multimodal wrapper).
    """

    def __init__(self, directory: str | Path, *, prefix: str = "", _infos: dict[str, TensorInfo] | None = None):
        self.directory = Path(directory)
        self.prefix = prefix
        if _infos is None:
            _infos = self._scan(self.directory)
        self._all = _infos
        if prefix:
            self._infos = {k[len(prefix):]: v for k, v in _infos.items() if k.startswith(prefix)}
        else:
            self._infos = dict(_infos)
        self._handles: dict[Path, object] = {}

    @staticmethod
    def _scan(directory: Path) -> dict[str, TensorInfo]:
        if not directory.is_dir():
            raise CheckpointError("checkpoint directory not found", file=directory)
        index = directory / INDEX_NAME
        infos: dict[str, TensorInfo] = {}
        if index.is_file():
            weight_map = _read_index(index)
            shards = sorted(set(weight_map.values()))
            paths = {shard: _shard_path(directory, index, shard, weight_map) for shard in shards}
            per_file = {shard: read_header(paths[shard])[0] for shard in shards}
            owners: dict[str, str] = {}
            for shard in shards:
                for name in per_file[shard]:
                    if name in owners:
                        raise CheckpointError(f"tensor appears in two shards ({owners[name]} and {shard})",
                                              file=paths[shard], tensor=name)
                    owners[name] = shard
            for name, shard in weight_map.items():
                if name not in per_file[shard]:
                    where = f" (it is in {owners[name]})" if name in owners else ""
                    raise CheckpointError(f"{INDEX_NAME} places this tensor in {shard} but that file lacks "
                                          f"it{where}", file=paths[shard], tensor=name)
                infos[name] = per_file[shard][name]
            for shard, tensors in per_file.items():
                extra = sorted(set(tensors) - set(weight_map))
                if extra:
                    raise CheckpointError(f"tensor not listed in {INDEX_NAME} ({len(extra)} such in this shard)",
                                          file=paths[shard], tensor=extra[0])
        else:
            files = sorted(directory.glob("*.safetensors"))
            if not files:
                raise CheckpointError("no *.safetensors files (and no index)", file=directory)
            for p in files:
                for name, info in read_header(p)[0].items():
                    if name in infos:
                        raise CheckpointError(f"tensor appears in two files ({infos[name].file.name})", file=p, tensor=name)
                    infos[name] = info
        return infos

    # ---- views -----------------------------------------------------------------------------
    def with_prefix(self, prefix: str) -> "SafetensorsCheckpoint":
        return SafetensorsCheckpoint(self.directory, prefix=self.prefix + prefix, _infos=self._all)

    @property
    def files(self) -> list[Path]:
        return sorted({i.file for i in self._infos.values()})

    def keys(self) -> list[str]:
        return list(self._infos)

    def __contains__(self, name: str) -> bool:
        return name in self._infos

    def __len__(self) -> int:
        return len(self._infos)

    def info(self, name: str) -> TensorInfo:
        try:
            return self._infos[name]
        except KeyError:
            raise CheckpointError("tensor not found", file=self.directory, tensor=self.prefix + name) from None

    def infos(self) -> dict[str, TensorInfo]:
        return dict(self._infos)

    @property
    def total_bytes(self) -> int:
        return sum(i.nbytes for i in self._infos.values())

    # ---- data ------------------------------------------------------------------------------
    def get(self, name: str, *, check_finite: bool = True) -> "torch.Tensor":
        """One tensor, memory-mapped (no copy until used). Non-finite values are an error."""
        import torch

        info = self.info(name)
        handle = self._handles.get(info.file)
        if handle is None:
            from safetensors import safe_open

            try:
                handle = safe_open(str(info.file), framework="pt")
            except Exception as exc:  # safetensors raises its own error types
                raise CheckpointError(f"cannot open: {exc}", file=info.file) from None
            self._handles[info.file] = handle
        try:
            tensor = handle.get_tensor(info.name)
        except Exception as exc:
            raise CheckpointError(f"cannot read tensor: {exc}", file=info.file, tensor=info.name) from None
        if check_finite and tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            n_nan = int(torch.isnan(tensor).sum())
            n_inf = int(torch.isinf(tensor).sum())
            raise CheckpointError(f"non-finite values ({n_nan} NaN, {n_inf} Inf)", file=info.file, tensor=info.name)
        return tensor

    def items(self, *, check_finite: bool = True) -> Iterator[tuple[str, "torch.Tensor"]]:
        for name in self._infos:
            yield name, self.get(name, check_finite=check_finite)

    def close(self) -> None:
        self._handles.clear()

    def __enter__(self) -> "SafetensorsCheckpoint":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def has_weights(directory: str | Path) -> bool:
    d = Path(directory)
    return (d / INDEX_NAME).is_file() or any(d.glob("*.safetensors"))

