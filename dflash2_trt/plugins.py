"""The DFlash2 TensorRT plugins from Python: their YAML specs, plugin fields, and the library.

The YAML spec next to each plugin (``plugins/<name>Plugin/<name>Plugin.yaml``) is the single
place where a plugin's name, version, namespace and attributes (names, types, ranges, enums)
live; the TRT-LLM layer wrappers, ONNX nodes and the C++ glue all use the same names
(tests/plugins checks the glue against the YAML).

Nothing here loads ``libdflash2_plugins.so`` or imports TensorRT at import time: call
:func:`load_library` explicitly (it self-registers the plugin creators with TensorRT's registry
through static registration), and :func:`trt_field_collection` / :func:`create_trt_plugin` import
``tensorrt`` lazily and raise :class:`MissingDependencyError` when it is absent.

Environment:
    DFLASH2_PLUGIN_DIR  directory holding the plugin folders (default: ``<repo>/plugins``)
    DFLASH2_PLUGIN_LIB  path of ``libdflash2_plugins.so`` (default: searched in build dirs)
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from dflash2_trt.errors import ConfigError, MissingDependencyError
from dflash2_trt.yaml_files import load_yaml_file

__all__ = [
    "LIBRARY_NAME",
    "PLUGIN_NAMES",
    "AttributeSpec",
    "TensorSpec",
    "PluginSpec",
    "PluginFieldValue",
    "plugin_dir",
    "load_spec",
    "load_specs",
    "plugin_fields",
    "attribute_values",
    "find_library",
    "load_library",
    "trt_field_collection",
    "create_trt_plugin",
]

LIBRARY_NAME = "libdflash2_plugins.so"

# plugin name -> spec path relative to the plugin dir
_SPEC_FILES = {
    "DFlash2DynamicConv": "dynamicConvPlugin/dynamicConvPlugin.yaml",
    "DFlash2PairwiseScan": "pairwiseScanPlugin/pairwiseScanPlugin.yaml",
    "DFlash2GatedDeltaNet": "gatedDeltaNetPlugin/gatedDeltaNetPlugin.yaml",
}
PLUGIN_NAMES = tuple(_SPEC_FILES)

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_TOP_KEYS = {"name", "version", "namespace", "description", "attributes", "inputs", "outputs",
             "constraints", "workspace"}
_ATTR_KEYS = {"name", "type", "required", "default", "min", "max", "enum", "description"}
_TENSOR_KEYS = {"name", "dtypes", "shape", "when"}
_ATTR_TYPES = {"int32"}  # what the C++ glue parses (PluginFieldType::kINT32, length 1)


@dataclass(frozen=True)
class AttributeSpec:
    name: str
    type: str
    required: bool
    default: int | None
    min: int | None
    max: int | None
    enum: Mapping[str, int] | None
    description: str = ""

    def coerce(self, value: Any, *, source: str | Path | None = None) -> int:
        """The int32 value for ``value`` (an int, or an enum name), range-checked."""
        where = f"attribute '{self.name}'"
        if self.enum is not None and isinstance(value, str):
            if value not in self.enum:
                raise ConfigError(f"{value!r} is not one of {sorted(self.enum)}", source=source, field=where)
            return self.enum[value]
        if isinstance(value, (bool, np.bool_)):
            value = int(value)
        if not isinstance(value, (int, np.integer)):
            raise ConfigError(f"expected an integer{' or one of ' + str(sorted(self.enum)) if self.enum else ''}, "
                              f"got {type(value).__name__} {value!r}", source=source, field=where)
        v = int(value)
        if self.enum is not None and v not in self.enum.values():
            raise ConfigError(f"{v} is not one of {dict(self.enum)}", source=source, field=where)
        lo = _INT32_MIN if self.min is None else self.min
        hi = _INT32_MAX if self.max is None else self.max
        if not lo <= v <= hi:
            raise ConfigError(f"{v} outside [{lo}, {hi}]", source=source, field=where)
        return v


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtypes: str | tuple[str, ...]
    shape: tuple[str, ...]
    when: str | None = None


@dataclass(frozen=True)
class PluginFieldValue:
    """One plugin field: what ``trt.PluginField(name, data, type)`` is built from."""

    name: str
    type: str  # "int32"
    data: np.ndarray


@dataclass(frozen=True)
class PluginSpec:
    name: str
    version: str
    namespace: str
    attributes: tuple[AttributeSpec, ...]
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    source: Path
    description: str = ""
    constraints: tuple[str, ...] = field(default_factory=tuple)

    def attribute(self, name: str) -> AttributeSpec:
        for a in self.attributes:
            if a.name == name:
                return a
        raise ConfigError(f"unknown attribute; {self.name} has {[a.name for a in self.attributes]}",
                          source=self.source, field=name)

    def fields(self, **values: Any) -> list[PluginFieldValue]:
        """Plugin fields in spec order. Unknown names and missing required attributes are errors
        (a misspelt attribute silently taking its default would build a wrong engine)."""
        known = {a.name for a in self.attributes}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown attribute(s) {unknown}; {self.name} has {sorted(known)}",
                              source=self.source, field=unknown[0])
        out = []
        for a in self.attributes:
            if a.name in values:
                v = a.coerce(values[a.name], source=self.source)
            elif a.required:
                raise ConfigError(f"required by {self.name} but not given", source=self.source,
                                  field=f"attribute '{a.name}'")
            else:
                v = a.coerce(a.default, source=self.source)
            out.append(PluginFieldValue(a.name, a.type, np.array([v], dtype=np.int32)))
        return out


def plugin_dir() -> Path:
    """Directory holding the plugin folders (DFLASH2_PLUGIN_DIR, else ``<repo>/plugins``)."""
    env = os.environ.get("DFLASH2_PLUGIN_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[1] / "plugins"


def _strict_keys(d: Mapping, allowed: set[str], source: Path, where: str) -> None:
    extra = sorted(set(d) - allowed)
    if extra:
        raise ConfigError(f"unknown key(s) {extra}", source=source, field=where)


def _parse_attr(d: Any, source: Path) -> AttributeSpec:
    if not isinstance(d, Mapping) or "name" not in d:
        raise ConfigError("each attribute must be a mapping with a 'name'", source=source, field="attributes")
    where = f"attributes.{d['name']}"
    _strict_keys(d, _ATTR_KEYS, source, where)
    if d.get("type") not in _ATTR_TYPES:
        raise ConfigError(f"type {d.get('type')!r} not supported; expected one of {sorted(_ATTR_TYPES)}",
                          source=source, field=where)
    enum = d.get("enum")
    if enum is not None and not (isinstance(enum, Mapping) and all(isinstance(v, int) for v in enum.values())):
        raise ConfigError("enum must map names to integers", source=source, field=where)
    required = bool(d.get("required", False))
    if not required and "default" not in d:
        raise ConfigError("an optional attribute needs a default", source=source, field=where)
    spec = AttributeSpec(name=str(d["name"]), type=d["type"], required=required, default=None,
                         min=d.get("min"), max=d.get("max"), enum=dict(enum) if enum else None,
                         description=str(d.get("description", "")).strip())
    if not required:
        default = spec.coerce(d["default"], source=source)  # the default itself must be valid
        spec = AttributeSpec(**{**spec.__dict__, "default": default})
    return spec


def _parse_tensor(d: Any, source: Path, section: str) -> TensorSpec:
    if not isinstance(d, Mapping) or "name" not in d:
        raise ConfigError(f"each entry of {section} must be a mapping with a 'name'", source=source, field=section)
    _strict_keys(d, _TENSOR_KEYS, source, f"{section}.{d['name']}")
    dtypes = d.get("dtypes")
    return TensorSpec(name=str(d["name"]), dtypes=tuple(dtypes) if isinstance(dtypes, list) else str(dtypes),
                      shape=tuple(str(s) for s in d.get("shape", ())), when=d.get("when"))


def _parse_spec(path: Path) -> PluginSpec:
    try:
        raw = load_yaml_file(path)
    except FileNotFoundError:
        raise ConfigError("plugin spec not found (set DFLASH2_PLUGIN_DIR to the repo's plugins/ dir)",
                          source=path) from None
    except yaml.YAMLError as e:
        raise ConfigError(f"invalid YAML: {e}", source=path) from None
    if not isinstance(raw, Mapping):
        raise ConfigError("top level must be a mapping", source=path)
    _strict_keys(raw, _TOP_KEYS, path, "<top level>")
    for key in ("name", "version", "namespace", "attributes", "inputs", "outputs"):
        if key not in raw:
            raise ConfigError("missing", source=path, field=key)
    attrs = tuple(_parse_attr(a, path) for a in raw["attributes"])
    names = [a.name for a in attrs]
    if len(set(names)) != len(names):
        raise ConfigError(f"duplicate attribute names {names}", source=path, field="attributes")
    return PluginSpec(
        name=str(raw["name"]), version=str(raw["version"]), namespace=str(raw["namespace"]), attributes=attrs,
        inputs=tuple(_parse_tensor(t, path, "inputs") for t in raw["inputs"]),
        outputs=tuple(_parse_tensor(t, path, "outputs") for t in raw["outputs"]), source=path,
        description=str(raw.get("description", "")).strip(), constraints=tuple(raw.get("constraints", ())))


@lru_cache(maxsize=None)
def _load_spec_cached(path: Path) -> PluginSpec:
    return _parse_spec(path)


def load_spec(name: str) -> PluginSpec:
    """The parsed spec of plugin ``name`` (e.g. ``"DFlash2DynamicConv"``)."""
    if name not in _SPEC_FILES:
        raise ConfigError(f"unknown plugin {name!r}; known: {list(PLUGIN_NAMES)}", field="plugin")
    path = plugin_dir() / _SPEC_FILES[name]
    spec = _load_spec_cached(path)
    if spec.name != name:
        raise ConfigError(f"spec names plugin {spec.name!r}, expected {name!r}", source=path, field="name")
    return spec


def load_specs() -> dict[str, PluginSpec]:
    return {n: load_spec(n) for n in PLUGIN_NAMES}


def plugin_fields(name: str, **attrs: Any) -> list[PluginFieldValue]:
    """Plugin fields for plugin ``name`` with the given attribute values (see PluginSpec.fields)."""
    return load_spec(name).fields(**attrs)


def attribute_values(name: str, **attrs: Any) -> dict[str, int]:
    """``{attribute: int}`` with defaults filled in and everything checked, in spec order — e.g.
    the attributes of an ONNX custom node standing for the plugin."""
    return {f.name: int(f.data[0]) for f in plugin_fields(name, **attrs)}


# --------------------------------------------------------------------------------- the library
def _default_library_candidates() -> list[Path]:
    root = plugin_dir()
    return [root / "build" / LIBRARY_NAME, root.parent / "build" / "plugins" / LIBRARY_NAME]


def find_library(path: str | os.PathLike | None = None) -> Path:
    """Path of libdflash2_plugins.so: ``path`` if given, else DFLASH2_PLUGIN_LIB, else the
    default build dirs. Raises MissingDependencyError naming every place it looked."""
    if path is not None:
        candidates = [Path(path)]
    elif os.environ.get("DFLASH2_PLUGIN_LIB"):
        candidates = [Path(os.environ["DFLASH2_PLUGIN_LIB"])]
    else:
        candidates = _default_library_candidates()
    for c in candidates:
        if c.is_file():
            return c.resolve()
    looked = ", ".join(str(c) for c in candidates)
    raise MissingDependencyError(
        f"{LIBRARY_NAME} not found (looked in: {looked}). Build it on a machine with CUDA and TensorRT: "
        f"cmake -S plugins -B plugins/build -DTensorRT_ROOT=<tensorrt dir> && cmake --build plugins/build -j, "
        f"or point DFLASH2_PLUGIN_LIB at an existing build.")


_LOADED: dict[Path, ctypes.CDLL] = {}


def load_library(path: str | os.PathLike | None = None) -> ctypes.CDLL:
    """Load the plugin library (RTLD_GLOBAL) once; its static initialisers register the plugin
    creators with TensorRT's plugin registry. Needs libnvinfer to be loadable."""
    lib_path = find_library(path)
    if lib_path not in _LOADED:
        try:
            _LOADED[lib_path] = ctypes.CDLL(str(lib_path), mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            raise MissingDependencyError(
                f"{lib_path} could not be loaded ({e}); it needs the CUDA runtime and TensorRT's "
                f"libnvinfer on the loader path") from None
    return _LOADED[lib_path]


def _import_tensorrt():
    try:
        import tensorrt as trt  # noqa: PLC0415 - optional, GPU machines only
    except ImportError as e:
        raise MissingDependencyError(
            f"TensorRT's Python package is not installed ({e}); install tensorrt>=10.13,<11 "
            f"(NVIDIA's index) to build engines with the DFlash2 plugins") from None
    return trt


def trt_field_collection(name: str, **attrs: Any):
    """``trt.PluginFieldCollection`` for plugin ``name`` (imports tensorrt lazily)."""
    trt = _import_tensorrt()
    types = {"int32": trt.PluginFieldType.INT32}
    return trt.PluginFieldCollection(
        [trt.PluginField(f.name, f.data, types[f.type]) for f in plugin_fields(name, **attrs)])


def create_trt_plugin(name: str, layer_name: str, **attrs: Any):
    """An IPluginV3 instance from the registered creator (call :func:`load_library` first)."""
    trt = _import_tensorrt()
    spec = load_spec(name)
    creator = trt.get_plugin_registry().get_creator(spec.name, spec.version, spec.namespace)
    if creator is None:
        raise MissingDependencyError(
            f"TensorRT has no creator for {spec.namespace}::{spec.name} v{spec.version}; "
            f"call dflash2_trt.plugins.load_library() before building the network")
    plugin = creator.create_plugin(layer_name, trt_field_collection(name, **attrs), trt.TensorRTPhase.BUILD)
    if plugin is None:
        raise ConfigError(f"{spec.name} rejected attributes {attrs} (see stderr)", source=spec.source)
    return plugin
