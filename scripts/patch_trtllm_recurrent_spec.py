#!/usr/bin/env python3
"""Let a TensorRT-LLM 1.2.x C++ runtime run the DFlash2 hybrid engine (Qwen3.5 target, EAGLE one-engine mode).

    python scripts/patch_trtllm_recurrent_spec.py SRC [--dry-run] [--chunked-context] [--architecture NAME ...]
                                                      [--build [--cuda-architectures "90-real;100-real"]
                                                               [--trt-root DIR] [--build-arg ARG ...]]

SRC is a TensorRT-LLM 1.2.x source checkout (the one ``scripts/build_wheel.py`` builds). The stock runtime refuses
an engine that has recurrent layers AND a speculative-decoding mode; the combined engine commits its Gated DeltaNet
state inside the engine over the accepted tokens only, so the refusals protect nothing for it. Every change below
is gated on the engine's ``pretrained_config.architecture`` (``ModelConfig::getModelName()``; default
``DFlash2Qwen3_5ForCausalLM``), so stock Mamba / RecurrentGemma engines keep the stock behaviour. Why each change is
safe, and what the engine itself must do besides: ``docs/hybrid-runtime.md``.

=====  ==========================================================  ====================================================
id     file (function)                                             change
=====  ==========================================================  ====================================================
R1     cpp/tensorrt_llm/runtime/gptJsonConfig.cpp (parseJson)       the architecture also maps to the hybrid variant
                                                                   (kRecurrentGemma: transformer AND recurrent), so the
                                                                   runtime owns the state slots
R2     cpp/tensorrt_llm/executor/executorImpl.cpp (createModel)    such an engine gets context/generation fusion (the
                                                                   stock rule gives every recurrent model non-fused
                                                                   in-flight batching, which EAGLE refuses)
R3     cpp/tensorrt_llm/batch_manager/trtGptModelInflightBatching  its fused batching is no longer refused
       .cpp (constructor)
R4     same (constructor)                                          its EAGLE mode is no longer refused
G1a/b  same (executorConfigIsValid / fixExecutorConfig)            KV-cache block reuse is switched off for it (a
                                                                   reused prefix has K/V but no recurrent state)
O1     same (constructor), only with --chunked-context             chunked context is no longer refused for it
O1b/c  cpp/tensorrt_llm/executor/executorImpl.cpp                  with --chunked-context: the executor no longer
       (executorConfigIsValid / fixExecutorConfig)                 switches chunked context off for it (it does so for
                                                                   every RNN-based model before the model is made, so
                                                                   O1 alone would change nothing)
=====  ==========================================================  ====================================================

Each change is found by a pattern over the code's structure (not line numbers), so other 1.2.x patch levels work
when the code reads the same way; a pattern that matches nowhere or more than once stops the script before any
file is written. Applied changes carry a ``dflash2-trt:<id>`` marker, so a second run changes nothing. ``--dry-run``
prints the unified diff and writes nothing. ``--build`` then runs TensorRT-LLM's own ``scripts/build_wheel.py`` in
SRC (the command is printed either way). Exit status: 0 done, 2 refused, else the build's status.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

DEFAULT_ARCHITECTURES = ("DFlash2Qwen3_5ForCausalLM",)
DEFAULT_CUDA_ARCHITECTURES = "90-real;100-real"
SUPPORTED_VERSION_PREFIX = "1.2."
VERSION_FILE = "tensorrt_llm/version.py"
MARK = "dflash2-trt:"

GPT_JSON_CONFIG = "cpp/tensorrt_llm/runtime/gptJsonConfig.cpp"
EXECUTOR_IMPL = "cpp/tensorrt_llm/executor/executorImpl.cpp"
INFLIGHT_BATCHING = "cpp/tensorrt_llm/batch_manager/trtGptModelInflightBatching.cpp"


class PatchError(Exception):
    """A change that cannot be applied safely (pattern missing or ambiguous, wrong version, bad arguments)."""


@dataclass
class Context:
    architectures: tuple[str, ...]

    def predicate(self, var: str) -> str:
        """C++: true for an engine of the project's hybrid architectures (``ModelConfig::getModelName()`` is the
        engine config's ``pretrained_config.architecture``)."""
        return "(" + " || ".join(f'{var}.getModelName() == "{a}"' for a in self.architectures) + ")"

    def arch_list(self) -> str:
        return ", ".join(self.architectures)


@dataclass
class Patch:
    pid: str
    path: str
    where: str                     # function, for messages
    looks_for: str                 # the code shape, for messages
    pattern: re.Pattern
    render: Callable[[re.Match, Context], str]
    optional: bool = False

    @property
    def marker(self) -> str:
        return MARK + self.pid


def _indent_at(text: str, pos: int) -> str:
    start = text.rfind("\n", 0, pos) + 1
    line = text[start:pos]
    return line[: len(line) - len(line.lstrip())]


# ---------------------------------------------------------------------------------------------- the changes
def _r1(m: re.Match, c: Context) -> str:
    v = m["var"]
    extra = " || ".join(f'{v} == std::string("{a}")' for a in c.architectures)
    return (f'({v} == std::string("RecurrentGemmaForCausalLM") || {extra} /* {MARK}R1 hybrid engine: attention + '
            f'recurrent layers, state committed in-engine */)')


def _r2(m: re.Match, c: Context) -> str:
    v, ind = m["var"], _indent_at(m.string, m.start())
    return (f"return ({v}.isRnnBased() && !{c.predicate(v)}) // {MARK}R2 fused IFB for the in-engine-commit "
            f"hybrid\n{ind}    ? {m['nonfused']}\n{ind}    : {m['fused']};")


def _r3(m: re.Match, c: Context) -> str:
    v = m["var"]
    return f"{m['head']}(!{v}.isRnnBased() || {c.predicate(v)}) /* {MARK}R3 */,"


def _r4(m: re.Match, c: Context) -> str:
    v = m["var"]
    return (f"{m['head']}({v}.getSpeculativeDecodingMode().isNone() || ({v}.getSpeculativeDecodingMode().isEagle() "
            f"&& {c.predicate(v)})) /* {MARK}R4 the engine commits recurrent state over accepted tokens */,"
            f"{m['msg']}")


def _o1(m: re.Match, c: Context) -> str:
    return (f"{m['head']}(!executorConfig.getEnableChunkedContext() || {c.predicate('mModelConfig')}) "
            f"/* {MARK}O1 the engine continues a chunk from the committed state */,{m['msg']}")


def _o1x(pid: str) -> Callable[[re.Match, Context], str]:
    """O1b/O1c: executorImpl.cpp's chunked-context switch-off skips the hybrid (the stock rule stays for others)."""
    def render(m: re.Match, c: Context) -> str:
        v = m["var"]
        return f"{m['head']}({v}.isRnnBased() && !{c.predicate(v)}) /* {MARK}{pid} */"
    return render


def _g1a(m: re.Match, c: Context) -> str:
    ind = _indent_at(m.string, m.end() - 1) + "    "
    return (f"{m['head']}\n{ind}if ({c.predicate(m['var'])}) // {MARK}G1a no block reuse for the hybrid\n"
            f"{ind}{{\n{ind}    return false;\n{ind}}}")


def _g1b(m: re.Match, c: Context) -> str:
    ind = _indent_at(m.string, m.end() - 1)
    msg = "Fixing executorConfig: KV cache reuse disabled: a reused prefix has K/V but no recurrent state"
    return (f"{m['head']}\n{ind}if ({c.predicate(m['var'])}) // {MARK}G1b no block reuse for the hybrid\n"
            f"{ind}{{\n{ind}    TLLM_LOG_WARNING(\n{ind}        \"{msg}\");\n"
            f"{ind}    {m['kv']}.setEnableBlockReuse(false);\n{ind}}}")


_MODEL_PARAM = r"(?:runtime::)?ModelConfig\s+const\s*&\s*(?P<var>\w+)"
# executorImpl.cpp's own executorConfigIsValid / fixExecutorConfig: (ExecutorConfig const&, ModelConfig const& m),
# "if (executorConfig.getEnableChunkedContext()) { if (m.isRnnBased() || ..." -> chunked context off for recurrent
_EXEC_CHUNKED = (r"\(\s*ExecutorConfig\s+const\s*&\s*\w+\s*,\s*" + _MODEL_PARAM + r"\s*\)\s*\{[^{}]*?"
                 r"getEnableChunkedContext\(\)\s*\)\s*\{\s*if\s*\(\s*)(?P=var)\.isRnnBased\(\)")

PATCHES: tuple[Patch, ...] = (
    Patch("R1", GPT_JSON_CONFIG, "parseJson (RNN config block)",
          'an `<arch> == std::string("RecurrentGemmaForCausalLM")` comparison',
          re.compile(r'(?P<var>\b\w+)\s*==\s*std::string\(\s*"RecurrentGemmaForCausalLM"\s*\)'), _r1),
    Patch("R2", EXECUTOR_IMPL, "Executor::Impl::createModel",
          "`return <cfg>.isRnnBased() ? TrtGptModelType::InflightBatching : TrtGptModelType::InflightFusedBatching;`",
          re.compile(r"return\s+(?P<var>\w+)\.isRnnBased\(\)\s*\?\s*"
                     r"(?P<nonfused>(?:batch_manager::)?TrtGptModelType::InflightBatching)\s*:\s*"
                     r"(?P<fused>(?:batch_manager::)?TrtGptModelType::InflightFusedBatching)\s*;"), _r2),
    Patch("R3", INFLIGHT_BATCHING, "TrtGptModelInflightBatching constructor",
          "`if (mCtxGenFusion) { TLLM_CHECK_WITH_INFO(!<cfg>.isRnnBased(), ...`",
          re.compile(r"(?P<head>if\s*\(\s*mCtxGenFusion\s*\)\s*\{\s*TLLM_CHECK_WITH_INFO\(\s*)"
                     r"!\s*(?P<var>\w+)\.isRnnBased\(\)\s*,"), _r3),
    Patch("R4", INFLIGHT_BATCHING, "TrtGptModelInflightBatching constructor (RNN block)",
          '`TLLM_CHECK_WITH_INFO(<cfg>.getSpeculativeDecodingMode().isNone(), "...speculative decoding...")`',
          re.compile(r"(?P<head>TLLM_CHECK_WITH_INFO\(\s*)(?P<var>\w+)\.getSpeculativeDecodingMode\(\)\.isNone\(\)"
                     r"\s*,(?P<msg>\s*\"[^\"]*[Ss]peculative [Dd]ecoding[^\"]*\")"), _r4),
    Patch("G1a", INFLIGHT_BATCHING, "TrtGptModelInflightBatching::executorConfigIsValid",
          "`executorConfigIsValid(ModelConfig const& <cfg>, ...) { ... if (...getEnableBlockReuse()) {`",
          re.compile(r"(?P<head>executorConfigIsValid\(\s*" + _MODEL_PARAM + r"[^()]*\)\s*\{[^{}]*?"
                     r"getEnableBlockReuse\(\)\s*\)\s*\{)"), _g1a),
    Patch("G1b", INFLIGHT_BATCHING, "TrtGptModelInflightBatching::fixExecutorConfig",
          "`fixExecutorConfig(ModelConfig const& <cfg>, ...) { ... if (...getEnableBlockReuse()) { auto <kv> = "
          "executorConfig.getKvCacheConfig();`",
          re.compile(r"(?P<head>fixExecutorConfig\(\s*" + _MODEL_PARAM + r"[^()]*\)\s*\{[^{}]*?"
                     r"getEnableBlockReuse\(\)\s*\)\s*\{\s*auto\s+(?P<kv>\w+)\s*=\s*executorConfig\.getKvCacheConfig"
                     r"\(\)\s*;)"), _g1b),
    Patch("O1", INFLIGHT_BATCHING, "TrtGptModelInflightBatching constructor (RNN block)",
          '`TLLM_CHECK_WITH_INFO(!executorConfig.getEnableChunkedContext(), "...Chunked Context...")`',
          re.compile(r"(?P<head>TLLM_CHECK_WITH_INFO\(\s*)!\s*executorConfig\.getEnableChunkedContext\(\)\s*,"
                     r"(?P<msg>\s*\"[^\"]*[Cc]hunked [Cc]ontext[^\"]*\")"), _o1, optional=True),
    Patch("O1b", EXECUTOR_IMPL, "executorConfigIsValid (anonymous namespace)",
          "`executorConfigIsValid(ExecutorConfig const&, ModelConfig const& <cfg>) { if (...getEnableChunkedContext()) "
          "{ if (<cfg>.isRnnBased() || ...`",
          re.compile(r"(?P<head>\bbool\s+executorConfigIsValid" + _EXEC_CHUNKED), _o1x("O1b"), optional=True),
    Patch("O1c", EXECUTOR_IMPL, "fixExecutorConfig (anonymous namespace)",
          "`ExecutorConfig fixExecutorConfig(ExecutorConfig const&, ModelConfig const& <cfg>) { ... if "
          "(...getEnableChunkedContext()) { if (<cfg>.isRnnBased() || ...`",
          re.compile(r"(?P<head>\bExecutorConfig\s+fixExecutorConfig" + _EXEC_CHUNKED), _o1x("O1c"), optional=True),
)


# ---------------------------------------------------------------------------------------------- engine
@dataclass
class Result:
    texts: dict[str, tuple[str, str]] = field(default_factory=dict)      # path -> (old, new)
    status: list[tuple[str, str, str]] = field(default_factory=list)     # (pid, path, status)

    @property
    def changed(self) -> list[str]:
        return [p for p, (old, new) in self.texts.items() if old != new]


def _line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def check_version(src: Path) -> str:
    vf = src / VERSION_FILE
    if not vf.is_file():
        raise PatchError(f"{src}: no {VERSION_FILE}; not a TensorRT-LLM source checkout (or pass --any-version)")
    m = re.search(r"""__version__\s*=\s*["']([^"']+)["']""", vf.read_text(encoding="utf-8"))
    if not m:
        raise PatchError(f"{vf}: no __version__ found (pass --any-version to skip this check)")
    if not m.group(1).startswith(SUPPORTED_VERSION_PREFIX):
        raise PatchError(f"TensorRT-LLM {m.group(1)} at {src}: this script is written for {SUPPORTED_VERSION_PREFIX}x "
                         f"(the TensorRT engine backend's last release line); pass --any-version to try anyway")
    return m.group(1)


def _read(path: Path) -> str:
    with open(path, encoding="utf-8", newline="") as f:   # keep the file's own line endings
        return f.read()


def plan(src: Path, architectures=DEFAULT_ARCHITECTURES, chunked_context: bool = False) -> Result:
    """Every selected change, computed in memory; raises PatchError (writing nothing) on any refusal."""
    archs = tuple(architectures)
    if not archs or any(not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", a) for a in archs):
        raise PatchError(f"--architecture must be C++-safe identifiers, got {list(archs)}")
    ctx, res, errors = Context(archs), Result(), []
    for p in PATCHES:
        if p.optional and not chunked_context:
            continue
        path = src / p.path
        if p.path not in res.texts:
            if not path.is_file():
                errors.append(f"{p.pid}: {p.path} not found under {src}")
                res.texts[p.path] = ("", "")
                continue
            text = _read(path)
            res.texts[p.path] = (text, text)
        old, text = res.texts[p.path]
        if not old:
            continue
        n_mark = len(re.findall(re.escape(p.marker) + r"(?![A-Za-z0-9_])", text))
        if n_mark:
            if n_mark > 1:
                errors.append(f"{p.pid}: {p.path} carries the marker {p.marker!r} {n_mark} times; restore the file")
            missing = [a for a in archs if f'"{a}"' not in text]
            if missing:
                errors.append(f"{p.pid}: {p.path} was patched for other architectures (missing {missing}); restore "
                              f"the file (git checkout -- {p.path}) and run again with the full --architecture list")
            res.status.append((p.pid, p.path, "already applied"))
            continue
        matches = list(p.pattern.finditer(text))
        if not matches:
            errors.append(f"{p.pid}: not found in {p.path} ({p.where}): looked for {p.looks_for}; this patch level "
                          f"reads differently, so the change must be made by hand (docs/hybrid-runtime.md)")
            continue
        if len(matches) > 1:
            lines = ", ".join(str(_line_of(text, m.start())) for m in matches)
            errors.append(f"{p.pid}: ambiguous in {p.path} ({p.where}): {len(matches)} matches (lines {lines}) for "
                          f"{p.looks_for}; refusing to guess")
            continue
        m = matches[0]
        new = p.render(m, ctx)
        res.texts[p.path] = (old, text[: m.start()] + new + text[m.end():])
        res.status.append((p.pid, p.path, f"apply at line {_line_of(text, m.start())}"))
    if errors:
        raise PatchError("refused, nothing written:\n  " + "\n  ".join(errors))
    return res


def diff(res: Result) -> str:
    out = []
    for path in res.changed:
        old, new = res.texts[path]
        out.extend(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                        fromfile=f"a/{path}", tofile=f"b/{path}"))
    return "".join(out)


def write(src: Path, res: Result) -> None:
    for path in res.changed:
        with open(src / path, "w", encoding="utf-8", newline="") as f:
            f.write(res.texts[path][1])


def build_command(python: str = "python3", cuda_architectures: str = DEFAULT_CUDA_ARCHITECTURES,
                  trt_root: str | None = None, extra: list[str] | None = None) -> list[str]:
    """TensorRT-LLM's own wheel build (run in the checkout's root)."""
    cmd = [python, "scripts/build_wheel.py", "--cuda_architectures", cuda_architectures]
    if trt_root:
        cmd += ["--trt_root", trt_root]
    return cmd + list(extra or [])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", type=Path, help="TensorRT-LLM 1.2.x source checkout")
    ap.add_argument("--dry-run", action="store_true", help="print the unified diff, write nothing")
    ap.add_argument("--architecture", action="append", dest="architectures", metavar="NAME",
                    help=f"engine architecture the changes apply to (repeatable; default {DEFAULT_ARCHITECTURES[0]})")
    ap.add_argument("--chunked-context", action="store_true",
                    help="also allow chunked context (O1, O1b, O1c; needs the engine's first-chunk rule, "
                         "docs/hybrid-runtime.md)")
    ap.add_argument("--any-version", action="store_true", help=f"skip the {SUPPORTED_VERSION_PREFIX}x version check")
    ap.add_argument("--build", action="store_true", help="run TensorRT-LLM's scripts/build_wheel.py after patching")
    ap.add_argument("--python", default="python3", help="interpreter for the build (default python3)")
    ap.add_argument("--cuda-architectures", default=DEFAULT_CUDA_ARCHITECTURES,
                    help=f"passed as --cuda_architectures (default {DEFAULT_CUDA_ARCHITECTURES!r}: H100/H200, B200)")
    ap.add_argument("--trt-root", default=os.environ.get("TRT_ROOT") or os.environ.get("TensorRT_ROOT"),
                    help="passed as --trt_root (default $TRT_ROOT or $TensorRT_ROOT)")
    ap.add_argument("--build-arg", action="append", default=[], metavar="ARG",
                    help="extra argument for build_wheel.py (repeatable), e.g. --build-arg=--clean")
    a = ap.parse_args(argv)
    src = a.src.resolve()
    try:
        if not src.is_dir():
            raise PatchError(f"{src} is not a directory")
        version = "unchecked" if a.any_version else check_version(src)
        res = plan(src, a.architectures or DEFAULT_ARCHITECTURES, a.chunked_context)
    except PatchError as exc:
        print(f"patch_trtllm_recurrent_spec: {exc}", file=sys.stderr)
        return 2
    print(f"TensorRT-LLM {version} at {src}")
    for pid, path, status in res.status:
        print(f"  {pid:4s} {path}: {status}")
    if a.dry_run:
        sys.stdout.write(diff(res) or "(no change: every selected change is already applied)\n")
    else:
        write(src, res)
        print(f"{len(res.changed)} file(s) written" if res.changed else "nothing to do: already applied")
    cmd = build_command(a.python, a.cuda_architectures, a.trt_root, a.build_arg)
    print("build: cd " + shlex.quote(str(src)) + " && " + shlex.join(cmd))
    print("       (first: git submodule update --init --recursive && git lfs pull, as TensorRT-LLM's build docs say)")
    if a.build and not a.dry_run:
        return subprocess.run(cmd, cwd=src).returncode
    if a.build:
        print("--dry-run: not building")
    return 0


if __name__ == "__main__":
    sys.exit(main())
