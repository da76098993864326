"""``dflash2-trt`` command line. Parsing and printing only; the work lives in the modules."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from . import __version__
from .errors import (DFlash2Error, Terminated, clear_stop_requests, committed_outputs, pending_stop,
                     raise_if_stop_requested, raise_stop, stop_requested)
from .targets import tiny_targets


def _raise_terminated(signum, frame):
    # A second SIGTERM must not cut short the clean-up of a stop already unwinding: a stop is recorded and an
    # exception is on its way up (the except / finally / __exit__ blocks run with it as sys.exc_info(); it may be
    # another exception than the stop's own, which an extension replaced, see _stopped). But if the first one's
    # exception was lost (raised inside a destructor or a weakref callback), nothing unwinds, and a later SIGTERM
    # must still stop the command: ignoring every SIGTERM after the first left such a command immune to them.
    if pending_stop() is not None and sys.exc_info()[1] is not None:
        stop_requested(signum)
        return
    raise stop_requested(signum)


def _unraisable(previous):
    """``sys.unraisablehook`` while a command runs: a stop raised inside a destructor or weakref callback is
    lost there (and printed as "Exception ignored"); it is recorded (errors.stop_requested) and raised again
    where it counts, so it is not printed. Anything else goes to the previous hook."""
    def hook(unraisable):
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            return
        previous(unraisable)
    return hook


def _stopped(signum: int):
    """One line and exit 143 (SIGTERM) or 130 (Ctrl-C). Also when the stop's exception did not reach here as
    itself: an extension module that catches an exception raised in a callback replaces it with its own (torch,
    reading a safetensors file while SIGTERM arrived: "could not determine the shape of object type
    'torch.storage.UntypedStorage'"), and the reader then reports a bad file. The recorded stop is what
    happened; the clean-up already ran on the way up."""
    import signal

    done = [str(p) for p in dict.fromkeys(committed_outputs) if p.exists()]   # (one inside a removed output: gone)
    kept = f" (complete and kept: {', '.join(done)})" if done else ""
    if signum == signal.SIGTERM:
        click.echo(f"terminated (SIGTERM): stopped; any output in progress was removed{kept}", err=True)
        sys.exit(143)
    click.echo(f"interrupted{kept}", err=True)
    sys.exit(130)


def _late_stop(finished: bool):
    """The SIGTERM / Ctrl-C handler from the moment a command has ended until the process is gone (tearing down
    takes a second: torch's finalizers). The default handlers would end it silently with -15, or print a
    KeyboardInterrupt traceback and still exit 0; this says one line and exits 143 / 130 at once. Whatever the
    command wrote is already in place (or already removed), so skipping the rest of the teardown loses nothing."""
    import os
    import signal

    def handler(signum, frame):
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        what = "terminated (SIGTERM)" if signum == signal.SIGTERM else "interrupted"
        os.write(2, f"{what} after the command had finished{': its output is complete' if finished else ''}\n"
                 .encode())
        os._exit(143 if signum == signal.SIGTERM else 130)
    return handler


def _stdout_write_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a failed write of the command's own output to standard output (``run --json > /dev/full``,
    a full disk behind ``>``): an OSError raised inside ``click.echo`` writing to file descriptor 1. Any other
    OSError is the command's own, reported as it was."""
    if not isinstance(exc, OSError):
        return False
    tb, echo = exc.__traceback__, None
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_name == "echo" and code.co_filename.endswith(("click/utils.py", "click\\utils.py")):
            echo = tb.tb_frame
        tb = tb.tb_next
    if echo is None or echo.f_locals.get("err"):
        return False
    try:
        return echo.f_locals.get("file").fileno() == 1
    except (AttributeError, OSError, ValueError):
        return False


def _stdout_failed(exc: OSError, status: int = 1):
    """One line on standard error and exit 1 when standard output cannot take the output (not a traceback, nor
    Python's "Exception ignored" at its exit and status 120): what is still buffered goes to /dev/null. A reader that
    went away (EPIPE: ``| head``) gets no line."""
    import errno
    import os

    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, 1)
        os.close(fd)
    except (OSError, ValueError):
        pass
    if exc.errno != errno.EPIPE:
        click.echo(f"error: standard output: cannot write the output ({exc.strerror or exc}); what it holds is "
                   f"incomplete", err=True)
    sys.exit(status)


class _Group(click.Group):
    """Report DFlash2Error as one clear line and exit 1, never as a traceback. Ctrl-C (exit 130) and
    SIGTERM (exit 143) unwind like an error: what a command was writing is removed, one line says so."""

    _process_entry = False

    def __call__(self, *args, **kwargs):
        """The process's own entry point (the console script, ``python -m dflash2_trt.cli``): once the command has
        ended, a stop signal until the process is gone is still one line and exit 143 / 130 (:func:`_late_stop`).
        In-process callers (click's CliRunner) call ``main``, and get their handlers back as they were."""
        self._process_entry = True
        if not sys.stderr.isatty():
            # no weight-loading / download bars in a log, a CI job or beside --json output (transformers and
            # huggingface_hub read this when they are imported, which every command does lazily, after this)
            import os

            os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        try:
            return super().__call__(*args, **kwargs)
        finally:
            self._process_entry = False
            ending = sys.exc_info()[1]     # click's SystemExit with the command's status, on its way out
            try:    # the output still buffered: its failure is this process's last word, not "Exception ignored"
                if sys.stdout is not None:  # None where fd 1 was closed at start (`>&-`, some daemons)
                    sys.stdout.flush()
            except OSError as exc:
                code = ending.code if isinstance(ending, SystemExit) and isinstance(ending.code, int) else 0
                _stdout_failed(exc, code or 1)     # a command that failed keeps its own status
            except ValueError:
                pass

    def invoke(self, ctx):
        import signal
        import threading

        previous = previous_int = None
        finished = False
        clear_stop_requests()
        committed_outputs.clear()
        if threading.current_thread() is threading.main_thread():
            previous = signal.signal(signal.SIGTERM, _raise_terminated)
            if signal.getsignal(signal.SIGINT) is signal.default_int_handler:   # Ctrl-C, recorded the same way
                previous_int = signal.signal(signal.SIGINT, raise_stop)
        hook, sys.unraisablehook = sys.unraisablehook, _unraisable(sys.unraisablehook)
        try:
            result = super().invoke(ctx)
            raise_if_stop_requested()   # a stop that was raised where Python swallows exceptions
            finished = True
            return result
        except Terminated:
            _stopped(signal.SIGTERM)
        except KeyboardInterrupt:
            _stopped(signal.SIGINT)
        except Exception as exc:
            if pending_stop() is not None:   # the stop's exception was turned into this one on its way up
                _stopped(pending_stop())
            if self._process_entry and _stdout_write_error(exc):
                _stdout_failed(exc)
            if not isinstance(exc, DFlash2Error):
                raise
            click.echo(f"error: {exc}", err=True)
            sys.exit(1)
        finally:
            sys.unraisablehook = hook
            late = _late_stop(finished) if self._process_entry else None
            if previous is not None:
                signal.signal(signal.SIGTERM, late or previous)
            if previous_int is not None:
                signal.signal(signal.SIGINT, late or previous_int)


@click.group(cls=_Group)
@click.version_option(__version__, prog_name="dflash2-trt")
@click.pass_context
def main(ctx) -> None:
    """DFlash2 speculative decoding: Hugging Face drafter + target -> TensorRT-LLM."""
    from .cpu_threads import calm_openmp_waits

    calm_openmp_waits()     # before anything imports torch: its CPU threads sleep sooner where others want the cores
    if ctx.invoked_subcommand in ("build", "run", "bench", "serve", "deploy"):
        # the commands that start the project runtime (build: its verify gate) or write its switch (deploy): a bad
        # $DFLASH2_CHUNKED_CONTEXT is their error before any work, not after a build
        from .chunking import chunked_context_default

        chunked_context_default()


@main.command("targets")
@click.option("--json", "as_json", is_flag=True, help="Print the registry as JSON.")
def targets_cmd(as_json: bool) -> None:
    """List the registered targets, with where each backend has been verified for each (README's status table)."""
    from .targets import STATUS_LEGEND, TARGETS, status_of

    rows = [
        {"key": e.key, "family": e.family, "target": e.target_id or "(shipped in dflash2_trt/assets/tiny)",
         "drafter": e.drafter_id or ("(shipped in dflash2_trt/assets/tiny)" if e.tiny_family
                                     else "(none published: --drafter DIR)"),
         "block_size": e.block_size, "build_config": f"build_configs/{e.build_config}",
         "supported": list(e.supported), "verified": status_of(e), "notes": e.notes}
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
        click.echo("  verified: " + "; ".join(f"{k}: {v}" for k, v in r["verified"].items()))
        if r["notes"]:
            click.echo(f"  notes: {r['notes']}")
    click.echo(f"verified, the words: {STATUS_LEGEND}")


FORCE_HELP = "Replace an earlier dflash2-trt output in a non-empty output directory (never a directory of other files)."


def _pair_options(f):
    f = click.option("--download", is_flag=True, help="Allow downloading missing checkpoints from the HF hub.")(f)
    f = click.option("--target-dir", type=click.Path(file_okay=False), help="Local target directory.")(f)
    f = click.option("--drafter", "drafter_dir", type=click.Path(file_okay=False), help="Local drafter directory.")(f)
    f = click.option("--target", "target_key", help="Registered target (see `dflash2-trt targets`).")(f)
    return f


def _chat_options(f):
    """``--chat`` / ``--enable-thinking``, alike in every command that encodes prompt text (tokenizer.ChatFormat)."""
    f = click.option("--enable-thinking", is_flag=True,
                     help="With --chat: render the template with enable_thinking true [default: false, as the public "
                          "DFlash benchmark renders its prompts].")(f)
    f = click.option("--chat", is_flag=True,
                     help="Put each prompt text through the target tokenizer's chat template as one user message, "
                          "the assistant's turn opened, before encoding it (how chat drafters are measured; token "
                          "ids are taken as they are).")(f)
    return f


def resolve_pair(target_key, drafter_dir, target_dir, download, configs_only=False):
    """(drafter dir, target dir) from --target and/or explicit directories. ``configs_only`` (a dry run, inspect):
    a published checkpoint not available locally is read from its configs shipped in the package, with a note."""
    from .targets import get_target, resolve_dirs

    if target_key is not None:
        notes: list[str] | None = [] if configs_only else None
        pair = resolve_dirs(get_target(target_key), target_dir=target_dir, drafter_dir=drafter_dir,
                            allow_download=download, config_fallback=notes)
        for n in notes or ():
            click.echo(f"note: {n}", err=True)
        return pair
    if drafter_dir is None or target_dir is None:
        raise click.UsageError("give --target NAME, or both --drafter DIR and --target-dir DIR")
    return resolve_dirs_explicit(drafter_dir, target_dir)


def resolve_dirs_explicit(drafter_dir, target_dir):
    from pathlib import Path

    for kind, d in (("drafter", drafter_dir), ("target", target_dir)):
        if not Path(d).is_dir():
            raise DFlash2Error(f"{kind} directory not found: {d}")
    return Path(drafter_dir), Path(target_dir)


def _refuse_our_outputs(path) -> None:
    """inspect reads Hugging Face checkpoints: an engine directory or a converted checkpoint (each has a config.json
    of TensorRT-LLM's, without architectures) is named for what it is, not reported as a config without
    'architectures'."""
    from .engine.checkpoint import FORMAT
    from .errors import ConfigError

    path = Path(path)
    if (path / "engine.json").is_file():
        raise ConfigError(f"an engine directory (engine.json), not a Hugging Face checkpoint: inspect checks "
                          f"checkpoints; engine.json records what the engine was built from, and `dflash2-trt run "
                          f"--engine-dir {path} --verify` checks its files", source=path)
    from .checkpoint.writer import marker_format

    if marker_format(path, "manifest.json") == FORMAT:
        raise ConfigError("a TensorRT-LLM checkpoint written by `dflash2-trt convert`, not a Hugging Face checkpoint: "
                          "inspect checks the drafter and target it was converted from (its manifest.json names "
                          "them)", source=path)


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
        _refuse_our_outputs(path)
        report = inspect_dir(path, check_values=check_values)
    else:
        # a published pair not downloaded: its configs shipped in the package (the tensor inventory where shipped),
        # with a note, as build --dry-run plans it; --check-values reads the weights, so it wants them, and a
        # --download that fails is the error, not a quiet fallback
        d, t = resolve_pair(target_key, drafter_dir, target_dir, download, configs_only=not (check_values or download))
        report = inspect_pair(d, t, check_values=check_values)
        report["drafter_dir"] = str(d.resolve())
        report["target_dir"] = str(t.resolve())
    if as_json:
        click.echo(json.dumps(public(report), indent=2))
    else:
        click.echo(render(report))
    if not report["ok"]:
        sys.exit(1)


def _set_threads(threads) -> None:
    """``--threads`` of run / generate: checked (1 to the CPUs this process may use), then torch's intra-op count."""
    from .cpu_threads import check_threads

    if check_threads(threads) is not None:
        import torch

        torch.set_num_threads(threads)


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
@click.option("--threads", type=int, default=None,
              help="torch's CPU threads for the reference [default: torch's, one per core]; fewer "
                   "where other work shares the cores.")
@_chat_options
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def generate_cmd(target_key, drafter_dir, target_dir, download, prompt_ids, prompt, temperature, selector,
                 max_new_tokens, seed, block_size, top_k, threads, chat, enable_thinking, as_json) -> None:
    """Speculative decoding with the PyTorch reference; prints output and acceptance statistics."""
    from .reference.generate import render_generation, run_generate
    from .tokenizer import chat_format

    chat = chat_format(chat, enable_thinking)
    _set_threads(threads)
    d, t = resolve_pair(target_key, drafter_dir, target_dir, download)
    report = run_generate(d, t, prompt_ids=prompt_ids, prompt=prompt, temperature=temperature,
                          selector=selector, max_new_tokens=max_new_tokens, seed=seed,
                          block_size=block_size, top_k=top_k, chat=chat)
    click.echo(json.dumps(report, indent=2) if as_json else render_generation(report))


@main.command("convert")
@_pair_options
@click.option("--output", required=True, type=click.Path(), help="Checkpoint directory to create.")
@click.option("--tp-size", default=1, show_default=True, type=click.Choice(["1", "2", "4", "8"]),
              help="Tensor-parallel ranks (one rank{N}.safetensors each).")
@click.option("--pp-size", default=1, show_default=True, type=click.Choice(["1"]), help="Pipeline stages (1 only).")
@click.option("--dtype", type=click.Choice(["bfloat16", "float16", "float32"]), default=None,
              help="Cast weights to this dtype (default: the checkpoints' own).")
@click.option("--force", is_flag=True, help=FORCE_HELP)
def convert_cmd(target_key, drafter_dir, target_dir, download, output, tp_size, pp_size, dtype, force) -> None:
    """Convert a DFlash2 drafter + its target into one TensorRT-LLM checkpoint (TP-sharded)."""
    from .convert import convert_pair

    d, t = resolve_pair(target_key, drafter_dir, target_dir, download)
    res = convert_pair(d, t, output, tp_size=int(tp_size), dtype=dtype, force=force)
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
@click.option("--force", is_flag=True, help=FORCE_HELP)
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
@_chat_options
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def analyze_cmd(target_key, drafter_dir, target_dir, download, prompts_file, block_size, top_k, max_new_tokens,
                max_prompts, no_measure, temperature, chat, enable_thinking, as_json) -> None:
    """Recall@k per draft position, implied vs measured acceptance (top-1, selector, oracle)."""
    from .analyze import analyze_pair, parse_top_k, render
    from .tokenizer import chat_format

    chat = chat_format(chat, enable_thinking)
    d, t = resolve_pair(target_key, drafter_dir, target_dir, download)
    report = analyze_pair(d, t, prompts_file=prompts_file, block_size=block_size, top_k=parse_top_k(top_k),
                          max_new_tokens=max_new_tokens, max_prompts=max_prompts, measure=not no_measure,
                          temperature=temperature, chat=chat)
    click.echo(json.dumps(report, indent=2) if as_json else render(report))


@main.command("build")
@_pair_options
@click.option("--output", type=click.Path(), default=None, help="Engine directory to create (optional with --dry-run).")
@click.option("--backend", type=click.Choice(["auto", "cpu", "cuda", "trtllm"]), default="auto", show_default=True,
              help="cpu: the network run by the torch stand-in on the CPU; cuda: the same on a GPU with the plugins' "
                   "CUDA kernels (not a TensorRT engine); trtllm: TensorRT-LLM engines (auto: trtllm where it "
                   "imports, else cuda where torch sees a GPU, else cpu; a dry run plans trtllm unless "
                   "$DFLASH2_TRT_BACKEND names a backend).")
@click.option("--tp-size", default=None, type=click.Choice(["1", "2", "4", "8"]),
              help="Tensor-parallel ranks (the CPU backend simulates them) [default: build config].")
@click.option("--dtype", type=click.Choice(["bfloat16", "float16", "float32"]), default=None,
              help="Weights and KV cache dtype [default: build config, else the checkpoints' own].")
@click.option("--block-size", type=int, default=None, help="Draft block size (K + 1) [default: the build config's].")
@click.option("--max-batch-size", type=int, default=None, help="Requests per engine step [default: build config].")
@click.option("--max-input-len", type=int, default=None, help="Longest prompt [default: build config].")
@click.option("--max-seq-len", type=int, default=None, help="Prompt + output [default: build config].")
@click.option("--max-num-tokens", type=int, default=None,
              help="Tokens per engine step: generation tokens and prompt chunks (a prompt that does not fit what a "
                   "step has left is taken in chunks) [default: build config].")
@click.option("--tokens-per-block", type=int, default=None, help="KV cache tokens per block [default: build config].")
@click.option("--selector", type=click.Choice(["greedy", "viterbi"]), default=None,
              help="Path selector (greedy = published: greedy at T=0, sampling at T>0) [default: build config].")
@click.option("--drafter-window", type=click.Choice(["model", "full"]), default=None,
              help="model: the drafter's own sliding window; full: full-context drafter attention [default: build "
                   "config].")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="Override any build-config key, validated like the YAML (repeatable), e.g. "
                   "--set kv_cache_free_gpu_mem_fraction=0.85 --set gpus=[sm_90a] --set sliding_path=generation "
                   "(the keys: dflash2_trt/config/build.py).")
@click.option("--dry-run", is_flag=True,
              help="Print the plan (steps, the trtllm-build command, GPU sizing, what is supported) and write nothing; "
                   "config-only directories are enough.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the plan (--dry-run) or the manifest (engine.json, with output_dir) as JSON.")
@click.option("--gpu-memory-gib", type=float, default=140.4, show_default=True,
              help="GPU memory the plan sizes the batch for, in GiB (H200: 140.4, its 143771 MiB).")
@click.option("--verify/--no-verify", default=None,
              help="Fixed prompts through the engine vs the target's greedy decoding; any difference fails the build "
                   "[default: on for small targets].")
@click.option("--checkpoint-dir", type=click.Path(file_okay=False), default=None,
              help="Keep the converted checkpoint here and reuse it when its manifest matches the sources (config, "
                   "safetensors headers, sizes and modification times) and its file hashes match "
                   "[trtllm default: "
                   "OUTPUT.checkpoint; cpu default: inside the engine only].")
@click.option("--reconvert", is_flag=True, help="Replace a --checkpoint-dir that does not match this build.")
@click.option("--no-keep-checkpoint", is_flag=True,
              help="trtllm: convert into a temporary directory that is removed after the build.")
@click.option("--force", is_flag=True, help=FORCE_HELP)
@click.option("--no-disk-check", is_flag=True,
              help="Build even when a file system it writes to seems to lack the room for the checkpoint and the "
                   "engines (checked before anything is converted; --dry-run shows it).")
@click.option("--baseline", is_flag=True,
              help="trtllm: also build the target alone into OUTPUT/baseline/ (a second trtllm-build from the same "
                   "checkpoint; the target's weights again on disk), the autoregressive baseline `bench run` compares "
                   "with on the project runtime.")
@click.option("--trtllm-python", type=click.Path(dir_okay=False), default=None, envvar="DFLASH2_TRTLLM_PYTHON",
              help="trtllm: the Python of an environment holding TensorRT-LLM 1.2 with its own pins (transformers "
                   "4.57) and this project (pip install --no-deps); trtllm-build and the engine side of the verify "
                   "gate run there, everything that reads the checkpoints through transformers here "
                   "(docs/trt-session.md §11) [env: DFLASH2_TRTLLM_PYTHON].")
def build_cmd(target_key, drafter_dir, target_dir, download, output, backend, tp_size, dtype, block_size,
              max_batch_size, max_input_len, max_seq_len, max_num_tokens, tokens_per_block, selector, drafter_window,
              sets, dry_run, as_json, gpu_memory_gib, verify, checkpoint_dir, reconvert, no_keep_checkpoint,
              force, no_disk_check, baseline, trtllm_python) -> None:
    """Build an engine directory (validate -> convert -> plugins -> engine -> verify), or plan one (--dry-run)."""
    from .config.build import parse_set
    from .engine.build import build_engine
    from .errors import ConfigError
    from .trtllm.backend import resolve

    overrides = {"block_size": block_size, "max_batch_size": max_batch_size, "max_input_len": max_input_len,
                 "max_seq_len": max_seq_len, "max_num_tokens": max_num_tokens, "tokens_per_block": tokens_per_block,
                 "selector": selector, "drafter_window": drafter_window, "dtype": dtype,
                 "tp_size": None if tp_size is None else int(tp_size)}
    sets = parse_set(sets)
    toolchain = None
    if trtllm_python:
        import os
        import shutil

        # engine.json and RUN.md name it: an absolute path (a bare name is looked up on PATH, as a shell would)
        trtllm_python = (os.path.abspath(os.path.expanduser(trtllm_python)) if os.sep in trtllm_python
                         else shutil.which(trtllm_python) or trtllm_python)
        given = click.get_current_context().get_parameter_source("trtllm_python") == \
            click.core.ParameterSource.COMMANDLINE
        if backend in ("cpu", "cuda"):
            if given:   # $DFLASH2_TRTLLM_PYTHON says where TensorRT-LLM is, for the builds that use it
                raise ConfigError(f"applies to --backend trtllm (TensorRT-LLM's interpreter), not {backend}",
                                  field="--trtllm-python")
        else:
            from .engine.trtllm.toolchain import probe_toolchain

            toolchain = probe_toolchain(trtllm_python)
            if backend == "auto" and not given and not dry_run and toolchain.tensorrt_llm is None:
                # only the environment names it (README's GPU setup exports it): --backend auto still means "trtllm
                # where it imports", so an interpreter without TensorRT-LLM leaves the choice to this machine (a dry
                # run plans the TensorRT-LLM build anyway, and names what that interpreter lacks)
                click.echo(f"note: $DFLASH2_TRTLLM_PYTHON ({trtllm_python}) has no TensorRT-LLM"
                           f"{f' ({toolchain.probe_error})' if toolchain.probe_error else ''}; --backend auto "
                           f"does not take it", err=True)
                toolchain = None
            else:
                backend = "trtllm"
    if backend == "cuda" and not dry_run:   # before a --download: a machine without a GPU refuses at once
        from .engine.standin.engine import engine_device

        engine_device("cuda")
    d, t = resolve_pair(target_key, drafter_dir, target_dir, download, configs_only=dry_run)
    if dry_run:
        from .checkpoint.writer import check_output_dir
        from .engine.build import check_build_outputs
        from .engine.plan import dry_run_plan, planned_backend, render_plan

        planned = planned_backend(backend)   # auto as the build resolves it ($DFLASH2_TRT_BACKEND), as the plan does
        check_build_outputs(d, t, output, checkpoint_dir=checkpoint_dir,   # what the real build would refuse
                            default_checkpoint=planned not in ("cpu", "cuda") and checkpoint_dir is None
                            and not no_keep_checkpoint)
        if output is not None:
            check_output_dir(output, force)   # a non-empty --output without --force, as the build would refuse it

        plan = dry_run_plan(d, t, output=output, backend=backend, target_key=target_key, overrides=overrides,
                            sets=sets, gpu_memory_gib=gpu_memory_gib, checkpoint_dir=checkpoint_dir,
                            keep_checkpoint=not no_keep_checkpoint, verify=verify, baseline=baseline,
                            reconvert=reconvert, toolchain=toolchain)
        click.echo(json.dumps(plan, indent=2) if as_json else render_plan(plan))
        return
    if output is None:
        raise ConfigError("required (only --dry-run goes without an output directory)", field="--output")
    from .engine.launch import several_processes

    launched = several_processes()
    if launched:   # every process would build the same --output (a cpu one converting first, refused only at verify)
        raise ConfigError(f"build runs as one process (trtllm-build starts its own workers, and a tp engine's verify "
                          f"gate its own ranks); this is one of {launched} processes an MPI launcher started: run it "
                          f"without mpirun")
    if click.get_current_context().get_parameter_source("gpu_memory_gib") == click.core.ParameterSource.COMMANDLINE:
        raise ConfigError("sizes the --dry-run plan only (a build takes its limits from the build config and the "
                          "options)", field="--gpu-memory-gib")
    backend = resolve(None if backend == "auto" else backend)
    progress = _build_progress(backend)
    from .engine.trtllm.process import BaselineBuildError

    try:
        res = build_engine(d, t, output, backend=backend,
                           target_key=target_key, force=force, command=sys.argv, overrides=overrides, sets=sets,
                           verify="auto" if verify is None else verify, checkpoint_dir=checkpoint_dir,
                           reconvert=reconvert, keep_checkpoint=not no_keep_checkpoint, progress=progress,
                           disk_check=not no_disk_check, baseline=baseline, toolchain=toolchain)
    except BaselineBuildError as exc:   # the combined engine is in place: say so, then fail on the baseline
        _report_build(exc.result, as_json)
        raise
    _report_build(res, as_json)


BUILD_HEARTBEAT_S = 300.0   # off a terminal: at most this long without a line while trtllm-build talks to its log


def _build_progress(backend: str):
    """What a build says on stderr as it goes. On a terminal: every step, and trtllm-build's own output. Elsewhere (a
    log file, a CI job, nohup) a TensorRT-LLM build, which takes minutes to hours, still says its steps, one line
    each (the ``[engine]`` line names the log that trtllm-build's own output goes to), and while trtllm-build runs,
    every :data:`BUILD_HEARTBEAT_S` its latest line; a cpu or cuda build stays quiet there."""
    if sys.stderr.isatty():
        return lambda line: click.echo(line, err=True)
    if backend != "trtllm":
        return None
    import time

    from .engine.trtllm.build import TRTLLM_BUILD_ECHO

    said = [time.monotonic()]

    def say(line: str) -> None:
        now = time.monotonic()
        if line.startswith(TRTLLM_BUILD_ECHO):
            if now - said[0] < BUILD_HEARTBEAT_S:
                return
            line = "  trtllm-build is running; its latest line: " + line[len(TRTLLM_BUILD_ECHO):][:300]
        said[0] = now
        click.echo(line, err=True)

    return say


def _report_build(res, as_json: bool) -> None:
    m = res.manifest
    for n in getattr(res, "notes", ()):   # on stderr, so --json's document stays whole
        click.echo(f"note: {n}", err=True)
    if as_json:   # engine.json's content, and where it is (the text's "wrote DIR")
        click.echo(json.dumps({"output_dir": str(res.output), **m}, indent=2))
        return
    v = m.get("verify")
    ties = (v or {}).get("ties") or []
    checked = (f"verified: {v['prompts']} prompts, {v['tokens']} tokens identical to the target's greedy decoding"
               + (f" but for {len(ties)} {m['dtype']} tie{'s' if len(ties) > 1 else ''} (engine.json verify.ties)"
                  if ties else "") if v else "not verified (--verify to check)")
    click.echo(f"wrote {res.output} ({m['backend']} engine, block {m['block_size']}, tp {m['tp_size']}, {m['dtype']}, "
               f"max batch {m['limits']['max_batch_size']}, {len(m['files'])} files; {checked})")
    lim = m.get("limits") or {}
    mnt, mil = lim.get("max_num_tokens"), lim.get("max_input_len")
    # a budget that leaves less than a chunk unit beside a full batch's generation: while the batch generates, a new
    # prompt that does not fit whole waits (chunks are cut at multiples of tokens_per_block): a new user measured
    # concurrency 4 running no faster than 1 with --max-num-tokens 32
    tpb, mbs, block = lim.get("tokens_per_block"), lim.get("max_batch_size"), m.get("block_size")
    if all(isinstance(v, int) for v in (mnt, tpb, mbs, block)) and mnt - mbs * block < tpb:
        click.echo(f"note: max_num_tokens {mnt} leaves {mnt - mbs * block} tokens beside a full batch's generation "
                   f"(max_batch_size {mbs} x block_size {block}), less than one prompt chunk (chunks are cut at "
                   f"multiples of tokens_per_block {tpb}): a new prompt that does not fit whole then waits until fewer "
                   f"requests generate; --max-num-tokens {mbs * block + tpb} or more lets one start beside a full "
                   f"batch", err=True)
    # the project runtime chunks a longer prompt (facts/context_chunking.yaml); TensorRT-LLM's C++ executor tools run
    # this project's engines with chunked context off (the Triton repository, trtllm-bench / gptManagerBenchmark runs)
    on_executor = m.get("backend") == "trtllm" and (m.get("runtime_path") or {}).get("path") == "executor"
    if on_executor and isinstance(mnt, int) and isinstance(mil, int) and mnt < mil:
        click.echo(f"note: max_num_tokens {mnt} < max_input_len {mil}: on TensorRT-LLM's C++ executor (this engine's "
                   f"runtime path) chunked context is off, so prompts over {mnt} tokens are refused there; the "
                   f"project runtime (`run --runtime project`) takes them in chunks, and --max-num-tokens {mil} serves "
                   f"every prompt on both", err=True)


class RequestsBar:
    """``run``'s progress: a tqdm bar of requests done on stderr, on a terminal only (tqdm's ``disable=None``; none
    in a log or beside ``--json`` piped elsewhere), made at the first report (the total is known then), gone when
    the run ends (``leave=False``). Called as ``progress(done, total)`` by the project runtime's ``generate`` (cpu and
    cuda engines, TensorRT engines on the project runtime; TensorRT-LLM's C++ runner reports none)."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.bar = None

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            from .bench.common import progress_bar

            self.bar = progress_bar(True, total, "run")
        self.bar.update(done - self.bar.n)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.close()


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
@click.option("--runtime", type=click.Choice(["auto", "project", "executor"]), default="auto", show_default=True,
              help="TensorRT-LLM engines: the project runtime over TensorRT or TensorRT-LLM's C++ executor [auto: the "
                   "engine's runtime path, as build --dry-run and engine.json say].")
@click.option("--cuda-graphs", is_flag=True,
              help="cuda engines, and TensorRT engines on the project runtime (tp 1): replay generation steps from "
                   "CUDA graphs, one per batch shape and 256-token key range (cuda engines: lossless on an H100 for "
                   "the tiny pairs; TensorRT engines: not yet run on a GPU; docs/gpu.md, docs/trt-session.md §9).")
@click.option("--threads", type=int, default=None,
              help="torch's CPU threads for CPU engines [default: torch's, one per core]; fewer "
                   "where other work shares the cores.")
@click.option("--no-progress", is_flag=True, help="No progress bar (on stderr, on a terminal only; the project runtime's: "
              "not with --runtime executor).")
@_chat_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def run_cmd(engine_dir, prompt_ids, prompt, prompts_file, max_new_tokens, temperature, seed, max_batch_size, verify,
            runtime, cuda_graphs, threads, no_progress, chat, enable_thinking, as_json) -> None:
    """Run prompts through an engine (the project runtime or TensorRT-LLM's executor: in-flight batching); prints
    tokens and acceptance. The project runtime takes a prompt that does not fit what an engine step has left of
    max_num_tokens in chunks ($DFLASH2_CHUNKED_CONTEXT=0: whole)."""
    from .engine.run import render, run_engine
    from .tokenizer import chat_format

    chat = chat_format(chat, enable_thinking)
    _set_threads(threads)
    # the outputs are printed when every prompt has finished: on a terminal a bar says how far it is (requests done)
    with RequestsBar(enabled=not no_progress) as bar:
        report = run_engine(engine_dir, prompt_ids=prompt_ids, prompt=prompt, prompts_file=prompts_file,
                            max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                            max_batch_size=max_batch_size, verify=verify, runtime=runtime, cuda_graphs=cuda_graphs,
                            progress=bar, chat=chat)
    click.echo(json.dumps(report, indent=2) if as_json else render(report))


# ---- bench ----------------------------------------------------------------------------------------
@main.group("bench")
def bench_group() -> None:
    """Datasets, throughput / latency / acceptance per concurrency, and a GPU projection."""


@bench_group.command("prepare-dataset")
@click.option("--output", required=True, help="JSON-lines dataset to write.")
@click.option("--builtin", type=click.Choice(list(tiny_targets())),
              help="A shipped prompt set: that tiny pair's prompts.")
@click.option("--prompts", "prompts_file",
              help="Prompts file: JSON list / {\"prompts\": [...]} / JSON lines of token-id lists or strings.")
@click.option("--corpus", help="UTF-8 text, one prompt per non-empty line.")
@click.option("--synthetic", type=click.Choice(["token-norm-dist", "token-unif-dist"]),
              help="Random token ids with normal / uniform input and output lengths.")
@click.option("--target", "target_key", help="Registered target (vocabulary, EOS, tokenizer).")
@click.option("--target-dir", type=click.Path(file_okay=False), help="Target directory (vocabulary, EOS, tokenizer).")
@click.option("--engine-dir", type=click.Path(file_okay=False), help="Engine directory (vocabulary, EOS, tokenizer).")
@click.option("--num-requests", type=int, help="Requests (prompt sources repeat or cut their prompts).")
@click.option("--output-tokens", type=int, default=64, show_default=True, help="output_tokens of prompt sources.")
@click.option("--max-input-len", type=int, help="Truncate prompts to this many tokens.")
@click.option("--seed", type=int, default=0, show_default=True, help="Synthetic datasets: same seed, same file.")
@click.option("--input-mean", type=int)
@click.option("--input-stdev", type=int)
@click.option("--output-mean", type=int)
@click.option("--output-stdev", type=int)
@click.option("--input-min", type=int)
@click.option("--input-max", type=int)
@click.option("--output-min", type=int)
@click.option("--output-max", type=int)
@_chat_options
@click.option("--force", is_flag=True, help="Replace an existing --output file.")
def bench_prepare_dataset_cmd(output, builtin, prompts_file, corpus, synthetic, target_key, target_dir, engine_dir,
                              num_requests, output_tokens, max_input_len, seed, chat, enable_thinking, force,
                              **lengths) -> None:
    """Write a dataset in trtllm-bench's format: {"task_id", "input_ids", "output_tokens"} per line."""
    from .bench.dataset import check_builtin_language, prepare_dataset, resolve_target
    from .errors import ConfigError
    from .overlap import refuse_overlap
    from .targets import get_target
    from .tokenizer import chat_format, chat_label

    chat = chat_format(chat, enable_thinking)
    sources = {"builtin": builtin, "prompts": prompts_file, "corpus": corpus, "synthetic": synthetic}
    chosen = [k for k, v in sources.items() if v is not None]
    if len(chosen) != 1:
        raise ConfigError("give exactly one source: --builtin, --prompts, --corpus or --synthetic")
    given = click.get_current_context().get_parameter_source
    if synthetic is not None and given("output_tokens") == click.core.ParameterSource.COMMANDLINE:
        raise ConfigError("applies to prompt sources; a synthetic dataset draws its output lengths (--output-mean "
                          "/ --output-min ...)", field="--output-tokens")
    if synthetic is None and given("seed") == click.core.ParameterSource.COMMANDLINE:
        raise ConfigError("applies to --synthetic datasets only (prompt sources are written in order)", field="--seed")
    if builtin is not None and target_key is None and target_dir is None and engine_dir is None:
        target_key = builtin
    if builtin is not None and target_key is not None and target_key not in tiny_targets():
        get_target(target_key)                                   # an unknown key: that error first
        check_builtin_language(builtin, None, f"--target {target_key}")   # before its checkpoint is looked for
    tgt = resolve_target(target_key=target_key, target_dir=target_dir, engine_dir=engine_dir)
    if builtin is not None:
        check_builtin_language(builtin, tgt, f"--target {target_key}" if target_key else
                               f"--target-dir {target_dir}" if target_dir else f"--engine-dir {engine_dir}")
    refuse_overlap(output, "--output", [("--prompts file", prompts_file), ("--corpus file", corpus),
                                        ("target directory", target_dir), ("engine directory", engine_dir),
                                        ("tokenizer directory", tgt["tokenizer_dir"])])
    res = prepare_dataset(source=synthetic or chosen[0], output=output, builtin=builtin, prompts_file=prompts_file,
                          corpus=corpus, tokenizer_dir=tgt["tokenizer_dir"], vocab_size=tgt["vocab_size"],
                          stop_ids=tgt["stop_ids"], num_requests=num_requests, output_tokens=output_tokens,
                          max_input_len=max_input_len, seed=seed, force=force, chat=chat, **lengths)
    click.echo(f"wrote {res['output']}: {res['requests']} requests ({res['source']}"
               f"{', ' + chat_label(chat.to_dict()) if chat is not None else ''}), mean input "
               f"{res['mean_input_len']:.1f} tokens, mean output {res['mean_output_tokens']:.1f} tokens")
    if tgt["input_limit"] is not None:   # written as asked, but said: `run` / `bench run` would refuse them
        limit, what = tgt["input_limit"]
        over = [n for n in res["input_lens"] if n > limit]
        if over:
            fix = ("shorten them (--max-input-len would cut off the assistant's turn the chat template opens)"
                   if chat is not None else f"--max-input-len {limit} cuts them")
            click.echo(f"note: {len(over)} of {res['requests']} prompts are longer than {what} {limit} (the longest: "
                       f"{max(over)} tokens), which refuses them; {fix}", err=True)


@bench_group.command("run")
@click.option("--engine-dir", required=True, type=click.Path(), help="Engine directory from `dflash2-trt build`.")
@click.option("--dataset", required=True, help="trtllm-bench JSON-lines dataset (text lines are encoded as they are: "
              "for chat prompts write the rendered ids with bench prepare-dataset --chat).")
@click.option("--concurrency", default="1,4,16", show_default=True, help="Requests kept in flight, comma-separated.")
@click.option("--num-requests", type=int, help="Use the dataset's first N lines [default: all].")
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy.")
@click.option("--seed", type=int, default=0, show_default=True, help="Request i uses seed + i.")
@click.option("--max-new-tokens", type=int, default=64, show_default=True, help="For lines without output_tokens.")
@click.option("--ignore-eos", is_flag=True, help="Do not stop at the target's EOS (every request runs its length).")
@click.option("--no-baseline", is_flag=True, help="Skip the autoregressive runs.")
@click.option("--backend", type=click.Choice(["auto", "cpu", "cuda", "trtllm"]), default="auto", show_default=True,
              help="Refuse an engine of another backend than this one.")
@click.option("--json", "json_out", help="Write the report (JSON) here.")
@click.option("--plot", "plot_out", help="Write a PNG: acceptance by position, "
              "speedup against concurrency.")
@click.option("--project", "project_gpus", help="Add a roofline projection for these GPUs (h200,h100,b200).")
@click.option("--project-target", default=None,
              help="With --project: published model shapes the projection uses [default: qwen3.8-27b].")
@click.option("--context-len", type=int, help="Projection's context length [default: mean prompt + half the output, "
              "at most the target's max_position_embeddings].")
@click.option("--save-outputs", is_flag=True, help="Keep every request's output ids in the JSON report.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@click.option("--threads", type=int, default=1, show_default=True,
              help="CPU engines: torch threads while measuring (at most the CPU cores available).")
@click.option("--baseline-engine-dir", type=click.Path(file_okay=False),
              help="TensorRT-LLM engines on the executor path: a stock TensorRT-LLM target engine for the "
              "autoregressive runs (not build --baseline's baseline/, which --runtime project runs).")
@click.option("--benchmark-bin",
              help="TensorRT-LLM engines, --tool gptmanager: gptManagerBenchmark [default: on PATH].")
@click.option("--plugin-lib",
              help="TensorRT-LLM engines: libdflash2_plugins.so to LD_PRELOAD [default: the engine's].")
@click.option("--tool", type=click.Choice(["trtllm-bench", "gptmanager"]), default=None,
              help="TensorRT-LLM engines: trtllm-bench (through python -m dflash2_trt.bench.trtllm_bench) or "
                   "gptManagerBenchmark [default: trtllm-bench].")
@click.option("--dry-run", is_flag=True, help="TensorRT-LLM engines: print the benchmark commands, run nothing.")
@click.option("--runtime", type=click.Choice(["auto", "project", "executor"]), default="auto", show_default=True,
              help="TensorRT-LLM engines: the project runtime over TensorRT, or the executor's tools (--tool) [auto: "
                   "the engine's runtime path].")
@click.option("--cuda-graphs", is_flag=True,
              help="cuda engines (both modes), and TensorRT engines on the project runtime: replay generation steps "
                   "from CUDA graphs, as run --cuda-graphs (bench run with graphs: not yet run on a GPU; docs/benchmarks.md).")
def bench_run_cmd(engine_dir, dataset, concurrency, num_requests, temperature, seed, max_new_tokens, ignore_eos,
                  no_baseline, backend, json_out, plot_out, project_gpus, project_target, context_len, save_outputs,
                  no_progress, threads, baseline_engine_dir, benchmark_bin, plugin_lib, tool, dry_run,
                  runtime, cuda_graphs) -> None:
    """Throughput, latency, TTFT and acceptance per concurrency, speculative vs autoregressive."""
    from .bench.report import render
    from .bench.run import bench_run
    from .errors import ConfigError

    if save_outputs and json_out is None:   # options are checked, not ignored: the outputs go in the JSON report only
        raise ConfigError("keeps every request's output ids in the JSON report: give --json PATH too",
                          field="--save-outputs")
    report = bench_run(engine_dir, dataset, backend=backend, concurrency=concurrency, num_requests=num_requests,
                       temperature=temperature, seed=seed, max_new_tokens=max_new_tokens, stop_on_eos=not ignore_eos,
                       baseline=not no_baseline, json_out=json_out, plot_out=plot_out, project_gpus=project_gpus,
                       project_target=project_target, context_len=context_len, progress=not no_progress,
                       keep_outputs=save_outputs, baseline_engine_dir=baseline_engine_dir,
                       benchmark_bin=benchmark_bin, plugin_lib=plugin_lib, dry_run=dry_run, threads=threads,
                       tool=tool, runtime=runtime, cuda_graphs=cuda_graphs)
    if dry_run:
        import shlex

        for what in report.get("writes", []):
            click.echo(f"# writes {what}")
        for what in report.get("notes", []):
            click.echo(f"# note: {what}")
        for line in report.get("command_lines") or [shlex.join(cmd) for cmd in report.get("commands", [])]:
            click.echo(line)
        return
    plot_error = report.pop("plot_error", None)
    click.echo(render(report))
    for p, what in ((json_out, "report"), (None if plot_error else plot_out, "plot")):
        if p is not None:
            click.echo(f"wrote {what} {p}")
    from .errors import DFlash2Error

    if report.get("baseline_error"):   # the speculative runs are reported above; the command still failed
        raise DFlash2Error(f"the baseline engine failed after the speculative runs: {report['baseline_error']}")
    if plot_error:                     # the table above and the report are complete
        raise DFlash2Error(f"{plot_error} (the measurement is complete: its table is above"
                           + (f", its report in {json_out})" if json_out is not None else ")"))


@bench_group.command("serve")
@click.option("--base-url", default="http://127.0.0.1:8000", show_default=True,
              help="The OpenAI-compatible server (serve --openai-port, vllm serve, trtllm-serve), with or without /v1.")
@click.option("--dataset", required=True, type=click.Path(dir_okay=False),
              help="trtllm-bench JSON-lines dataset: prompt lines are sent as their text, input_ids lines as the text "
                   "--tokenizer decodes them to.")
@click.option("--concurrency", default="1,4,16", show_default=True,
              help="Requests kept in flight (client threads), comma-separated: one level each.")
@click.option("--model", help="The model name the requests carry [default: the one the server lists].")
@click.option("--chat", is_flag=True, help="POST /v1/chat/completions, the prompt as the user's message (the server "
                                           "renders its chat template), not /v1/completions.")
@click.option("--num-requests", type=click.IntRange(min=1), default=None,
              help="Use the dataset's first N lines [default: all].")
@click.option("--request-rate", type=float, default=float("inf"), show_default=True,
              help="Requests per second, due at seeded Poisson times (inf: every request due at once).")
@click.option("--burstiness", type=float, default=1.0, show_default=True,
              help="With --request-rate: the gamma shape of the gaps (1: Poisson; below 1 burstier).")
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="Request i sends seed + i.")
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=64, show_default=True,
              help="For lines without output_tokens.")
@click.option("--ignore-eos", is_flag=True, help="Send ignore_eos (every request runs its length; vLLM's field too).")
@click.option("--tokenizer", "tokenizer_dir", type=click.Path(file_okay=False),
              help="Decodes input_ids lines to text [default: --engine-dir's tokenizer].")
@click.option("--engine-dir", type=click.Path(file_okay=False),
              help="The engine the server serves: its tokenizer decodes input_ids lines.")
@click.option("--api-key", envvar="OPENAI_API_KEY", help="Sent as a bearer token [default: $OPENAI_API_KEY]; never "
                                                        "written to the report.")
@click.option("--timeout", type=float, default=600.0, show_default=True,
              help="Seconds the client waits for the server's next bytes before it counts a request failed.")
@click.option("--no-usage-per-event", is_flag=True,
              help="Do not ask stream_options.continuous_usage_stats (OpenAI's own API refuses it): tokens are counted "
                   "at each stream's end, tok/event is not known.")
@click.option("--baseline-url", help="A second server loaded the same way after each level (e.g. serve --target-only: "
                                     "the target alone): its row, the speedup and (T = 0) identical outputs.")
@click.option("--baseline-model", help="The baseline server's model name [default: the one it lists].")
@click.option("--goodput", multiple=True, metavar="KEY:MS[,KEY:MS]",
              help="Service-level objectives (vLLM's: ttft, tpot, e2el, in ms; repeat or join with commas): each "
                   "level also counts the requests that meet all of them, and those per second.")
@click.option("--json", "json_out", help="Write the report (JSON) here.")
@click.option("--save-outputs", is_flag=True, help="Keep every request's text in the JSON report.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
def bench_serve_cmd(base_url, dataset, concurrency, model, chat, num_requests, request_rate, burstiness, temperature,
                    seed, max_new_tokens, ignore_eos, tokenizer_dir, engine_dir, api_key, timeout, no_usage_per_event,
                    baseline_url, baseline_model, goodput, json_out, save_outputs, no_progress) -> None:
    """Load a running OpenAI-compatible server and time it on the client: TTFT, ITL, latency, throughput and tokens
    per streamed event per concurrency (vllm bench serve's figures, for this project's serve and any other)."""
    from .bench.io import atomic_write_json, check_output_file
    from .bench.serve import ServeBenchError, bench_serve, failures, render_head, render_level
    from .errors import ConfigError
    from .overlap import refuse_overlap

    if save_outputs and json_out is None:
        raise ConfigError("keeps every request's text in the JSON report: give --json PATH too", field="--save-outputs")
    if json_out is not None:
        refuse_overlap(json_out, "--json", [("dataset", dataset), ("--tokenizer", tokenizer_dir),
                                            ("engine directory", engine_dir)], force=False)
        check_output_file(json_out, field="--json", replaces="serve")
    if tokenizer_dir is None and engine_dir is not None:
        from .bench.dataset import prompt_tokenizer_dir
        from .engine.format import load_engine_dir

        _, man = load_engine_dir(engine_dir)
        tokenizer_dir = prompt_tokenizer_dir(engine_dir, man)
    doc = bench_serve(base_url=base_url, dataset=dataset, concurrency=concurrency, model=model, chat=chat,
                      num_requests=num_requests, temperature=temperature, seed=seed, max_new_tokens=max_new_tokens,
                      ignore_eos=ignore_eos, request_rate=request_rate, burstiness=burstiness,
                      tokenizer_dir=tokenizer_dir, api_key=api_key, timeout=timeout, keep_outputs=save_outputs,
                      baseline_url=baseline_url, baseline_model=baseline_model, progress=not no_progress,
                      usage_per_event=not no_usage_per_event, goodput=goodput,
                      on_start=lambda d: click.echo(render_head(d)),
                      on_level=lambda lv, part: click.echo(render_level(lv, part)))
    if json_out is not None:
        atomic_write_json(json_out, doc)
        click.echo(f"wrote report {json_out}")
    bad = failures(doc)
    if bad is not None:   # the figures above and the report count the completed requests only
        raise ServeBenchError(bad)


@bench_group.command("steps")
@click.option("--target", "target_key", default="qwen3.8-27b", show_default=True,
              help="Registered target: its published configs give the widths (random weights, nothing downloaded).")
@click.option("--backend", type=click.Choice(["cuda", "cpu"]), default="cuda", show_default=True,
              help="cuda: on the GPU with the plugins' CUDA kernels; cpu: on the CPU (tiny targets).")
@click.option("--concurrency", default="1,4,16,32,64", show_default=True, help="Requests per step, comma-separated.")
@click.option("--context-len", type=int, default=None,
              help="Committed tokens per request [default: 1024, or the most the target takes if fewer].")
@click.option("--steps", type=int, default=10, show_default=True, help="Timed steps per point.")
@click.option("--acceptance", type=float, default=None,
              help="Mean tokens per speculative step for the speedup column [default: the article's for the target].")
@click.option("--no-cuda-graph", "no_graph", is_flag=True,
              help="Do not also time each step as a CUDA-graph replay (cuda backend).")
@click.option("--json", "json_out", help="Write the report (JSON) here.")
def bench_steps_cmd(target_key, backend, concurrency, context_len, steps, acceptance, no_graph, json_out) -> None:
    """Time one engine step at a target's real widths with random weights: speculative vs target-only, per
    component (not a TensorRT engine: the torch stand-in, see the report's notes)."""
    from .bench.io import atomic_write_json, check_output_file
    from .bench.steps import measure_steps, render
    from .errors import ConfigError

    if json_out is not None:
        check_output_file(json_out, field="--json", replaces="steps")
    if steps < 1:
        raise ConfigError(f"must be >= 1, got {steps}", field="--steps")
    progress = (lambda line: click.echo(line, err=True)) if sys.stderr.isatty() else None
    doc = measure_steps(target_key, backend=backend, concurrency=concurrency, context_len=context_len, steps=steps,
                        acceptance=acceptance, progress=progress, graph=not no_graph)
    click.echo(render(doc))
    if json_out is not None:
        atomic_write_json(json_out, doc)
        click.echo(f"wrote {json_out}")


@bench_group.command("project")
@click.option("--target", "target_key", default=None,
              help="Registered target whose published shapes (target + drafter config.json) are used [default: "
                   "qwen3.8-27b; with --costs-from: the report's].")
@click.option("--gpu", "gpus", default=None,
              help="GPUs: h200, h100, b200 (comma-separated; not with --costs-from) [default: h200].")
@click.option("--concurrency", default=None,
              help="Comma-separated [default: 1,4,16,32; with --costs-from: every concurrency the report measured].")
@click.option("--context-len", type=int, default=None,
              help="Tokens of context per request [default: 1024, or the target's max_position_embeddings if fewer].")
@click.option("--acceptance", type=float, help="Acceptance length: mean tokens accepted per speculative step (e.g. 4.80).")
@click.option("--acceptance-from",
              help="A `bench run --json` report: its measured acceptance histogram.")
@click.option("--bandwidth-efficiency", type=float, default=1.0, show_default=True,
              help="Achieved share of the data-sheet bandwidth.")
@click.option("--compute-efficiency", type=float, default=1.0, show_default=True,
              help="Achieved share of the data-sheet bf16 tensor throughput.")
@click.option("--step-overhead-ms", type=float, default=0.0, show_default=True, help="Fixed cost per decode step.")
@click.option("--recurrent-verify", type=click.Choice(["replay", "intermediate"]), default=None,
              help="Hybrid targets: how a verify pass keeps the recurrent state (replay the accepted tokens, or store "
                   "the state after every draft position) [default: replay].")
@click.option("--json", "json_out", help="Write the projection (JSON) here.")
@click.option("--costs-from", help="A `bench steps --json` report: take the step times measured there instead of the "
                                   "roofline model's (the output says which it used).")
@click.option("--cost-basis", type=click.Choice(["busy", "wall", "graph"]), default=None,
              help="With --costs-from: the steps' kernel time (busy), their whole wall time, or their CUDA-graph "
                   "replay time [default: busy; wall for a cpu backend's report].")
def bench_project_cmd(target_key, gpus, concurrency, context_len, acceptance, acceptance_from, bandwidth_efficiency,
                      compute_efficiency, step_overhead_ms, recurrent_verify, json_out, costs_from, cost_basis) -> None:
    """The speedup over autoregressive decoding on a GPU: a roofline model, or measured step costs (--costs-from)."""
    from .bench.projection import render
    from .bench.run import bench_project

    doc = bench_project(target=target_key, gpus=gpus, concurrency=concurrency, context_len=context_len,
                        acceptance=acceptance, acceptance_from=acceptance_from,
                        bandwidth_efficiency=bandwidth_efficiency, compute_efficiency=compute_efficiency,
                        step_overhead_ms=step_overhead_ms, recurrent_verify=recurrent_verify, json_out=json_out,
                        costs_from=costs_from, cost_basis=cost_basis)
    click.echo(render(doc))
    if json_out is not None:
        click.echo(f"wrote {json_out}")


@main.group("deploy")
def deploy_group() -> None:
    """Serving deployments of an engine directory."""


@deploy_group.command("triton")
@click.option("--engine-dir", required=True, type=click.Path(), help="Engine directory from `dflash2-trt build`.")
@click.option("--output", required=True, type=click.Path(), help="Model repository to create.")
@click.option("--model-name", default=None, help="Name of the text entry point (ensemble) [default: ensemble].")
@click.option("--max-batch-size", type=int, default=None, help="Triton max_batch_size [default: the engine's].")
@click.option("--decoupled", is_flag=True, help="Decoupled tensorrt_llm model: streaming, one response per step.")
@click.option("--tokenizer", type=click.Path(), default=None,
              help="Tokenizer directory [default: the engine's tokenizer/, else its target directory].")
@click.option("--ids-only", is_flag=True,
              help="No tokenizer: write the tensorrt_llm model alone (token ids); not with --tokenizer / --model-name.")
@click.option("--backend", type=click.Choice(["auto", "python", "tensorrtllm"]), default="auto", show_default=True,
              help="Who serves tensorrt_llm (auto: the python model on the project runtime for a CPU or cuda engine "
                   "and for a TensorRT-LLM engine on the project runtime path, tensorrtllm for the rest).")
@click.option("--kv-cache-free-gpu-mem-fraction", type=float, default=None,
              help="GPU engines (TensorRT-LLM, cuda) only: GPU memory fraction for the KV cache [default: the build's, "
                   "else 0.9].")
@click.option("--plugin-lib", type=click.Path(), default=None,
              help="tensorrtllm backend only: libdflash2_plugins.so for launch.sh's LD_PRELOAD [default: the engine's].")
@click.option("--cuda-graphs", is_flag=True,
              help="python backend, cuda engines and TensorRT engines on the project runtime: the model replays "
                   "generation steps from CUDA graphs (parameter cuda_graph_mode; experimental, not yet run on a GPU).")
@click.option("--target-only", is_flag=True,
              help="python backend: serve the target alone (the autoregressive baseline bench run measures; a TensorRT "
                   "engine's baseline/), to compare with the combined engine's server (bench serve --baseline-url).")
@click.option("--force", is_flag=True, help=FORCE_HELP)
def deploy_triton_cmd(engine_dir, output, model_name, max_batch_size, decoupled, tokenizer, ids_only, backend,
                      kv_cache_free_gpu_mem_fraction, plugin_lib, cuda_graphs, target_only, force) -> None:
    """Write a Triton model repository (preprocessing, tensorrt_llm, postprocessing, ensemble)."""
    from .deploy.triton.repository import deploy_triton

    res = deploy_triton(engine_dir, output, model_name=model_name, max_batch_size=max_batch_size, decoupled=decoupled,
                        tokenizer=tokenizer, ids_only=ids_only, backend=backend, force=force,
                        kv_cache_free_gpu_mem_fraction=kv_cache_free_gpu_mem_fraction, plugin_lib=plugin_lib,
                        cuda_graphs=cuda_graphs, target_only=target_only, command=sys.argv)
    for note in res.notes:
        click.echo(f"note: {note}", err=True)
    click.echo(f"wrote {res.output} ({res.backend} backend, {'decoupled' if res.decoupled else 'not decoupled'}, "
               f"max batch {res.max_batch_size}; models: {', '.join(res.models)}; runtime: {res.runtime})")


@main.command("serve")
@click.option("--engine-dir", type=click.Path(), default=None, help="Engine directory (a repository is generated).")
@click.option("--repository", type=click.Path(), default=None, help="An existing repository from `deploy triton`.")
@click.option("--port", type=int, default=8000, show_default=True, help="Base port: HTTP P, gRPC P+1, metrics P+2.")
@click.option("--http-port", type=int, default=None, help="HTTP port [default: --port].")
@click.option("--grpc-port", type=int, default=None, help="gRPC port [default: --port + 1].")
@click.option("--metrics-port", type=int, default=None, help="Metrics port [default: --port + 2].")
@click.option("--max-batch-size", type=int, default=None, help="Triton max_batch_size [default: the engine's].")
@click.option("--no-decoupled", is_flag=True, help="Serve without streaming (HTTP /infer works on tensorrt_llm).")
@click.option("--tokenizer", type=click.Path(), default=None, help="Tokenizer directory [default: the engine's].")
@click.option("--ids-only", is_flag=True, help="No tokenizer: serve the tensorrt_llm model alone.")
@click.option("--log", "log_path", type=click.Path(), default=None, help="Write tritonserver's log here.")
@click.option("--ready-timeout", type=float, default=None,
              help="Seconds to wait for readiness, with a progress line on stderr every 15 s [default: 900 for a "
                   "TensorRT-LLM or cuda engine, which can load for minutes; else 120].")
@click.option("--drain-timeout", type=float, default=10.0, show_default=True,
              help="On Ctrl-C / SIGTERM: seconds the requests in flight get to finish (no new ones are taken); "
                   "any still running then ends with an error response.")
@click.option("--cuda-graphs", is_flag=True,
              help="--engine-dir, cuda engines and TensorRT engines on the project runtime: replay generation steps "
                   "from CUDA graphs (as deploy triton --cuda-graphs; experimental, not yet run on a GPU).")
@click.option("--openai-port", type=int, default=None,
              help="Also serve an OpenAI-compatible API here (/v1/models, /v1/completions, /v1/chat/completions, "
                   "streamed or not) in front of the ensemble [default: none].")
@click.option("--served-model-name", default=None,
              help="With --openai-port: the model id clients name [default: the engine directory's name].")
@click.option("--target-only", is_flag=True,
              help="--engine-dir: serve the target alone (the autoregressive baseline; a TensorRT engine's "
                   "baseline/), to compare with the combined engine's server (bench serve --baseline-url).")
@click.option("--kv-cache-free-gpu-mem-fraction", type=float, default=None,
              help="--engine-dir, GPU engines (TensorRT-LLM, cuda): the share of the free GPU memory the KV pool takes "
                   "(as deploy triton's; trtllm-serve's --kv_cache_free_gpu_memory_fraction) [default: the build's, "
                   "else 0.9].")
def serve_cmd(engine_dir, repository, port, http_port, grpc_port, metrics_port, max_batch_size, no_decoupled,
              tokenizer, ids_only, log_path, ready_timeout, drain_timeout, cuda_graphs, openai_port,
              served_model_name, target_only, kv_cache_free_gpu_mem_fraction) -> None:
    """Start the bundled tritonserver on 127.0.0.1 for an engine (Ctrl-C stops it)."""
    from .deploy.triton.server import serve

    sys.exit(serve(engine_dir=engine_dir, repository=repository, port=port, http_port=http_port, grpc_port=grpc_port,
                   metrics_port=metrics_port, max_batch_size=max_batch_size, decoupled=not no_decoupled,
                   tokenizer=tokenizer, ids_only=ids_only, log_path=log_path, ready_timeout=ready_timeout,
                   drain_timeout=drain_timeout, cuda_graphs=cuda_graphs, openai_port=openai_port,
                   served_model_name=served_model_name, target_only=target_only,
                   kv_cache_free_gpu_mem_fraction=kv_cache_free_gpu_mem_fraction,
                   echo=lambda m: click.echo(m, err=False)))

if __name__ == "__main__":  # pragma: no cover
    main()
