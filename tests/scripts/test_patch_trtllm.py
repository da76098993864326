"""scripts/patch_trtllm_recurrent_spec.py on a synthetic TensorRT-LLM-shaped source tree.

The snippets below are written for this test in the shape the script looks for (the conditions as the 1.2.x
runtime reads them, paraphrased; see docs/hybrid-runtime.md); they are not TensorRT-LLM code.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "patch_trtllm_recurrent_spec.py"


def _load():
    spec = importlib.util.spec_from_file_location("patch_trtllm_recurrent_spec", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


P = _load()

JSON_CONFIG = """\
// synthetic: engine config -> model variant
void pickVariant(Json const& pretrained, ModelConfig& cfg)
{
    auto const arch = pretrained.at("architecture").template get<std::string>();
    if (arch == std::string("MambaForCausalLM"))
    {
        cfg.setModelVariant(ModelConfig::ModelVariant::kMamba);
    }
    else if (arch == std::string("RecurrentGemmaForCausalLM"))
    {
        cfg.setModelVariant(ModelConfig::ModelVariant::kRecurrentGemma);
    }
}
"""

EXECUTOR = """\
// synthetic: the executor's own config checks (chunked context) and the batching type per model
[[nodiscard]] bool executorConfigIsValid(ExecutorConfig const& executorConfig, runtime::ModelConfig const& modelConfig)
{
    if (executorConfig.getEnableChunkedContext())
    {
        if (modelConfig.isRnnBased() || !modelConfig.getPagedContextFMHA())
        {
            return false;
        }
    }
    return true;
}

[[nodiscard]] ExecutorConfig fixExecutorConfig(
    ExecutorConfig const& executorConfig, runtime::ModelConfig const& modelConfig)
{
    auto fixed = executorConfig;
    // chunked context off where unsupported
    if (executorConfig.getEnableChunkedContext())
    {
        if (modelConfig.isRnnBased() || !modelConfig.getPagedContextFMHA())
        {
            fixed.setEnableChunkedContext(false);
            TLLM_LOG_WARNING("no chunked context here: RNN %d", modelConfig.isRnnBased());
        }
    }
    return fixed;
}

std::shared_ptr<Model> makeModel(runtime::ModelConfig const& modelConfig, ExecutorConfig const& ec)
{
    auto const type = [&ec, &modelConfig]()
    {
        switch (ec.getBatchingType())
        {
        case BatchingType::kINFLIGHT:
            return modelConfig.isRnnBased() ? batch_manager::TrtGptModelType::InflightBatching
                                            : batch_manager::TrtGptModelType::InflightFusedBatching;
        default: TLLM_THROW("bad batching");
        }
    }();
    return build(type);
}
"""

INFLIGHT = """\
// synthetic: the batch manager's model checks
bool TrtGptModelInflightBatching::executorConfigIsValid(
    ModelConfig const& modelConfig, executor::ExecutorConfig const& executorConfig)
{
    // keep in step with fixExecutorConfig
    if (executorConfig.getKvCacheConfig().getEnableBlockReuse())
    {
        if (!modelConfig.getPagedContextFMHA())
        {
            return false;
        }
    }
    return true;
}

executor::ExecutorConfig TrtGptModelInflightBatching::fixExecutorConfig(
    ModelConfig const& modelConfig, executor::ExecutorConfig const& executorConfig)
{
    if (executorConfig.getKvCacheConfig().getEnableBlockReuse())
    {
        auto kvCacheConfig = executorConfig.getKvCacheConfig();
        if (!modelConfig.getPagedContextFMHA())
        {
            kvCacheConfig.setEnableBlockReuse(false);
        }
        return withKvCacheConfig(executorConfig, kvCacheConfig);
    }
    return executorConfig;
}

TrtGptModelInflightBatching::TrtGptModelInflightBatching(ModelConfig const& modelConfig, bool ctxGenFusion,
    executor::ExecutorConfig const& executorConfig)
    : mModelConfig(modelConfig)
    , mCtxGenFusion(ctxGenFusion)
{
    if (mCtxGenFusion)
    {
        TLLM_CHECK_WITH_INFO(!mModelConfig.isRnnBased(), "recurrent models: no context generation fusion");
        TLLM_CHECK_WITH_INFO(mModelConfig.isTransformerBased(), "fusion needs a transformer");
    }
    if (modelConfig.isRnnBased())
    {
        TLLM_CHECK_WITH_INFO(modelConfig.getMaxBeamWidth() == 1, "recurrent models: beam width 1 only");
        TLLM_CHECK_WITH_INFO(
            !executorConfig.getEnableChunkedContext(), "recurrent models: no Chunked Context");
        TLLM_CHECK_WITH_INFO(
            modelConfig.getSpeculativeDecodingMode().isNone(), "recurrent models: no speculative decoding");
    }
}
"""

FILES = {P.GPT_JSON_CONFIG: JSON_CONFIG, P.EXECUTOR_IMPL: EXECUTOR, P.INFLIGHT_BATCHING: INFLIGHT}


def make_tree(root: Path, version: str = "1.2.0rc2", files: dict | None = None) -> Path:
    for rel, text in (files or FILES).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "tensorrt_llm").mkdir(exist_ok=True)
    (root / "tensorrt_llm" / "version.py").write_text(f'__version__ = "{version}"\n')
    return root


def snapshot(root: Path) -> dict:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.fixture
def tree(tmp_path):
    return make_tree(tmp_path / "trtllm")


def test_applies_every_required_change(tree, capsys):
    assert P.main([str(tree)]) == 0
    js, ex, ib = (tree / p for p in (P.GPT_JSON_CONFIG, P.EXECUTOR_IMPL, P.INFLIGHT_BATCHING))
    js, ex, ib = js.read_text(), ex.read_text(), ib.read_text()
    # R1: the project's architecture maps to the hybrid variant, next to RecurrentGemma
    assert 'arch == std::string("RecurrentGemmaForCausalLM") || arch == std::string("DFlash2Qwen3_5ForCausalLM")' in js
    # R2: fused batching for the hybrid, stock rule otherwise
    assert '(modelConfig.isRnnBased() && !(modelConfig.getModelName() == "DFlash2Qwen3_5ForCausalLM"))' in ex
    assert "? batch_manager::TrtGptModelType::InflightBatching" in ex
    # R3, R4: the two refusals pass for the hybrid only; the other checks are untouched
    assert '(!mModelConfig.isRnnBased() || (mModelConfig.getModelName() == "DFlash2Qwen3_5ForCausalLM"))' in ib
    assert ('(modelConfig.getSpeculativeDecodingMode().isNone() || (modelConfig.getSpeculativeDecodingMode().isEagle()'
            ' && (modelConfig.getModelName() == "DFlash2Qwen3_5ForCausalLM")))') in ib
    assert 'TLLM_CHECK_WITH_INFO(mModelConfig.isTransformerBased(), "fusion needs a transformer");' in ib
    assert 'modelConfig.getMaxBeamWidth() == 1, "recurrent models: beam width 1 only"' in ib
    # G1a/G1b: block reuse off for the hybrid
    assert ib.count("dflash2-trt:G1a") == 1 and ib.count("dflash2-trt:G1b") == 1
    assert "            return false;\n        }\n        if (!modelConfig.getPagedContextFMHA())" in ib
    assert "kvCacheConfig.setEnableBlockReuse(false);\n        }\n        if (!modelConfig" in ib
    # O1 is opt-in: the chunked-context refusal stays, and so does the executor's switch-off (O1b, O1c)
    assert "!executorConfig.getEnableChunkedContext(), \"recurrent models: no Chunked Context\"" in ib
    assert ex.count("if (modelConfig.isRnnBased() || !modelConfig.getPagedContextFMHA())") == 2
    for text in (js, ex, ib):   # the edits keep the code balanced
        assert text.count("(") == text.count(")") and text.count("{") == text.count("}")
    out = capsys.readouterr().out
    assert "3 file(s) written" in out and "scripts/build_wheel.py --cuda_architectures" in out


def test_chunked_context_and_architectures_options(tree):
    assert P.main([str(tree), "--chunked-context", "--architecture", "A1", "--architecture", "B2"]) == 0
    ib = (tree / P.INFLIGHT_BATCHING).read_text()
    assert ('(!executorConfig.getEnableChunkedContext() || (mModelConfig.getModelName() == "A1" || '
            'mModelConfig.getModelName() == "B2"))') in ib
    # the executor turns chunked context off for every RNN-based model before the model exists (executorImpl.cpp):
    # both of its functions skip the hybrid, so O1's check is actually reached with chunking on
    ex = (tree / P.EXECUTOR_IMPL).read_text()
    pred = '(modelConfig.getModelName() == "A1" || modelConfig.getModelName() == "B2")'
    assert ex.count(f"if ((modelConfig.isRnnBased() && !{pred}) /* dflash2-trt:O1") == 2
    assert "dflash2-trt:O1b" in ex.split("fixExecutorConfig")[0] and "dflash2-trt:O1c" in ex.split("fixExecutorConfig")[1]
    assert 'TLLM_LOG_WARNING("no chunked context here: RNN %d", modelConfig.isRnnBased());' in ex
    js = (tree / P.GPT_JSON_CONFIG).read_text()
    assert 'arch == std::string("A1") || arch == std::string("B2")' in js
    assert "DFlash2Qwen3_5ForCausalLM" not in js


def test_idempotent(tree, capsys):
    assert P.main([str(tree), "--chunked-context"]) == 0
    first = snapshot(tree)
    capsys.readouterr()
    assert P.main([str(tree), "--chunked-context"]) == 0
    assert snapshot(tree) == first
    out = capsys.readouterr().out
    applied = [ln for ln in out.splitlines() if ln.startswith("  ") and ln.endswith(": already applied")]
    assert len(applied) == 9 and "nothing to do" in out
    # a third run without the option: the applied O1 stays, the rest is still 'already applied'
    assert P.main([str(tree)]) == 0 and snapshot(tree) == first


def test_refuses_other_architectures_once_applied(tree, capsys):
    assert P.main([str(tree)]) == 0
    applied = snapshot(tree)
    assert P.main([str(tree), "--architecture", "Other"]) == 2
    assert "patched for other architectures" in capsys.readouterr().err
    assert snapshot(tree) == applied


@pytest.mark.parametrize("rel, old, new, pid", [
    (P.GPT_JSON_CONFIG, '"RecurrentGemmaForCausalLM"', '"GriffinForCausalLM"', "R1"),
    (P.EXECUTOR_IMPL, "modelConfig.isRnnBased() ?", "modelConfig.isRecurrent() ?", "R2"),
    (P.INFLIGHT_BATCHING, "TLLM_CHECK_WITH_INFO(!mModelConfig.isRnnBased()", "TLLM_CHECK(!mModelConfig.isRnnBased()",
     "R3"),
    (P.INFLIGHT_BATCHING, '"recurrent models: no speculative decoding"', '"recurrent models: no drafts"', "R4"),
])
def test_refuses_missing_match_and_writes_nothing(tmp_path, capsys, rel, old, new, pid):
    files = dict(FILES)
    assert old in files[rel]
    files[rel] = files[rel].replace(old, new)
    root = make_tree(tmp_path / "t", files=files)
    before = snapshot(root)
    assert P.main([str(root)]) == 2
    err = capsys.readouterr().err
    assert f"{pid}: not found in {rel}" in err and "nothing written" in err
    assert snapshot(root) == before          # all or nothing: the other files are untouched too


def test_refuses_ambiguous_match(tmp_path, capsys):
    files = dict(FILES)
    files[P.EXECUTOR_IMPL] = EXECUTOR + "\n" + EXECUTOR.replace("makeModel", "makeOtherModel")
    root = make_tree(tmp_path / "t", files=files)
    before = snapshot(root)
    with pytest.raises(P.PatchError, match=r"R2: ambiguous in .*executorImpl\.cpp.*2 matches \(lines 37, 81\)"):
        P.plan(root)
    assert P.main([str(root)]) == 2 and "ambiguous" in capsys.readouterr().err
    assert snapshot(root) == before


def test_refuses_missing_file_and_wrong_version(tmp_path, capsys):
    files = {k: v for k, v in FILES.items() if k != P.EXECUTOR_IMPL}
    root = make_tree(tmp_path / "t", files=files)
    assert P.main([str(root)]) == 2
    assert f"R2: {P.EXECUTOR_IMPL} not found" in capsys.readouterr().err
    other = make_tree(tmp_path / "v", version="1.3.0rc1")
    assert P.main([str(other)]) == 2
    assert "written for 1.2.x" in capsys.readouterr().err
    assert P.main([str(other), "--any-version", "--dry-run"]) == 0
    assert P.main([str(tmp_path / "nothing-here")]) == 2
    with pytest.raises(P.PatchError, match="C\\+\\+-safe"):
        P.plan(other, ["bad name\""])


def test_dry_run_prints_diff_and_changes_nothing(tree, capsys):
    before = snapshot(tree)
    assert P.main([str(tree), "--dry-run", "--build"]) == 0
    out = capsys.readouterr().out
    assert snapshot(tree) == before
    for rel in FILES:
        assert f"--- a/{rel}" in out and f"+++ b/{rel}" in out
    assert out.count("\n+") >= 7 and "dflash2-trt:R4" in out and "--dry-run: not building" in out
    # dry run on an applied tree: no diff
    assert P.main([str(tree)]) == 0
    capsys.readouterr()
    assert P.main([str(tree), "--dry-run"]) == 0
    assert "no change" in capsys.readouterr().out


def test_crlf_files_keep_their_line_endings(tmp_path):
    files = {k: v.replace("\n", "\r\n") for k, v in FILES.items()}
    root = make_tree(tmp_path / "t", files=files)
    assert P.main([str(root)]) == 0
    raw = (root / P.INFLIGHT_BATCHING).read_bytes()
    assert b"dflash2-trt:G1b" in raw and raw.count(b"\r\n") > 40


def test_build_runs_the_checkouts_build_script(tree, capsys):
    script = tree / "scripts" / "build_wheel.py"
    script.parent.mkdir()
    script.write_text("import sys, pathlib\npathlib.Path('built.txt').write_text(' '.join(sys.argv[1:]))\n")
    assert P.build_command(trt_root="/opt/trt", extra=["--clean"]) == [
        "python3", "scripts/build_wheel.py", "--cuda_architectures", "90-real;100-real", "--trt_root", "/opt/trt",
        "--clean"]
    rc = P.main([str(tree), "--build", "--python", sys.executable, "--cuda-architectures", "90-real",
                 "--build-arg=--clean"])
    assert rc == 0
    assert (tree / "built.txt").read_text() == "--cuda_architectures 90-real --clean"
    assert "build: cd " in capsys.readouterr().out


def test_cli_exit_status(tree):
    r = subprocess.run([sys.executable, str(SCRIPT), str(tree), "--dry-run"], capture_output=True, text=True)
    assert r.returncode == 0 and "+++ b/" in r.stdout
    r = subprocess.run([sys.executable, str(SCRIPT), str(tree / "missing")], capture_output=True, text=True)
    assert r.returncode == 2 and "not a directory" in r.stderr
