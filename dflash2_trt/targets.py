"""Registry of named targets: exact keys, no fuzzy matching.

Each entry names the HF repositories of the target and its DFlash2 drafter, the build config it
uses under ``build_configs/`` (see :func:`build_config_dir`), and what the project supports for it
today. Directories resolve from (in order) explicit ``--target-dir``/``--drafter`` paths, ``$DFLASH2_TRT_MODELS/<org>__<name>``,
the local Hugging Face cache (offline), and, for ``tiny*``, a seeded local build. Nothing is
downloaded unless the caller asks for it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .errors import DFlash2Error


def build_config_dir() -> Path:
    """Where the per-target build configs are read from.

    In a checkout (editable install) this is the repository's top-level ``build_configs/``, the
    one source. An installed wheel has no checkout beside it; setup.py's ``build_py`` copies the
    same files into it as package data ``dflash2_trt/build_configs/`` (checked byte for byte by
    tests/test_build_configs_packaging.py).
    """
    pkg = Path(__file__).resolve().parent
    checkout = pkg.parent / "build_configs"
    if checkout.is_dir() and (pkg.parent / "pyproject.toml").is_file():
        return checkout
    return pkg / "build_configs"


BUILD_CONFIG_DIR = build_config_dir()
PUBLISHED_DIR = Path(__file__).resolve().parent / "assets" / "published"
"""The published configs of the registered targets' pairs (configs and tensor inventories of the real
checkpoints, never weights), shipped with the package: ``assets/published/<org>__<name>/``."""


def fixtures_dir() -> Path:
    """Where the published configs live (:data:`PUBLISHED_DIR`, inside the package: an installed package has them
    too, and nothing outside it is read)."""
    return PUBLISHED_DIR


@dataclass(frozen=True)
class TargetEntry:
    key: str
    family: str
    target_id: str | None  # HF repo id, None for the locally built tiny targets
    drafter_id: str | None
    block_size: int
    build_config: str  # file name under build_configs/
    supported: tuple[str, ...]  # stages that work today
    notes: str = ""
    tiny_family: str | None = None
    # where each backend has been verified for this target: README's status table, cell for cell (STATUS_COLUMNS;
    # tests/test_readme.py holds the two equal)
    status: tuple[str, str, str, str] = ("", "", "", "")

    @property
    def build_config_path(self) -> Path:
        return BUILD_CONFIG_DIR / self.build_config


TARGETS: dict[str, TargetEntry] = {
    e.key: e
    for e in (
        TargetEntry(
            key="qwen3.8-27b", family="qwen3_5", target_id="Qwen/Qwen3.8-27B",
            drafter_id="z-lab/Qwen3.8-27B-DFlash2", block_size=8, build_config="qwen3.8-27b.yaml",
            supported=("inspect", "generate", "analyze", "convert", "build", "run"),
            notes="Qwen3.5 hybrid (48 Gated DeltaNet + 16 full-attention layers), multimodal wrapper; text only; "
                  "the engine network covers it (CPU backend); the stock TensorRT-LLM 1.2 executor refuses "
                  "speculative decoding for recurrent models, so a TensorRT engine runs on the project runtime "
                  "(docs/trt-session.md)",
            status=(  # README status: cpu, cuda, TRT-LLM project runtime, TRT-LLM C++ executor
                    'network defines, every rank',
                    'step timed, random weights (H200)',
                    'binding, real widths (stand-in, CI)',
                    'refused; patch script'),
        ),
        TargetEntry(
            key="muse-glimmer-30b", family="muse_glimmer", target_id="meta-models/Muse-Glimmer-30B",
            drafter_id="z-lab/Muse-Glimmer-30B-DFlash2", block_size=16, build_config="muse-glimmer-30b.yaml",
            supported=("inspect", "generate", "analyze", "convert", "build", "run"),
            notes="reference decoding, conversion and the engine network (CPU backend); the published drafter's "
                  "8x128 KV heads spread over 4 pool layers each next to the target's 2x128 (drafter_kv_split); on "
                  "TensorRT-LLM its sliding layers take each step's new tokens as a context chunk where the 2048-token "
                  "window can bind (the project runtime; docs/gpu.md: Sliding windows on TensorRT-LLM)",
            status=(  # README status: cpu, cuda, TRT-LLM project runtime, TRT-LLM C++ executor
                    'network defines, every rank',
                    'not run yet',
                    'context route (windows); binding (stand-in, CI)',
                    '<= 2018 tokens, not run'),
        ),
        TargetEntry(
            key="qwen3-8b", family="qwen3", target_id="Qwen/Qwen3-8B", drafter_id=None, block_size=8,
            build_config="qwen3-8b.yaml", supported=("inspect", "generate", "analyze", "convert", "build", "run"),
            notes="dense Qwen3; no published DFlash2 drafter: pass --drafter DIR",
            status=(  # README status: cpu, cuda, TRT-LLM project runtime, TRT-LLM C++ executor
                    'with `--drafter DIR`',
                    'not run',
                    'not run',
                    '`drafter_window: full`, not run'),
        ),
        TargetEntry(
            key="tiny", family="qwen3", target_id=None, drafter_id=None, block_size=8,
            build_config="tiny.yaml", supported=("inspect", "generate", "analyze", "convert", "build", "run"),
            tiny_family="qwen3",
            notes="trained tiny dense Qwen3 + DFlash2 drafter shipped in dflash2_trt/assets/tiny (scripts/train_tiny_drafter.py)",
            status=(  # README status: cpu, cuda, TRT-LLM project runtime, TRT-LLM C++ executor
                    'lossless + law, tp 1-4 (CI)',
                    'fp32, bf16 = HF at c1, c16 (H200, H100)',
                    'tokens = cpu (stand-in, CI)',
                    'supported, not run'),
        ),
        TargetEntry(
            key="tiny-hybrid", family="qwen3_5", target_id=None, drafter_id=None, block_size=8,
            build_config="tiny-hybrid.yaml", supported=("inspect", "generate", "analyze", "convert", "build", "run"),
            tiny_family="qwen3_5",
            notes="trained tiny Qwen3.5 hybrid (wrapper + tiny vision tower) + DFlash2 drafter shipped in dflash2_trt/assets/tiny",
            status=(  # README status: cpu, cuda, TRT-LLM project runtime, TRT-LLM C++ executor
                    'lossless + law (CI)',
                    'fp32 = HF; bf16: 4/32 ties (H100)',
                    '= cpu, baseline = HF; tp 2: mpiexec (stand-in, CI)',
                    'refused (recurrent)'),
        ),
        TargetEntry(
            key="tiny-muse", family="muse_glimmer", target_id=None, drafter_id=None, block_size=16,
            build_config="tiny-muse.yaml", supported=("inspect", "generate", "analyze", "convert", "build", "run"),
            tiny_family="muse_glimmer",
            notes="trained tiny Muse Glimmer (wrapper + tiny vision tower; sliding and NoPE full-attention layers) + "
                  "block-16 DFlash2 drafter with the target's KV layout, shipped in dflash2_trt/assets/tiny",
            status=(  # README status: cpu, cuda, TRT-LLM project runtime, TRT-LLM C++ executor
                    'lossless + law (CI)',
                    'fp32 = HF; bf16: 2/32 ties (H100)',
                    'refused (windows); feed = cpu (stand-in, CI)',
                    'refused (windows)'),
        ),
    )
}


# README's status table: the backends, and what each cell's words mean (printed by `targets` and the dry run)
STATUS_COLUMNS = ("cpu", "cuda", "TRT-LLM, project runtime", "TRT-LLM, C++ executor")
STATUS_LEGEND = ("CI: every CI run (CPU); H200: the GPU run of 2026-12-04; H100: the GPU run of 2026-12-05; ties: "
                 "outputs that differ only where the target's own top two tokens are within two steps of the dtype "
                 "(the build gate's rule); stand-in: against a CPU stand-in of "
                 "TensorRT held to facts recorded from TensorRT 10 / TensorRT-LLM 1.2 sources (neither installs "
                 "here); lossless + law: greedy token-identical to the target, sampled tokens pass the target's "
                 "exact law; = HF: identical to the HF target's greedy decoding on the same GPU; refused: by stock "
                 "TensorRT-LLM 1.2's executor, or for `windows` by this project's TensorRT-LLM build; windows: TensorRT-LLM's attention plugin does not apply a sliding window in "
                 "speculative-decoding steps: a target's sliding layers take each step's new tokens as a context chunk "
                 "there (context route, where the plugin applies it, read in its sources, not run), a drafter's own "
                 "window that can bind is refused, and so is a target's the route cannot take (not a multiple of "
                 "128, as tiny-muse's 16) (docs/gpu.md)")


def tiny_targets() -> dict[str, str]:
    """The registered tiny pairs (shipped, trained): target key -> its trained pair's family folder."""
    return {k: e.tiny_family for k, e in TARGETS.items() if e.tiny_family is not None}


def status_of(e: TargetEntry) -> dict[str, str]:
    """Where each backend has been verified for ``e`` (README's status row), by column."""
    return dict(zip(STATUS_COLUMNS, e.status))


def get_target(key: str) -> TargetEntry:
    try:
        return TARGETS[key]
    except KeyError:
        raise DFlash2Error(f"unknown target {key!r}; known targets: {', '.join(TARGETS)}") from None


def _local_model_dir(repo_id: str, allow_download: bool) -> tuple[Path | None, str | None]:
    """(the checkpoint's directory or None, why a download that was allowed failed or None)."""
    models = os.environ.get("DFLASH2_TRT_MODELS")
    if models:
        cand = Path(models) / repo_id.replace("/", "__")
        if (cand / "config.json").is_file():
            return cand, None
    try:
        from huggingface_hub import snapshot_download
    except ImportError:  # pragma: no cover - transformers depends on it
        return None, ("huggingface_hub is not importable" if allow_download else None)
    try:
        return Path(snapshot_download(repo_id, local_files_only=not allow_download)), None
    except Exception as e:  # noqa: BLE001 - any cause (network, 401 / 404, disk): said in one line when downloading
        first = (str(e).strip().splitlines() or [""])[0][:300]
        return None, (f"{type(e).__name__}: {first}" if allow_download else None)


def resolve_dirs(
    entry: TargetEntry,
    *,
    target_dir: str | Path | None = None,
    drafter_dir: str | Path | None = None,
    allow_download: bool = False,
    config_fallback: list[str] | None = None,
) -> tuple[Path, Path]:
    """(drafter dir, target dir) for ``entry``; explicit paths win. ``config_fallback`` (a list, for what needs the
    configs alone, e.g. ``build --dry-run``): a published checkpoint that is not available locally resolves to its
    configs shipped in the package (:data:`PUBLISHED_DIR`, no weights), and a line saying so is appended to it."""
    if entry.tiny_family is not None and (target_dir is None or drafter_dir is None):
        # The TRAINED tiny pairs shipped in dflash2_trt/assets (the seeded random pairs of
        # testing.tiny stay available to tests through testing.tiny.tiny_pair).
        from .assets import trained_pair

        pair = trained_pair(entry.tiny_family)
        target_dir = target_dir or pair.target_dir
        drafter_dir = drafter_dir or pair.drafter_dir
    out = []
    for kind, given, repo in (("drafter", drafter_dir, entry.drafter_id), ("target", target_dir, entry.target_id)):
        if given is not None:
            p = Path(given)
            if not p.is_dir():
                raise DFlash2Error(f"{kind} directory not found: {p}")
            out.append(p)
            continue
        if repo is None:
            raise DFlash2Error(f"target {entry.key!r} has no published {kind}; pass --{'drafter' if kind == 'drafter' else 'target-dir'} DIR")
        found, failed = _local_model_dir(repo, allow_download)
        shipped = PUBLISHED_DIR / repo.replace("/", "__")
        if found is None and config_fallback is not None and (shipped / "config.json").is_file():
            config_fallback.append(f"{kind} {repo} is not available locally"
                                   + (f" (--download failed: {failed})" if failed else "")
                                   + f": read from its config shipped in the package ({shipped}; configs only, "
                                     f"no weights" + ("" if failed else "; --download fetches them") + ")")
            found = shipped
        if found is None and failed is not None:
            raise DFlash2Error(f"--download: {kind} {repo} for target {entry.key!r} could not be downloaded: {failed}")
        if found is None:
            raise DFlash2Error(
                f"{kind} {repo} for target {entry.key!r} is not available locally. Download it first "
                f"(`hf download {repo}`), set DFLASH2_TRT_MODELS to a directory holding {repo.replace('/', '__')}/, "
                f"pass --{'drafter' if kind == 'drafter' else 'target-dir'} DIR, or add --download."
            )
        out.append(found)
    return out[0], out[1]
