#!/usr/bin/env python3
"""Conformance harness: the project's engine network through TensorRT-LLM's own network-definition code.

    python scripts/trtllm_conformance.py --trtllm-src DIR [--target tiny|tiny-hybrid|tiny-muse|all]
                                         [--tp 1|2|all] [--network combined|baseline|all] [--model-file PATH]
                                         [--no-register] [--json]

DIR holds TensorRT-LLM's public Python sources at their repository paths (``DIR/tensorrt_llm/functional.py``...;
never part of this repository). For each target and tp size, for every rank, the harness runs what
``trtllm-build`` does to define the network (commands/build.py -> builder.build, reproduced here because
build.py / builder.py are not in DIR): the checkpoint ``dflash2-trt build --backend trtllm`` would hand to
trtllm-build (converted checkpoint + ``engine.pretrained.engine_pretrained_config``: EAGLE fields,
``dflash2_engine``), its recorded command line (``engine.trtllm.command.trtllm_build_argv``: plugin flags, max
sizes, ``--max_draft_len``) and the class it names (``--model_cls_name``); with ``--network baseline`` (or ``all``,
the default) also the second build of ``build --baseline`` (``baseline_pretrained_config``, ``TargetOnlyForCausalLM``,
no speculative decoding mode); the real
``PretrainedConfig.from_json_file`` (MODEL_MAP lookup; the architectures are registered through
``dflash2_trt.trtllm.register`` unless ``--no-register``), ``model_cls.from_checkpoint`` (real
``PretrainedModel.__init__``/``load``), a real ``Network`` over TensorRT-RTX, ``prepare_inputs`` and ``forward``
inside ``net_guard``, then a TensorRT-RTX engine build. Around them it runs what ``builder.build`` does for our
command line between the model and ``build_engine`` (scripts/trtllm_conformance_lib/build_steps.py, facts and
sources in trtllm_build_steps.yaml): the build_config adjustments (max_seq_len + K + num_eagle_layers, the real
``check_max_num_tokens``), the real ``optimize_model`` with builder's arguments, the nccl-plugin rule, builder's
``prepare_inputs`` keywords, the graph-rewriting pass's match rule and the optimization-profile checks; the report's
``build_steps`` lists what each did. It prints per target/tp/rank: defined or the first error
with a traceback summary; layers, inputs, outputs, plugin layers; build OK/fail. Exit status 1 when any fails.
With ``--json`` each rank also lists ``gpt_attention_bindings``: per GPTAttention call its ``layer_idx`` and, per
plugin input entry (gpt_attention_contract.yaml's names), the network input real ``functional.gpt_attention`` put
there (None: a tensor computed in the graph), e.g. where the context route's ``sliding_*`` inputs arrive.

Real (run from DIR, unmodified): tensorrt_llm/{_utils, _common, logger, module, parameter, network, functional,
mapping}.py, plugin/plugin.py, layers/{linear, normalization, embedding}.py, models/modeling_utils.py (the
revisions read are listed in DIR/COMMITS.txt when present; the store holds some files at 1.2.0rc2 = b35ac1b6, others
at one other revision each: the runs of 2026-12-05 and 2026-12-06 used _utils, mapping and modeling_utils at b35ac1b6,
functional at 0071496d, network at 7b437aaa, plugin at c20322ff, _common at 0fccc5b9, logger at 14e801da, the layers
and module at the revisions api_1_2.yaml records; parameter.py is stored at b57221b7 only, which lacks the managed-
weights API linear.py calls, so the 2026-12-06 run took the newer 1.x text the store holds as file id 728909344).
scripts/trtllm_real_build.py needs two more: tensorrt_llm/commands/build.py (file id 387653565) and
tensorrt_llm/builder.py (file id 205252225), the revisions engine/trtllm/facts/trtllm_build_cli.yaml names.
tests/trtllm/test_runtime_sources.py (scripts/trtllm_conformance_lib/runtime_sources.py) needs the Python runtime's:
tensorrt_llm/runtime/session.py at 02721299, runtime/kv_cache_manager.py at 06c0e9b1 and runtime/memory_pools/
{memory_pools_allocator, pools_kv_cache_manager, pool}.py at 7ed07f06, the revisions tensorrt_session.yaml names.

Stubbed (in scripts/trtllm_conformance_lib/harness.py; none is on the definition path of this network, each
raises if called where a value matters):
- ``tensorrt``: TensorRT-RTX plus plugin placeholders (scripts/trtllm_conformance_lib/fake_trt.py): RTX's Python
  network API has no add_plugin_v2/v3, so each plugin call checks the plugin's input contract (GPTAttention:
  gpt_attention_contract.yaml, from functional.py and gptAttentionPlugin.cpp's isEntryUsed; DFlash2 plugins: their
  YAML specs) and makes shape/dtype-correct outputs from ordinary layers. The NCCL collectives (AllReduce,
  AllGather) are placeholders too, so tp 2 defines and builds each rank's network separately; the AllReduce
  placeholder applies allreducePlugin.cpp's input rule (the all_reduce_workspace input for every strategy but
  NCCL/UB).
- the package ``__init__`` files of tensorrt_llm, tensorrt_llm.layers, tensorrt_llm.plugin, tensorrt_llm.models
  (the real ones import every model family, the executor and the C++ bindings); ``MODEL_MAP`` starts empty.
- tensorrt_llm.bindings (C++ runtime), _ipc_utils, envs, llmapi.kv_cache_type, top_model_mixin,
  models.generation_mixin (prepare_basic_inputs: the network defines its own prepare_inputs), models.convert_utils,
  layers.{lora, attention, moe, conv} (type names only), graph_rewriting (metadata only), quantization (only the
  unquantized mode: QuantMode(0)), _torch.device_mesh (a base-class name of mapping.py's Ray-mode
  DeviceMeshTopology; Mapping() is an MpiTopology here), and the third-party mpi4py (one rank per process; its
  util.pkl5.Intracomm wrapper, which _utils.py applies at import, returns the communicator), nvtx,
  onnx_graphsurgeon.
- graph_rewriting.optimize(): its one pass (FuseAttentionWithBiasPass) matches PLUGIN_V2 GPTAttention layers, which
  the placeholders are not; the harness applies the pass's match rule to the real graph instead (build_steps.py).
- not reproduced: the refit/weight-streaming/strip-plan builder options (off on our command line).
- the DFlash2 plugin library is not loaded (dflash2_trt.plugins.load_library is replaced by a no-op); the
  DFlash2 plugin calls reach the placeholders.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

TARGETS = ("tiny", "tiny-hybrid", "tiny-muse")


def run(src, targets, tps, model_file=None, register=True, workdir=None, build=True, progress=None,
        networks=None) -> list[dict]:
    from trtllm_conformance_lib import harness

    networks = harness.NETWORKS if networks is None else networks
    harness.install(Path(src))
    model_file = Path(model_file) if model_file else REPO / "dflash2_trt" / "trtllm" / "model.py"
    reports = []
    with tempfile.TemporaryDirectory(prefix="trtllm-conformance-") as tmp:
        work = Path(workdir) if workdir else Path(tmp)
        for target, tp, network in itertools.product(targets, tps, networks):
            entry = {"target": target, "tp": tp, "network": network, "model_file": str(model_file), "ranks": []}
            if progress:
                progress(f"{target} tp{tp} {network}")
            try:
                ckpt, argv, _ = harness.prepare_checkpoint(target, tp, work, network=network)
            except Exception as exc:   # noqa: BLE001
                entry["error"] = f"checkpoint: {type(exc).__name__}: {exc}"
                reports.append(entry)
                continue
            entry["trtllm_build_argv"] = argv
            for rank in range(tp):
                entry["ranks"].append(harness.define(model_file, ckpt, argv, rank, register=register, build=build,
                                                    progress=progress))
            reports.append(entry)
    return reports


def profile_problems(x) -> list[str]:
    """What trtllm-build's profile step (build_steps add_optimization_profile) would refuse or make useless: inputs
    with other profile counts, a dimension name with two ranges, or no input with a dynamic range at all (a
    dim_range written as flat [min, opt, max] is three fixed-size profiles)."""
    prof = next((s for s in x.get("build_steps", []) if s["step"] == "add_optimization_profile"), None)
    if prof is None:
        return []
    out = [f"input with another profile count: {n}" for n in prof["inputs_with_other_profile_counts"]]
    out += list(prof["named_dimension_errors"])
    if not prof["inputs_with_a_dynamic_range"]:
        out.append(f"{prof['num_profiles']} optimization profile(s) and every input is static in each "
                   f"(TensorRT-LLM reads a dim_range entry as one range per profile)")
    return out


def ok(reports) -> bool:
    return all(not r.get("error") and r["ranks"] and all(x["defined"] and x.get("built", True) and not x.get("error")
                                                          and x.get("register_default_is_model_cls", True)
                                                          and not x.get("missing_outputs")
                                                          and not x.get("extra_outputs")
                                                          and not profile_problems(x)
                                                          for x in r["ranks"]) for r in reports)


def _build_word(x) -> str:
    if "built" not in x:
        return "not run"
    return f"OK ({x['engine_bytes']} bytes, {x.get('build_seconds')} s)" if x["built"] else "FAILED"


def format_report(reports) -> str:
    lines = []
    for r in reports:
        if r.get("error"):
            lines.append(f"{r['target']} tp{r['tp']} {r.get('network', 'combined')}: {r['error']}")
            continue
        for x in r["ranks"]:
            head = f"{r['target']} tp{r['tp']} {r.get('network', 'combined')} rank{x['rank']}:"
            if x["defined"]:
                lines.append(f"{head} defined: {x['layers']} TensorRT layers ({x['network_layers']} outside plugin "
                             f"placeholders), {x['inputs']} inputs, {x['outputs']} outputs, "
                             f"{x['plugin_layers']} plugin layers {x['plugins']}; RTX build "
                             f"{_build_word(x)}"
                             + (f" - {x['error']}" if x.get("error") else ""))
                lines += [f"    warning: {w}" for w in x.get("warnings", [])]
                lines += [f"    FAILED: {m}" for m in profile_problems(x)]
                for k in ("missing_outputs", "extra_outputs"):
                    if x.get(k):
                        lines.append(f"    FAILED: {k.replace('_', ' ')} against engine_io.yaml: {x[k]}")
                if x.get("register_default_is_model_cls") is False:
                    lines.append("    FAILED: register() maps the architectures to another class than the model file's")
            else:
                lines.append(f"{head} FAILED at {x['stage']}: {x['error']}")
                lines += [f"    {t}" for t in x.get("traceback", [])]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument("--trtllm-src", required=True, help="directory holding tensorrt_llm/... (TensorRT-LLM sources)")
    p.add_argument("--target", default="all", choices=(*TARGETS, "all"))
    p.add_argument("--tp", default="all", choices=("1", "2", "all"))
    p.add_argument("--network", default="all", choices=("combined", "baseline", "all"),
                   help="the combined engine's class (DFlash2ForCausalLM), the `build --baseline` class "
                        "(TargetOnlyForCausalLM, no speculative decoding mode), or both (default)")
    p.add_argument("--model-file", default=None, help="model class file (default: dflash2_trt/trtllm/model.py)")
    p.add_argument("--no-register", action="store_true", help="do not register the DFlash2 architectures")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--no-build", action="store_true", help="define the networks only (no TensorRT-RTX build)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    a = p.parse_args(argv)
    src = Path(a.trtllm_src)
    if not (src / "tensorrt_llm" / "functional.py").is_file():
        print(f"error: {src}: no tensorrt_llm/functional.py (--trtllm-src)", file=sys.stderr)
        return 2
    if a.model_file and not Path(a.model_file).is_file():
        print(f"error: {a.model_file}: not a file (--model-file)", file=sys.stderr)
        return 2
    targets = TARGETS if a.target == "all" else (a.target,)
    tps = (1, 2) if a.tp == "all" else (int(a.tp),)
    say = None if a.quiet else (lambda m: print(f"[conformance] {m}", file=sys.stderr, flush=True))
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)   # TensorRT and the sources log to stdout; the report alone goes there
    try:
        reports = run(src, targets, tps, a.model_file, register=not a.no_register, build=not a.no_build,
                      progress=say, networks=None if a.network == "all" else (a.network,))
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
    print(json.dumps(reports, indent=2) if a.json else format_report(reports))
    return 0 if ok(reports) else 1


if __name__ == "__main__":
    sys.exit(main())
