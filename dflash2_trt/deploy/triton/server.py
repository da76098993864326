"""The tritonserver bundled with nvidia-pytriton, started on 127.0.0.1 and always stopped.

nvidia-pytriton ships Triton Inference Server (``pytriton/tritonserver/bin/tritonserver``), the
python backend, one python-backend stub per Python version and the libraries they need
(``nvidia_pytriton.libs``). :class:`TritonServer` assembles a backend directory (the python backend +
the stub of THIS interpreter), puts the interpreter's ``bin`` first on PATH (the stub finds the
environment, and so numpy/torch/dflash2_trt, through it), binds every endpoint to 127.0.0.1, and
waits for readiness while watching the process: a server that exits or never gets ready is a
:class:`ServerError` carrying the tail of its log.

Stopping: a drain file first (the python model takes no new request and ends any still running after the drain
timeout with an error response: ``serving.py``), SIGTERM to the server (it rejects new requests, waits for
those in flight up to its exit timeout, a few seconds past the drain's, unloads its models, the stubs exit),
then SIGKILL to its whole process group after a grace period, so no stub is left behind, and the python backend's
``/dev/shm`` regions its processes mapped are unlinked. The server runs in its own session with
``PR_SET_PDEATHSIG`` (Linux): if the starting process dies, the server gets SIGTERM too; the stubs
ignore SIGTERM, so a watchdog process (:mod:`.hygiene`) stops the whole group, unlinks the regions and
removes the working directories when the starting process is gone, SIGKILL included. What a run killed
together with its watchdog left is cleaned (and named) by the next ``serve``.
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from ...children import die_with_parent, proc_cmdline, proc_stat, process_tree
from ...engine.format import engine_backend
from ...errors import (ConfigError, DFlash2Error, MissingDependencyError, clear_stop_requests, committed_outputs,
                       raise_if_stop_requested, raise_stop)
from . import hygiene
from .repository import TRITON_EXTRA, refuse_spaced_python_models
from .serving import DRAIN_ENV, request_drain

HOST = "127.0.0.1"
# tritonserver's own log lines of a model's load (model_lifecycle.cc): "loading: NAME:V", "successfully loaded
# 'NAME'", "failed to load 'NAME' version V: ..."; anchored at the source file, so that a model's own log line
# ("tokenizer: failed to load 'x'") is not taken for one
_LOG_STATE = re.compile(r"model_lifecycle\.cc:\d+\] \"(?:loading: (?P<loading>[^\"]+?):\d+\"|successfully loaded "
                        r"'(?P<loaded>[^']+)'|failed to load '(?P<failed>[^']+)')")


# the python backend's stub process (its /proc comm: the name cut to 15 characters)
STUB_NAME = "triton_python_backend_stub"


STUB_ZOMBIE_S = 1.0      # a stub a zombie this long is dead, not being reaped


@dataclass
class TreeProcess:
    """What :meth:`TritonServer.dead_stub` reads of one process below the server (/proc/PID/stat, comm, cmdline)."""
    pid: int
    start: str                 # stat field 22: with the pid, one process (pids are reused)
    state: str
    comm: str
    parent_comm: str
    cmdline: list[str]         # empty for a zombie
    status: int | None         # stat field 52 (exit_code, Linux 3.5+): as waitpid reports it; a zombie's only


def tree_processes(root: int) -> list[TreeProcess]:
    """The processes below ``root`` (/proc; nothing elsewhere)."""
    def comm(pid) -> str:
        try:
            return Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            return ""

    out = []
    for pid in process_tree(root)[1:]:
        st = proc_stat(pid)
        if st is None or len(st) < 20:
            continue
        name = comm(pid)
        status = int(st[49]) if len(st) >= 50 and st[49].lstrip("-").isdigit() else None
        out.append(TreeProcess(pid, st[19], st[0], name, comm(st[1]),
                               proc_cmdline(pid) if st[0] != "Z" and name == STUB_NAME[:15] else [], status))
    return out


def wait_status_words(status: int | None) -> str:
    """A wait status (waitpid's) in words: "exited with status N", "was killed by SIGNAME" (+ core dumped)."""
    if status is None:
        return "ended"
    sig = status & 0x7F
    if not sig:
        return f"exited with status {(status >> 8) & 0xFF}"
    try:
        how = f"was killed by {signal.Signals(sig).name}"
    except ValueError:
        how = f"was killed by signal {sig}"
    if status & 0x80:
        how += " (core dumped)"
    if sig == signal.SIGKILL:
        how += " (the out-of-memory killer?)"
    return how


class ServerError(DFlash2Error):
    """tritonserver could not be started (occupied port, exited, not ready in time)."""


@dataclass(frozen=True)
class TritonInstall:
    binary: Path
    python_backend: Path
    stub: Path
    libs: Path


def find_tritonserver() -> TritonInstall:
    """The pieces of the nvidia-pytriton install this interpreter can use."""
    try:
        import pytriton
    except ImportError:
        raise MissingDependencyError(f"tritonserver is not installed: {TRITON_EXTRA}") from None
    root = Path(pytriton.__file__).resolve().parent / "tritonserver"
    ver = f"{sys.version_info.major}.{sys.version_info.minor}"
    inst = TritonInstall(root / "bin" / "tritonserver", root / "backends" / "python",
                         root / "python_backend_stubs" / ver / "triton_python_backend_stub",
                         root.parent.parent / "nvidia_pytriton.libs")
    for what, p in (("tritonserver binary", inst.binary), ("python backend", inst.python_backend / "libtriton_python.so"),
                    (f"python-backend stub for Python {ver}", inst.stub), ("server libraries", inst.libs)):
        if not p.exists():
            raise MissingDependencyError(f"nvidia-pytriton install is incomplete: no {what} at {p}")
    return inst


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def check_port_free(port: int, what: str) -> None:
    if not 1 <= port <= 65535:
        raise ServerError(f"{what}: port {port} is not in [1, 65535]")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # as a server binds: a port whose last connections are in TIME_WAIT is free, a listener is not
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError as exc:
            raise ServerError(f"{what}: {HOST}:{port} is not available ({exc.strerror or exc}); pick another port") \
                from None


def server_env(inst: TritonInstall) -> dict:
    """tritonserver's environment: this interpreter's libpython and the bundled libraries first on
    LD_LIBRARY_PATH, this interpreter's bin first on PATH."""
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        p for p in (_own_libpython_dir(), str(inst.libs), env.get("LD_LIBRARY_PATH")) if p)
    env["PATH"] = os.pathsep.join(p for p in (str(Path(sys.executable).parent), env.get("PATH")) if p)
    return env


def assemble_backends(inst: TritonInstall, backends: Path) -> None:
    """A ``--backend-directory`` at ``backends``: the bundled python backend with the stub of THIS interpreter."""
    (backends / "python").mkdir(parents=True)
    for f in inst.python_backend.iterdir():
        if f.is_file():
            shutil.copy2(f, backends / "python" / f.name)
    shutil.copy2(inst.stub, backends / "python" / "triton_python_backend_stub")


def missing_libraries(binary: str | Path, env: dict) -> list[str]:
    """Shared libraries ``binary`` cannot resolve under ``env`` (``ldd``; [] when ldd is absent)."""
    try:
        r = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, env=env, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [ln.split("=>")[0].strip() for ln in r.stdout.splitlines() if "not found" in ln]


def _own_libpython_dir() -> str | None:
    """The directory of THIS interpreter's libpython, when it has one. The stub links
    ``libpython3.X.so.1.0`` by name: without this it may find the system's (another patch release)
    and run it with this interpreter's standard library, which fails on some extension modules
    (seen: pyenv 3.11.7's ``_ssl`` under Debian's 3.11.2 libpython, so transformers cannot import)."""
    import sysconfig

    libdir, soname = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("INSTSONAME")
    if libdir and soname and (Path(libdir) / soname).is_file():
        return libdir
    return None


class TritonServer:
    """``with TritonServer(repo) as srv:`` — tritonserver on 127.0.0.1, ready inside, stopped after."""

    def __init__(self, repository: str | Path, *, http_port: int | None = None, grpc_port: int | None = None,
                 metrics_port: int | None = None, log_path: str | Path | None = None, ready_timeout: float = 120.0,
                 extra_args: list[str] | None = None, log_kept: bool = True, cleanup_dirs=(),
                 drain_timeout: float = 10.0, ranks: int = 1, progress=None, progress_every: float = 15.0):
        self.repository = Path(repository).resolve()
        self.http_port = http_port if http_port is not None else free_port()
        self.grpc_port = grpc_port if grpc_port is not None else free_port()
        self.metrics_port = metrics_port if metrics_port is not None else free_port()
        self.ready_timeout = ready_timeout
        self.extra_args = list(extra_args or [])
        self._work = hygiene.make_work_dir("dflash2-triton-")   # with its owner: a later run can tell it is stale
        self.cleanup_dirs = [Path(d) for d in cleanup_dirs]      # also removed by the watchdog if we die
        self.log_path = Path(log_path) if log_path is not None else self._work / "tritonserver.log"
        self.log_kept = log_kept   # False: the log goes with a temporary directory, so do not point at it
        # stop(): requests in flight get drain_timeout s to finish (then an error response each), inside
        # tritonserver's exit timeout, inside the grace before SIGKILL
        self.drain_timeout = float(drain_timeout)
        self.exit_timeout = math.ceil(self.drain_timeout) + 5
        self.drain_file = self._work / "drain"
        # a tp TensorRT engine on the project runtime: mpiexec, tritonserver as rank 0, the other ranks followers
        # (follower.py), as the repository's launch.sh starts it
        self.ranks = int(ranks)
        # while waiting for readiness: a line every progress_every s with each model's state (loading a large
        # TensorRT engine takes minutes, and silence looks like a hang)
        self.progress, self.progress_every = progress, float(progress_every)
        self.proc: subprocess.Popen | None = None
        # tritonserver --id: readiness counts only from this server (another one already on the port answered the
        # health check while this one failed to bind, and serve said it was serving: a new user's report)
        self.server_id = f"dflash2-{os.getpid()}-{secrets.token_hex(4)}"
        self._watchdog: subprocess.Popen | None = None
        self._stubs: dict[tuple, str] = {}     # python-backend stub (pid, start time) -> its model, seen alive
        self._zombies: dict[tuple, float] = {}   # (pid, start time) -> when first seen a zombie (dead_stub)

    @property
    def http_url(self) -> str:
        return f"{HOST}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{HOST}:{self.grpc_port}"

    def command(self, inst: TritonInstall, backends: Path, env: dict | None = None) -> list[str]:
        server = [str(inst.binary), "--model-repository", str(self.repository), "--backend-directory", str(backends),
                  "--http-address", HOST, "--grpc-address", HOST, "--metrics-address", HOST,
                  "--http-port", str(self.http_port), "--grpc-port", str(self.grpc_port),
                  "--metrics-port", str(self.metrics_port), "--exit-timeout-secs", str(self.exit_timeout),
                  "--strict-readiness", "true", "--id", self.server_id, hygiene.backend_config(self._work),
                  *self.extra_args]
        if self.ranks == 1:
            return server
        # the followers name the working directory, so a cleanup finds them as it finds the server (hygiene.py)
        return [*mpi_launcher(env), "-n", "1", *server, ":", "-n", str(self.ranks - 1), sys.executable, "-m",
                "dflash2_trt.deploy.triton.follower", "--repository", str(self.repository),
                "--stop-grace", str(self.exit_timeout + 2), "--work", str(self._work)]   # inside stop()'s wait

    def start(self) -> "TritonServer":
        if not (self.repository / "tensorrt_llm" / "config.pbtxt").is_file():
            raise ServerError(f"{self.repository}: not a model repository (no tensorrt_llm/config.pbtxt; write one "
                              f"with `dflash2-trt deploy triton`)")
        for what, port in (("--http-port", self.http_port), ("--grpc-port", self.grpc_port),
                           ("--metrics-port", self.metrics_port)):
            check_port_free(port, what)
        inst = find_tritonserver()
        backends = self._work / "backends"
        assemble_backends(inst, backends)
        env = server_env(inst)
        env[DRAIN_ENV] = str(self.drain_file)   # the CPU tensorrt_llm model drains when it appears (stop())
        stub = backends / "python" / "triton_python_backend_stub"
        missing = missing_libraries(stub, env)
        if missing:
            # otherwise every python model fails to load with a message about the stub, not the cause
            raise ServerError(f"the python-backend stub for Python {sys.version_info.major}.{sys.version_info.minor} "
                              f"cannot find {', '.join(missing)} (ldd {stub}); install the matching libpython "
                              f"(e.g. the distribution's libpython3.X package) or use a Python built with "
                              f"--enable-shared")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.command(inst, backends, env), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env, start_new_session=True,
                                         preexec_fn=die_with_parent())
        try:
            self._watchdog = hygiene.start_watchdog(self.proc.pid, [self._work, *self.cleanup_dirs])
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def model_states(self) -> str:
        """``name STATE, ...`` as far as the server's log tells (tritonserver opens its endpoints only once every
        model has loaded, so while they load its log is the only witness): ``LOADING`` from ``loading: NAME:V``,
        ``READY`` from ``successfully loaded 'NAME'``, ``FAILED`` from ``failed to load 'NAME'``."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "no log yet"
        states: dict[str, str] = {}
        for m in _LOG_STATE.finditer(text):
            name = m.group("loading") or m.group("loaded") or m.group("failed")
            states[name] = "LOADING" if m.group("loading") else "READY" if m.group("loaded") else "FAILED"
        return ", ".join(f"{n} {st}" for n, st in states.items()) if states else "the server is starting"

    def wait_ready(self) -> None:
        start = time.monotonic()
        deadline = start + self.ready_timeout
        url = f"http://{self.http_url}/v2/health/ready"
        said = start
        while True:
            raise_if_stop_requested()   # a stop whose exception was lost during start-up ends the wait, not serve
            if self.progress is not None and time.monotonic() - said >= self.progress_every:
                said = time.monotonic()
                self.progress(f"waiting for tritonserver ({said - start:.0f} s of {self.ready_timeout:.0f}): "
                              f"{self.model_states()}")
            code = self.proc.poll()
            if code is not None:
                raise ServerError(f"tritonserver exited with status {code} before it was ready; its log "
                                  f"({self._log_ref()}) ends:\n{self.log_tail()}")
            dead = self.dead_stub()
            if dead is not None:
                raise ServerError(f"{dead}; tritonserver does not notice a stub that dies before it reports, and "
                                  f"would wait out the {self.ready_timeout:.0f} s; its log ({self._log_ref()}), where "
                                  f"the stub's own output goes, ends:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(url, timeout=1) as r:
                    if r.status == 200 and self._answers_as_ours():
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise ServerError(f"tritonserver was not ready within {self.ready_timeout:.0f} s; its log "
                                  f"({self._log_ref()}) ends:\n{self.log_tail()}")
            time.sleep(0.2)

    def _answers_as_ours(self) -> bool:
        """Whether the server on the HTTP port is this one (its metadata's name is our ``--id``), not another that
        holds the port."""
        try:
            with urllib.request.urlopen(f"http://{self.http_url}/v2", timeout=1) as r:
                return json.loads(r.read().decode()).get("name") == self.server_id
        except (urllib.error.URLError, OSError, ValueError, AttributeError):
            return False

    def dead_stub(self, snapshot: list[TreeProcess] | None = None, now: float | None = None) -> str | None:
        """A python-backend stub of this server that died while its model loaded, said in words, or None. A stub that
        dies before it reports (a crash while its model's Python imports torch or this package, an out-of-memory kill:
        reproduced with a model that exits at import) is left a zombie, and tritonserver waits for it with the model
        LOADING and nothing in its log; an exception or a death inside ``initialize`` it reports at once. Stubs also
        end normally while models load (the backend's argument-less permission check under ``sh``, the config
        auto-complete stub, exit 0) and are reaped within milliseconds, so only a zombie stub whose parent is
        tritonserver and that stays one for ``STUB_ZOMBIE_S`` counts, each process known by its pid and start time.
        ``snapshot`` / ``now``: the process tree and the clock (tests); default: /proc (Linux; elsewhere nothing)."""
        now = time.monotonic() if now is None else now
        for p in (tree_processes(self.proc.pid) if snapshot is None else snapshot):
            key = (p.pid, p.start)
            if p.state != "Z":
                if key not in self._stubs and len(p.cmdline) > 1 and os.path.basename(p.cmdline[0]) == STUB_NAME:
                    self._stubs[key] = Path(p.cmdline[1]).parent.parent.name    # argv[1]: MODEL_DIR/VERSION/model.py
                continue
            if p.comm != STUB_NAME[:15] or p.parent_comm != "tritonserver":
                continue
            if now - self._zombies.setdefault(key, now) < STUB_ZOMBIE_S:
                continue
            model = self._stubs.get(key)
            return (f"the python-backend stub of {f'model {model!r}' if model else 'a python model'} (pid {p.pid}) "
                    f"{wait_status_words(p.status)} while loading it, before it could report an error")
        return None

    def _log_ref(self) -> str:
        return str(self.log_path) if self.log_kept else "--log FILE keeps all of it"

    def log_tail(self, lines: int = 8, width: int = 400) -> str:
        """The log's error lines (Triton's ``E...`` lines; a python model's traceback is one of
        them) then its last ``lines`` lines, each cut to ``width`` characters."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        all_lines = text.splitlines()
        harmless = ("CudaDriverHelper", "Failed to initialize NVML", "DCGM")   # no GPU here: expected noise
        errors = [ln for ln in all_lines if ln[:1] == "E" and ln[1:5].isdigit() and not any(h in ln for h in harmless)]
        tail = [ln for ln in all_lines[-lines:] if ln not in errors and ln[:1] not in ("|", "+") and ln.strip()]
        cut = [ln if len(ln) <= width else ln[:width] + " ..." for ln in errors[-6:] + tail]
        return "\n".join(cut) if cut else "(empty log)"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace: float | None = None) -> None:
        """Drain, SIGTERM, wait up to ``grace`` s (default: the exit timeout + 5), then SIGKILL the whole process
        group; idempotent. Draining: the python model ends every request still running after ``drain_timeout`` s
        with an error response, while tritonserver (stopping: no new requests) still delivers it."""
        p = self.proc
        if grace is None:
            # ranks: past the followers' own grace (exit timeout + 2), so a follower whose rank 0 never closed says so
            grace = self.exit_timeout + (10.0 if self.ranks > 1 else 5.0)
        if p is not None:
            pgid = p.pid   # start_new_session: the server leads its own group
            if p.poll() is None:
                try:
                    if not self.drain_file.exists():
                        request_drain(self.drain_file, self.drain_timeout)
                except OSError:
                    pass   # the work directory is gone: tritonserver's own exit timeout still ends it
                try:
                    p.send_signal(signal.SIGTERM)
                    p.wait(grace)
                except subprocess.TimeoutExpired:
                    pass
            try:
                os.killpg(pgid, signal.SIGKILL)   # whatever is left: the server or a stub
            except (ProcessLookupError, PermissionError):
                pass
            if self.ranks > 1:
                # under mpiexec each rank leads a session of its own (the launcher's proxy makes it): the server with
                # its stubs, the followers; whatever is left of them is found by the working directory they name
                w = self._watchdog.pid if self._watchdog is not None else None
                hygiene.kill_named(self._work, exclude={w} if w else set())
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:  # pragma: no cover
                pass
            deadline = time.monotonic() + 5
            while (group_alive(pgid) or hygiene.group_members(pgid)) and time.monotonic() < deadline:
                time.sleep(0.05)
            # a SIGKILLed stub (or server) does not unlink its own regions; they all carry this server's prefix
            hygiene.unlink_regions(self._work)
        shutil.rmtree(self._work / "backends", ignore_errors=True)

    def close(self) -> None:
        """Stop, then remove the working directory (the log too, unless ``log_path`` was given) and end the
        watchdog."""
        self.stop()
        shutil.rmtree(self._work, ignore_errors=True)
        w, self._watchdog = self._watchdog, None
        if w is not None:
            try:
                w.stdin.close()      # it finds nothing left to clean and exits
                w.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                w.kill()

    def __enter__(self) -> "TritonServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


READY_TIMEOUT = {"default": 120.0, "trtllm": 900.0, "cuda": 900.0}
"""``serve``'s default readiness wait, seconds: an engine of a published target on a GPU (tens of GB to deserialize
or load, its KV pool to allocate) loads for minutes; a cpu engine, or a repository without a record, in seconds."""


def repository_record(repository: str | Path) -> dict:
    """The repository's ``dflash2_repository.json`` (``deploy triton``'s record), or {} for a repository without one."""
    path = Path(repository) / "dflash2_repository.json"
    if not path.is_file():
        return {}
    try:
        rec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"not a readable repository record ({type(exc).__name__}: {exc})", source=path) from None
    if not isinstance(rec, dict):
        raise ConfigError(f"not a readable repository record (a {type(rec).__name__}, not an object)", source=path)
    return rec


_PATH_PARAMETER = re.compile(r'key:\s*"(gpt_model_path|tokenizer_dir)"\s*value:\s*\{\s*string_value:\s*"((?:[^"\\]|\\.)*)"')


def check_repository_paths(repository: str | Path, models: list[str]) -> None:
    """What ``repository``'s models need of the file system, before tritonserver is started (each config.pbtxt read
    once). The directories they open at load time (the engine, ``gpt_model_path``; the tokenizer, ``tokenizer_dir``;
    absolute, as ``deploy triton`` writes them) exist: a repository whose engine directory was moved after ``deploy
    triton`` failed inside the server, the tokenizer models with transformers' "Repo id must be in the form ..." (the
    path read as a Hub id), after a 120 s readiness wait could have been spent; one line naming the config file, the
    parameter and the path. And where a python-backend model is among them, the repository's path holds no
    whitespace (:func:`~.repository.refuse_spaced_python_models`)."""
    found, python = [], False
    for name in models:
        cfg = Path(repository) / name / "config.pbtxt"
        try:
            text = cfg.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue                    # tritonserver says what it cannot read
        python = python or re.search(r'^\s*backend:\s*"python"', text, re.M) is not None
        found += [(m.group(1) != "gpt_model_path", cfg, m.group(1), re.sub(r"\\(.)", r"\1", m.group(2)))
                  for m in _PATH_PARAMETER.finditer(text)]
    for _, cfg, key, value in sorted(found, key=lambda f: f[0]):    # the engine first: the tokenizer lives in it
        if value and os.path.isabs(value) and not os.path.isdir(value):
            raise ConfigError(f"{value} is not a directory (moved or removed since `deploy triton` wrote this "
                              f"repository? write it again with --engine-dir at its new place)", source=cfg,
                              field=key)
    if python:
        refuse_spaced_python_models(repository, field="--repository")


def default_ready_timeout(repository: str | Path, record: dict | None = None) -> float:
    """The readiness wait for ``repository``: :data:`READY_TIMEOUT` by the engine backend its record names (a
    TensorRT-LLM or cuda engine: 900 s, else 120 s)."""
    backend = (repository_record(repository) if record is None else record).get("engine_backend")
    return READY_TIMEOUT.get(backend, READY_TIMEOUT["default"]) if isinstance(backend, str) else \
        READY_TIMEOUT["default"]


def repository_ranks(repository: str | Path, record: dict | None = None) -> int:
    """How many processes serve the repository: its record's ``ranks`` (a tp TensorRT engine on the project runtime,
    ``deploy triton``), else 1."""
    ranks = (repository_record(repository) if record is None else record).get("ranks")
    if ranks is None:
        return 1
    n = ranks.get("processes") if isinstance(ranks, dict) else None
    if not isinstance(n, int) or isinstance(n, bool) or n < 2:
        raise ConfigError(f"must hold processes >= 2, got {ranks!r}", source=Path(repository) /
                          "dflash2_repository.json", field="ranks")
    return n


def mpi_launcher(env: dict | None = None) -> list[str]:
    """The MPI launcher's argv prefix for a tp engine's ranks: ``$MPIRUN``, else the ``mpiexec`` beside this
    interpreter, else ``mpiexec`` / ``mpirun`` on the server's PATH (Open MPI's gets ``--allow-run-as-root``, as
    TensorRT-LLM's launcher passes it)."""
    env = os.environ if env is None else env
    path = env.get("PATH")
    if env.get("MPIRUN"):
        found = shutil.which(env["MPIRUN"], path=path)
        if not found:
            raise MissingDependencyError(f"MPIRUN={env['MPIRUN']!r}: not an executable (give the launcher's path; its "
                                         f"options cannot go there)")
    else:
        # the launcher installed with this interpreter first (the `mpi` extra's MPICH, the one its mpi4py is built
        # for: another MPI's launcher would start every rank as a singleton), else PATH's
        own = Path(sys.executable).parent / "mpiexec"
        found = (str(own) if own.is_file() and os.access(own, os.X_OK) else None) or shutil.which(
            "mpiexec", path=path) or shutil.which("mpirun", path=path)
    if not found:
        raise MissingDependencyError("a tp engine is served as one process per rank under an MPI launcher, and none "
                                     "was found (mpiexec / mpirun on PATH, or MPIRUN): on a GPU machine TensorRT-LLM's "
                                     "Open MPI; without TensorRT-LLM, pip install -e '.[mpi]'")
    try:
        version = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=30, env=env).stdout
    except (OSError, subprocess.TimeoutExpired):
        version = ""
    return [found, "--allow-run-as-root"] if "Open MPI" in version else [found]


def group_alive(pgid: int) -> bool:
    """True while any process of group ``pgid`` exists (zombies of other parents included)."""
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover
        return True


_LOG_LINE = re.compile(rb"(?:^|\n)[IWEF]\d{4} \d\d:\d\d:\d\d", re.M)   # glog's prefix: I1207 00:41:31.123456 ...


def check_log_path(log_path) -> None:
    """``serve --log``, before anything starts. A terminal, a pipe or another device (``--log /dev/stdout``) is
    written to, nothing replaced. A file: not a directory, in a directory that exists and takes a new file, and, if it
    exists, empty or a tritonserver log (a glog line in its first 4 KB; an MPI launcher's banner may come first): it
    is replaced then, never another file (a dataset, a report)."""
    import stat

    from ...bench.io import check_output_file

    try:
        mode = Path(log_path).stat().st_mode   # through a link: /dev/stdout is one
    except OSError:
        mode = None
    if mode is not None and (stat.S_ISCHR(mode) or stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
        return
    if mode is not None and str(log_path) in ("/dev/stdout", "/dev/stderr"):
        return   # this process's own output, wherever the shell sent it (a file too): asked for by name
    path = check_output_file(log_path, field="--log")
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise ConfigError(f"{path} exists and is not a regular file, a terminal or a pipe; give another path",
                          field="--log")
    if path.exists():
        try:
            with open(path, "rb") as fh:
                head = fh.read(4096)
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read it: {exc.strerror or exc}", field="--log") from None
        if head.strip() and not _LOG_LINE.search(head.lstrip()):
            raise ConfigError(f"{path} exists and is not a tritonserver log (serve replaces only its own); give another "
                              f"path", field="--log")


def serve_until_stopped(srv, poll_s: float = 0.25) -> bool:
    """Wait while ``srv`` runs: True when a stop (Ctrl-C, SIGTERM) arrived, False when it exited on its own.

    The stop's record is checked too: a KeyboardInterrupt that Python lost (raised inside a destructor or a
    weakref callback, "Exception ignored in ...") would otherwise leave serve waiting forever."""
    try:
        while srv.alive():
            raise_if_stop_requested()
            time.sleep(poll_s)
    except KeyboardInterrupt:
        return True
    return False


def serves_target_only(repository, record: dict) -> bool:
    """Whether the repository's tensorrt_llm model serves the target alone: its config.pbtxt's ``target_only``
    parameter, what the model itself reads (the repository record's copy where the file cannot be parsed)."""
    from .repository import parse_config

    path = Path(repository) / "tensorrt_llm" / "config.pbtxt"
    try:
        params = parse_config(path.read_text(), source=path).parameters
    except (OSError, DFlash2Error):
        return bool(record.get("target_only"))
    return "target_only" in params and params["target_only"].string_value.strip().lower() == "true"


def openai_frontend(record: dict, repository, port: int, triton_http: str, model: str | None):
    """The OpenAI API of ``serve --openai-port`` (not started): the repository's ensemble, the engine's tokenizer (chat
    templates), ``max_seq_len`` and block size, as its record names them."""
    from ...tokenizer import find_tokenizer
    from .openai_api import OpenAIFrontend

    ensemble = record.get("ensemble")
    if not ensemble:
        raise ConfigError(f"{repository} has no ensemble (written with --ids-only, or not by `deploy triton`): the "
                          f"OpenAI API serves text through it", field="--openai-port")
    tok_dir, engine = record.get("tokenizer_dir"), record.get("engine_dir")
    tok = None if tok_dir is None else find_tokenizer(tok_dir, strict=True)
    max_seq_len = block_size = None
    if engine is not None:   # where they cannot be read, a chat completion's default length is the API's 16
        try:
            man = json.loads((Path(engine) / "engine.json").read_text())
            # the target alone (deploy triton --target-only) takes one slot per step, not the draft block
            lim = man["limits"]
            max_seq_len = int(lim["max_seq_len"])
            if int(lim.get("num_kv_blocks") or 0):   # a fixed pool smaller than max_seq_len: the model's own limit
                max_seq_len = min(max_seq_len, int(lim["num_kv_blocks"]) * int(lim["tokens_per_block"]))
            block_size = 1 if serves_target_only(repository, record) else int(man["block_size"])
        except (OSError, ValueError, KeyError, TypeError):
            max_seq_len = block_size = None
    return OpenAIFrontend(triton_http, ensemble=ensemble, model=model or Path(engine or repository).name,
                          tokenizer=tok, max_seq_len=max_seq_len, block_size=block_size, host=HOST, port=port)


def _needs_a_gpu() -> None:
    """A cuda engine's model opens it on the GPU in tritonserver: without one, refuse here in one line (there it fails
    in the server's log, seconds later)."""
    from ...engine.standin.engine import engine_device

    engine_device("cuda")


def serve(*, engine_dir: str | Path | None = None, repository: str | Path | None = None, port: int = 8000,
          http_port: int | None = None, grpc_port: int | None = None, metrics_port: int | None = None,
          max_batch_size: int | None = None, decoupled: bool = True, tokenizer: str | Path | None = None,
          ids_only: bool = False, log_path: str | Path | None = None, ready_timeout: float | None = None,
          drain_timeout: float = 10.0, cuda_graphs: bool = False, openai_port: int | None = None,
          served_model_name: str | None = None, target_only: bool = False,
          kv_cache_free_gpu_mem_fraction: float | None = None, echo=print) -> int:
    """``dflash2-trt serve``: a repository for ``engine_dir`` in a temporary directory (or an existing
    ``repository``), tritonserver on 127.0.0.1 until Ctrl-C / SIGTERM, then drained (no new requests; those
    in flight finish, or get an error response after ``drain_timeout`` s), stopped and cleaned up.
    Returns 0 after a requested stop; a server that dies on its own is a :class:`ServerError`. ``openai_port``: an
    OpenAI-compatible API there too (:mod:`.openai_api`), serving the ensemble as ``served_model_name`` (default: the
    engine directory's name). ``kv_cache_free_gpu_mem_fraction``: the generated repository's (deploy triton's option;
    refused for a cpu engine there)."""
    from .repository import deploy_triton

    if (engine_dir is None) == (repository is None):
        raise ServerError("give exactly one of --engine-dir or --repository")
    if repository is not None:   # a repository is served as written: these would silently do nothing
        given = [o for o, v in (("--max-batch-size", max_batch_size is not None), ("--no-decoupled", not decoupled),
                                ("--tokenizer", tokenizer is not None), ("--ids-only", ids_only),
                                ("--cuda-graphs", cuda_graphs), ("--target-only", target_only),
                                ("--kv-cache-free-gpu-mem-fraction", kv_cache_free_gpu_mem_fraction is not None)) if v]
        if given:
            raise ConfigError("applies to --engine-dir only: a --repository is served as `deploy triton` wrote it "
                              "(write another with the option there)", field=given[0])
    if engine_dir is not None and engine_backend(engine_dir) == "cuda":   # before ports, a repository, tritonserver
        _needs_a_gpu()
    if ready_timeout is not None and not (isinstance(ready_timeout, (int, float)) and 0 < ready_timeout < float("inf")):
        raise ConfigError(f"must be a number of seconds > 0, got {ready_timeout}", field="--ready-timeout")
    if not (isinstance(drain_timeout, (int, float)) and 0 <= drain_timeout <= 3600):
        raise ConfigError(f"must be a number of seconds in [0, 3600], got {drain_timeout}", field="--drain-timeout")
    if log_path is not None:
        from ...overlap import refuse_overlap

        refuse_overlap(log_path, "--log", [("engine directory", engine_dir), ("repository", repository),
                                           ("tokenizer directory", tokenizer)], force=False)
        check_log_path(log_path)
    ports = {"--http-port": port if http_port is None else http_port,
             "--grpc-port": port + 1 if grpc_port is None else grpc_port,
             "--metrics-port": port + 2 if metrics_port is None else metrics_port}
    # a port derived from --port is named as that in an error (--port P sets P, P+1, P+2)
    named = {(what if given is not None else f"--port (its {what[2:-5]} port)"): p
             for (what, p), given in zip(ports.items(), (http_port, grpc_port, metrics_port))}
    if served_model_name is not None and not served_model_name.strip():
        raise ConfigError("must be a non-empty name", field="--served-model-name")
    if served_model_name is not None and openai_port is None:
        raise ConfigError("names the model of the OpenAI API: give --openai-port too", field="--served-model-name")
    if openai_port is not None:
        if ids_only:
            raise ConfigError("the OpenAI API serves text through the ensemble, which --ids-only leaves out",
                              field="--openai-port")
        ports["--openai-port"] = named["--openai-port"] = openai_port
    if len(set(ports.values())) != len(ports):
        raise ServerError(f"the {len(ports)} ports must differ, got "
                          f"{', '.join(f'{what} {port}' for what, port in named.items())}")
    for what, p in named.items():
        check_port_free(p, what)   # before anything is generated or started
    find_tritonserver()
    hygiene.sweep_leftovers(echo=lambda m: print(m, file=sys.stderr, flush=True))
    work = hygiene.make_work_dir("dflash2-serve-")
    old_handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    srv = front = None
    try:
        # SIGINT too: a shell starts background jobs with SIGINT ignored, and Ctrl-C must still stop us
        for sig in old_handlers:
            signal.signal(sig, raise_stop)
        if engine_dir is not None:
            # its repository goes to a temporary directory: one with whitespace is TMPDIR's, not an --output's
            refuse_spaced_python_models(work / "repository", advice="set TMPDIR to a directory without spaces "
                                        "(serve writes the repository there)")
            res = deploy_triton(engine_dir, work / "repository", max_batch_size=max_batch_size, decoupled=decoupled,
                                tokenizer=tokenizer, ids_only=ids_only, cuda_graphs=cuda_graphs,
                                target_only=target_only, kv_cache_free_gpu_mem_fraction=kv_cache_free_gpu_mem_fraction)
            repository, models = res.output, res.models
            # serve's own temporary repository is no output of the command: a stop must not call it "kept"
            committed_outputs[:] = [p for p in committed_outputs if Path(work) not in (Path(p), *Path(p).parents)]
        else:
            models = sorted(p.parent.name for p in Path(repository).glob("*/config.pbtxt"))
            check_repository_paths(repository, models)
        record = repository_record(repository)         # read once: the readiness wait and the rank count
        if engine_dir is None and record.get("engine_backend") == "cuda":   # an --engine-dir was checked at the start
            _needs_a_gpu()
        if ready_timeout is None:
            ready_timeout = default_ready_timeout(repository, record)
        srv = TritonServer(repository, http_port=ports["--http-port"], grpc_port=ports["--grpc-port"],
                           metrics_port=ports["--metrics-port"], log_path=log_path or work / "tritonserver.log",
                           ready_timeout=ready_timeout, log_kept=log_path is not None, cleanup_dirs=[work],
                           drain_timeout=drain_timeout, ranks=repository_ranks(repository, record),
                           progress=lambda m: print(m, file=sys.stderr, flush=True))
        front = None if openai_port is None else openai_frontend(record, repository, openai_port, srv.http_url,
                                                                   served_model_name)
        srv.start()
        ranks = f", tp {srv.ranks}: tritonserver rank 0 + {srv.ranks - 1} follower(s) under MPI" if srv.ranks > 1 else ""
        if front is not None:
            front.start()
            ranks += f"; OpenAI API http://{front.url}/v1 (model {front.model!r})"
        alone = " (the target alone: the autoregressive baseline)" if serves_target_only(repository, record) else ""
        echo(f"serving {engine_dir or repository}{alone} on {HOST}: HTTP http://{srv.http_url}, gRPC {srv.grpc_url}, "
             f"metrics http://{HOST}:{srv.metrics_port}/metrics; models: {', '.join(models)}{ranks} (Ctrl-C stops)")
        if serve_until_stopped(srv):
            clear_stop_requests()   # handled: the ordinary way to stop a ready server
            echo(f"stopping tritonserver (no new requests; those in flight get {drain_timeout:g} s to finish)")
            if front is not None:
                front.close()       # no new API requests either; those in flight end as Triton drains them
            srv.stop()
            echo("stopped")
            return 0
        raise ServerError(f"tritonserver exited with status {srv.proc.returncode}; its log ({srv._log_ref()}) "
                          f"ends:\n{srv.log_tail()}")
    finally:
        if front is not None:
            front.close()
        if srv is not None:
            srv.close()
        for sig, handler in old_handlers.items():
            signal.signal(sig, handler)
        shutil.rmtree(work, ignore_errors=True)
