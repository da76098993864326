"""``dflash2-trt`` command line. Parsing and printing only; the work lives in the modules."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from . import __version__
from .errors import DFlash2Error


class _Group(click.Group):
    """Report DFlash2Error as one clear line and exit 1, never as a traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except DFlash2Error as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(1)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)


@click.group(cls=_Group)
@click.version_option(__version__, prog_name="dflash2-trt")
def main() -> None:
    """DFlash2 speculative decoding: Hugging Face drafter + target -> TensorRT-LLM."""


@main.command("targets")
@click.option("--json", "as_json", is_flag=True, help="Print the registry as JSON.")
def targets_cmd(as_json: bool) -> None:
    """List the registered targets."""
    from .targets import TARGETS

    rows = [
        {"key": e.key, "family": e.family, "target": e.target_id or "(built locally)",
         "drafter": e.drafter_id or ("(built locally)" if e.tiny_family else "(none published: --drafter DIR)"),
         "block_size": e.block_size, "build_config": f"build_configs/{e.build_config}",
         "supported": list(e.supported), "notes": e.notes}
        for e in TARGETS.values()
    ]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for r in rows:
        click.echo(f"{r['key']}")
        click.echo(f"  family: {r['family']}   block_size: {r['block_size']}   build config: {r['build_config']}")
        click.echo(f"  target: {r['target']}")
        click.echo(f"  drafter: {r['drafter']}")
        click.echo(f"  supported: {', '.join(r['supported'])}")
        if r["notes"]:
            click.echo(f"  notes: {r['notes']}")


def _pair_options(f):
    f = click.option("--download", is_flag=True, help="Allow downloading missing checkpoints from the HF hub.")(f)
    f = click.option("--target-dir", type=click.Path(file_okay=False), help="Local target directory.")(f)
    f = click.option("--drafter", "drafter_dir", type=click.Path(file_okay=False), help="Local drafter directory.")(f)
    f = click.option("--target", "target_key", help="Registered target (see `dflash2-trt targets`).")(f)
    return f


def resolve_pair(target_key, drafter_dir, target_dir, download):
    """(drafter dir, target dir) from --target and/or explicit directories."""
    from .targets import get_target, resolve_dirs

    if target_key is not None:
        return resolve_dirs(get_target(target_key), target_dir=target_dir, drafter_dir=drafter_dir,
                            allow_download=download)
    if drafter_dir is None or target_dir is None:
        raise click.UsageError("give --target NAME, or both --drafter DIR and --target-dir DIR")
    return resolve_dirs_explicit(drafter_dir, target_dir)


def resolve_dirs_explicit(drafter_dir, target_dir):
    from pathlib import Path

    for kind, d in (("drafter", drafter_dir), ("target", target_dir)):
        if not Path(d).is_dir():
            raise DFlash2Error(f"{kind} directory not found: {d}")
    return Path(drafter_dir), Path(target_dir)


@main.command("inspect")
@click.argument("path", required=False, type=click.Path(file_okay=False))
@_pair_options
@click.option("--check-values", is_flag=True, help="Also read every tensor and reject NaN/Inf (slow on big models).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def inspect_cmd(path, target_key, drafter_dir, target_dir, download, check_values, as_json) -> None:
    """Check a drafter or target directory (PATH), or a drafter+target pair.

    Prints family, parameters by module, dtypes, the numerics-relevant config and the contract
    check; exits 1 when a check fails.
    """
    from .inspect import inspect_dir, inspect_pair, public, render

    if path is not None:
        if target_key or drafter_dir or target_dir:
            raise click.UsageError("give either PATH or --target/--drafter/--target-dir, not both")
        report = inspect_dir(path, check_values=check_values)
    else:
        d, t = resolve_pair(target_key, drafter_dir, target_dir, download)
        report = inspect_pair(d, t, check_values=check_values)
        report["drafter_dir"] = str(d.resolve())
        report["target_dir"] = str(t.resolve())
    if as_json:
        click.echo(json.dumps(public(report), indent=2))
    else:
        click.echo(render(report))
    if not report["ok"]:
        sys.exit(1)


@main.command("generate")
@_pair_options
@click.option("--prompt-ids", help="Prompt as comma-separated token ids, e.g. 1,2,3.")
@click.option("--prompt", help="Prompt text (needs a tokenizer in the target directory).")
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy.")
@click.option("--selector", type=click.Choice(["greedy", "viterbi", "sample", "none"]), default=None,
              help="Path selector walk [default: greedy at T=0, sample at T>0].")
@click.option("--max-new-tokens", type=int, default=64, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--block-size", type=int, default=None, help="Override the drafter's block size.")
@click.option("--top-k", type=int, default=None, help="Override the selector's candidates per position.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def generate_cmd(target_key, drafter_dir, target_dir, download, prompt_ids, prompt, temperature, selector,
                 max_new_tokens, seed, block_size, top_k, as_json) -> None:
    """Speculative decoding with the PyTorch reference; prints output and acceptance statistics."""
    from .reference.generate import render_generation, run_generate

    d, t = resolve_pair(target_key, drafter_dir, target_dir, download)
    report = run_generate(d, t, prompt_ids=prompt_ids, prompt=prompt, temperature=temperature,
                          selector=selector, max_new_tokens=max_new_tokens, seed=seed,
                          block_size=block_size, top_k=top_k)
    click.echo(json.dumps(report, indent=2) if as_json else render_generation(report))


@main.command("convert")
@_pair_options
@click.option("--output", required=True, type=click.Path(), help="Checkpoint directory to create.")
@click.option("--tp-size", default=1, show_default=True, type=click.Choice(["1", "2", "4", "8"]),
              help="Tensor-parallel ranks (one rank{N}.safetensors each).")
@click.option("--pp-size", default=1, show_default=True, type=click.Choice(["1"]), help="Pipeline stages (1 only).")
@click.option("--dtype", type=click.Choice(["bfloat16", "float16"]), default=None,
              help="Cast weights to this dtype (default: the checkpoints' own).")
@click.option("--force", is_flag=True, help="Replace a non-empty output directory.")
def convert_cmd(target_key, drafter_dir, target_dir, download, output, tp_size, pp_size, dtype, force) -> None:
    """Convert a DFlash2 drafter + its target into one TensorRT-LLM checkpoint (TP-sharded)."""
    from .convert import convert_pair

    d, t = resolve_pair(target_key, drafter_dir, target_dir, download)
    res = convert_pair(d, t, output, tp_size=int(tp_size), dtype=dtype, force=force)
    for p in res.stale_removed:
        click.echo(f"removed {p} (left behind by an earlier run that was killed)", err=True)
    click.echo(f"wrote {res.output} (tp {res.tp_size}, {res.dtype}, {len(res.files) - 1} rank file(s), "
               f"{res.bytes_read / 2**20:.1f} MiB read in {res.seconds:.1f} s)")


_EXPORT_ONNX_EPILOG = """\b
Outputs: OUT/drafter.onnx (the graph), OUT/drafter.onnx.data (the weights, external data),
OUT/manifest.json (I/O, plugin nodes and attributes, optimisation profile, trtexec shapes, sha256).

\b
Build it with TensorRT 10.13 on an H200 / B200 (trtexec; the engine runs only there):
  cmake -S plugins -B plugins/build -DTensorRT_ROOT=/path/to/TensorRT-10.13 \\
        -DCMAKE_CUDA_ARCHITECTURES="90a;100a" && cmake --build plugins/build -j
  dflash2-trt export-onnx --target qwen3.8-27b --dtype bfloat16 --output drafter-onnx
  trtexec --onnx=drafter-onnx/drafter.onnx --stronglyTyped \\
          --dynamicPlugins=plugins/build/libdflash2_plugins_dynamic.so \\
          --setPluginsToSerialize=plugins/build/libdflash2_plugins_dynamic.so \\
          --minShapes=... --optShapes=... --maxShapes=...   (the manifest's "trtexec" shapes) \\
          --saveEngine=drafter.plan
  (--staticPlugins=plugins/build/libdflash2_plugins.so instead loads the self-registering
  library; never both.) The command printed after the export has the shapes filled in.
  --no-plugins graphs need no plugin flags.
"""


@main.command("export-onnx", epilog=_EXPORT_ONNX_EPILOG)
@_pair_options
@click.option("--output", required=True, type=click.Path(), help="Directory to create.")
@click.option("--dtype", type=click.Choice(["float16", "bfloat16", "float32"]), default=None,
              help="Graph dtype [default: the drafter's].")
@click.option("--opset", type=int, default=18, show_default=True, help="ONNX opset of the default domain (17..23).")
@click.option("--no-plugins", is_flag=True,
              help="Standard ONNX ops only: the conv and the selector (top-k lattice + walk) decomposed.")
@click.option("--selector", type=click.Choice(["greedy", "viterbi"]), default="greedy", show_default=True,
              help="greedy = the published walk (greedy at T<=0, sampling at T>0); viterbi = global best path.")
@click.option("--tp-size", type=int, default=1, show_default=True, help="1 only: an ONNX graph is one device's.")
@click.option("--max-batch-size", type=int, default=8, show_default=True, help="Batch range of the profile.")
@click.option("--max-seq-len", type=int, default=None,
              help="Longest context of the profile [default: the target's max_position_embeddings].")
@click.option("--force", is_flag=True, help="Replace a non-empty output directory.")
def export_onnx_cmd(target_key, drafter_dir, target_dir, download, output, dtype, opset, no_plugins, selector, tp_size,
                    max_batch_size, max_seq_len, force) -> None:
    """Export the drafter's draft pass as ONNX, with DFlash2 plugin nodes (domain dflash2) or without."""
    from .onnx import export_onnx
    from .onnx.export import trtexec_command

    d, t = resolve_pair(target_key, drafter_dir, target_dir, download)
    res = export_onnx(d, t, output, dtype=dtype, opset=opset, use_plugins=not no_plugins, selector=selector,
                      tp_size=tp_size, max_batch_size=max_batch_size, max_seq_len=max_seq_len, force=force,
                      target_key=target_key, command=sys.argv)
    m = res.manifest
    nodes = sum(v["count"] for v in m["plugin_nodes"].values())
    click.echo(f"wrote {res.output} ({'plugins: ' + str(nodes) + ' nodes' if m['plugins'] else 'no plugins'}, "
               f"{m['dtype']}, opset {m['opset']}, {m['files']['drafter.onnx.data']['size'] / 2**20:.1f} MiB of "
               f"weights, {res.seconds:.1f} s)")
    click.echo("build on an H200/B200 with TensorRT 10.13:")
    click.echo("  " + trtexec_command(m, onnx_path=str(Path(res.output) / m["graph"])))


@main.command("analyze")
@_pair_options
@click.option("--prompts", "prompts_file", type=click.Path(dir_okay=False),
              help="JSON / JSON-lines prompts (token-id lists or strings); default: the built-in set.")
@click.option("--block-size", type=int, help="Override the drafter's block size.")
@click.option("--top-k", "top_k", default="4,8,16", show_default=True, help="Comma-separated candidate widths.")
@click.option("--max-new-tokens", type=int, default=64, show_default=True, help="Greedy tokens per prompt.")
@click.option("--max-prompts", type=int, help="Use only the first N prompts.")
@click.option("--no-measure", is_flag=True, help="Skip the real speculative-decoding runs.")
@click.option("--temperature", type=float, default=0.0, show_default=True,
              help="Also measure the sampling selector at this temperature (> 0).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def analyze_cmd(target_key, drafter_dir, target_dir, download, prompts_file, block_size, top_k, max_new_tokens,
                max_prompts, no_measure, temperature, as_json) -> None:
    """Recall@k per draft position, implied vs measured acceptance (top-1, selector, oracle)."""
    from .analyze import analyze_pair, parse_top_k, render

    d, t = resolve_pair(target_key, drafter_dir, target_dir, download)
    report = analyze_pair(d, t, prompts_file=prompts_file, block_size=block_size, top_k=parse_top_k(top_k),
                          max_new_tokens=max_new_tokens, max_prompts=max_prompts, measure=not no_measure,
                          temperature=temperature)
    click.echo(json.dumps(report, indent=2) if as_json else render(report))


@main.command("build")
@_pair_options
@click.option("--output", required=True, type=click.Path(), help="Engine directory to create.")
@click.option("--backend", type=click.Choice(["auto", "cpu", "trtllm"]), default="auto", show_default=True,
              help="cpu: the network run by the CPU stand-in; trtllm: TensorRT-LLM engines (auto: trtllm where it "
                   "imports, else cpu).")
@click.option("--tp-size", default="1", show_default=True, type=click.Choice(["1", "2", "4", "8"]),
              help="Tensor-parallel ranks (the CPU backend simulates them).")
@click.option("--dtype", type=click.Choice(["bfloat16", "float16"]), default=None,
              help="Cast weights (default: the checkpoints' own).")
@click.option("--block-size", type=int, default=None, help="Draft block size (K + 1) [default: the build config's].")
@click.option("--max-batch-size", type=int, default=None, help="Requests per engine step [default: build config].")
@click.option("--max-input-len", type=int, default=None, help="Longest prompt [default: build config].")
@click.option("--max-seq-len", type=int, default=None, help="Prompt + output + draft slots [default: build config].")
@click.option("--max-num-tokens", type=int, default=None, help="Tokens per engine step [default: build config].")
@click.option("--tokens-per-block", type=int, default=None, help="KV cache tokens per block [default: 32].")
@click.option("--selector", type=click.Choice(["greedy", "viterbi"]), default=None,
              help="Path selector (greedy = published: greedy at T=0, sampling at T>0) [default: build config].")
@click.option("--drafter-window", type=click.Choice(["model", "full"]), default=None,
              help="model: the drafter's own sliding window; full: full-context drafter attention [default: model].")
@click.option("--force", is_flag=True, help="Replace a non-empty output directory.")
def build_cmd(target_key, drafter_dir, target_dir, download, output, backend, tp_size, dtype, block_size,
              max_batch_size, max_input_len, max_seq_len, max_num_tokens, tokens_per_block, selector, drafter_window,
              force) -> None:
    """Build an engine directory (validate -> convert -> engine config + manifest)."""
    from .engine.build import build_engine
    from .trtllm.backend import resolve

    d, t = resolve_pair(target_key, drafter_dir, target_dir, download)
    res = build_engine(d, t, output, backend=resolve(None if backend == "auto" else backend), tp_size=int(tp_size),
                       dtype=dtype, target_key=target_key, force=force, command=sys.argv,
                       overrides={"block_size": block_size, "max_batch_size": max_batch_size,
                                  "max_input_len": max_input_len, "max_seq_len": max_seq_len,
                                  "max_num_tokens": max_num_tokens, "tokens_per_block": tokens_per_block,
                                  "selector": selector, "drafter_window": drafter_window})
    m = res.manifest
    click.echo(f"wrote {res.output} ({m['backend']} engine, block {m['block_size']}, tp {m['tp_size']}, {m['dtype']}, "
               f"max batch {m['limits']['max_batch_size']}, {len(m['files'])} files)")


@main.command("run")
@click.option("--engine-dir", required=True, type=click.Path(), help="Engine directory from `dflash2-trt build`.")
@click.option("--prompt-ids", help="One prompt as comma-separated token ids.")
@click.option("--prompt", help="One prompt as text (needs the target's tokenizer).")
@click.option("--prompts", "prompts_file", type=click.Path(dir_okay=False),
              help='JSON lines in trtllm-bench\'s format: {"task_id", "input_ids" | "prompt", "output_tokens"}.')
@click.option("--max-new-tokens", type=int, default=64, show_default=True,
              help="New tokens per prompt (a line's output_tokens overrides it).")
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy.")
@click.option("--seed", type=int, default=0, show_default=True, help="Request i uses seed + i.")
@click.option("--max-batch-size", type=int, default=None, help="Requests in flight [default: the engine's].")
@click.option("--verify", is_flag=True, help="Re-hash every engine file against engine.json first.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def run_cmd(engine_dir, prompt_ids, prompt, prompts_file, max_new_tokens, temperature, seed, max_batch_size, verify,
            as_json) -> None:
    """Run prompts through an engine (CPU runtime: in-flight batching); prints tokens and acceptance."""
    from .engine.run import render, run_engine

    report = run_engine(engine_dir, prompt_ids=prompt_ids, prompt=prompt, prompts_file=prompts_file,
                        max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                        max_batch_size=max_batch_size, verify=verify)
    click.echo(json.dumps(report, indent=2) if as_json else render(report))


if __name__ == "__main__":  # pragma: no cover
    main()
