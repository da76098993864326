#!/usr/bin/env bash
# dflash2-trt template, filled by `dflash2-trt deploy triton` for a tp ${tp_size} TensorRT engine on the project runtime
# (the python-backend tensorrt_llm model; docs/trt-session.md §8).
#
# One process per rank under mpirun, as TensorRT-LLM serves a tp engine (its launch_triton_server.py): rank 0 is
# tritonserver (its python-backend model opens rank0.engine and drives the runtime), ranks 1..${tp_last} follow rank 0's
# steps with their own rank engines (python -m dflash2_trt.deploy.triton.follower) and exit when the server unloads
# the model. Stop it as any tritonserver (Ctrl-C / SIGTERM to mpirun): tritonserver drains and unloads, the followers
# leave with it. Extra arguments go to tritonserver. Environment: TRITONSERVER, MPIRUN, PYTHON (the interpreter with
# dflash2-trt; the python backend's stub finds the same environment through PATH), HTTP_PORT, GRPC_PORT, METRICS_PORT.
set -euo pipefail
REPO="$$(cd "$$(dirname "$${BASH_SOURCE[0]}")" && pwd)"
TP=${tp_size}
TRITON="$${TRITONSERVER:-tritonserver}"
PY="$${PYTHON:-python3}"
MPIRUN="$${MPIRUN:-mpirun}"
if ! command -v "$$MPIRUN" >/dev/null 2>&1; then
  echo "error: this engine is tp $$TP: it is served as $$TP processes under mpirun, and $$MPIRUN was not found (TensorRT-LLM's container has it; or set MPIRUN)" >&2
  exit 1
fi
MPI_ARGS=()
# Open MPI refuses root without it (TensorRT-LLM's launcher passes it); MPICH's mpiexec does not know it
if grep -q "Open MPI" <<<"$$("$$MPIRUN" --version 2>&1 || true)"; then MPI_ARGS+=(--allow-run-as-root); fi
PORTS=(--http-port "$${HTTP_PORT:-8000}" --grpc-port "$${GRPC_PORT:-8001}" --metrics-port "$${METRICS_PORT:-8002}")
exec "$$MPIRUN" "$${MPI_ARGS[@]}" -n 1 "$$TRITON" --model-repository "$$REPO" "$${PORTS[@]}" --disable-auto-complete-config \
  "--backend-config=python,shm-region-prefix-name=prefix0_" "$$@" \
  : -n $$((TP - 1)) "$$PY" -m dflash2_trt.deploy.triton.follower --repository "$$REPO"
