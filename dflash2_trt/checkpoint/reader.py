"""Lazy, strict reading of Hugging Face safetensors checkpoints (single file or sharded).

Headers are parsed and validated up front (cheap: no tensor data is touched), so that a truncated
file, a bad header or a shard missing from the index is reported with its file name before any
work starts. Tensor data is memory-mapped and materialised one tensor at a time by :meth:`get`.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch

from ..errors import CheckpointError

# safetensors dtype tag -> (torch dtype, bytes per element)
_DTYPES = {
    "BF16": (torch.bfloat16, 2),
    "F16": (torch.float16, 2),
    "F32": (torch.float32, 4),
    "F64": (torch.float64, 8),
    "I64": (torch.int64, 8),
    "I32": (torch.int32, 4),
    "I16": (torch.int16, 2),
    "I8": (torch.int8, 1),
    "U8": (torch.uint8, 1),
    "BOOL": (torch.bool, 1),
    "F8_E4M3": (torch.float8_e4m3fn, 1),
    "F8_E5M2": (torch.float8_e5m2, 1),
}
TORCH_TO_TAG = {v[0]: k for k, v in _DTYPES.items()}
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
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype][0]


def read_header(path: Path) -> tuple[dict[str, TensorInfo], dict[str, str], int]:
    """Parse and validate one safetensors file's header: (tensors, metadata, data offset)."""
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
    except OSError as exc:
        raise CheckpointError(f"cannot read: {exc.strerror or exc}", file=path) from None
    try:
        header = json.loads(header_bytes)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"corrupt safetensors header: {exc}", file=path) from None
    if not isinstance(header, dict):
        raise CheckpointError("corrupt safetensors header: not a JSON object", file=path)
    metadata = header.pop("__metadata__", None) or {}
    data_start = 8 + n
    data_len = size - data_start
    tensors: dict[str, TensorInfo] = {}
    end_max = 0
    for name, entry in header.items():
        try:
            dtype = entry["dtype"]
            shape = tuple(int(s) for s in entry["shape"])
            begin, end = (int(o) for o in entry["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"corrupt header entry {entry!r}", file=path, tensor=name) from None
        if dtype not in _DTYPES:
            raise CheckpointError(f"unsupported dtype {dtype!r}", file=path, tensor=name)
        expected = math.prod(shape) * _DTYPES[dtype][1]
        if end - begin != expected or begin < 0:
            raise CheckpointError(
                f"corrupt header: offsets [{begin}, {end}) hold {end - begin} bytes but shape {list(shape)} "
                f"{dtype} needs {expected}", file=path, tensor=name)
        if end > data_len:
            raise CheckpointError(
                f"file is truncated: tensor data ends at byte {data_start + end} but the file has {size} bytes",
                file=path, tensor=name)
        end_max = max(end_max, end)
        tensors[name] = TensorInfo(name, path, dtype, shape, (begin, end))
    if end_max != data_len and tensors:
        raise CheckpointError(
            f"file size {size} does not match its header (data should end at byte {data_start + end_max}); "
            "the file is corrupt or was not fully written", file=path)
    return tensors, metadata, data_start


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
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
                if not isinstance(weight_map, dict):
                    raise TypeError
            except (OSError, json.JSONDecodeError, KeyError, TypeError):
                raise CheckpointError("invalid index: expected a JSON object with a 'weight_map'", file=index) from None
            shards = sorted(set(weight_map.values()))
            for shard in shards:
                p = directory / shard
                if not p.is_file():
                    n = sum(1 for v in weight_map.values() if v == shard)
                    raise CheckpointError(f"shard {shard!r} named by the index ({n} tensors) is missing", file=p)
            per_file = {shard: read_header(directory / shard)[0] for shard in shards}
            for name, shard in weight_map.items():
                if name not in per_file[shard]:
                    raise CheckpointError(f"the index places this tensor in {shard} but that file lacks it",
                                          file=directory / shard, tensor=name)
                infos[name] = per_file[shard][name]
            for shard, tensors in per_file.items():
                extra = sorted(set(tensors) - set(weight_map))
                if extra:
                    raise CheckpointError(f"tensor not listed in {INDEX_NAME}", file=directory / shard, tensor=extra[0])
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
    def get(self, name: str, *, check_finite: bool = True) -> torch.Tensor:
        """One tensor, memory-mapped (no copy until used). Non-finite values are an error."""
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

    def items(self, *, check_finite: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
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

