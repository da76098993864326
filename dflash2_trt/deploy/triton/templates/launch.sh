#!/usr/bin/env bash
# dflash2-trt template, filled by `dflash2-trt deploy triton --backend tensorrtllm`.
#
# Start Triton (TensorRT-LLM's container: tritonserver with the tensorrtllm backend) on this
# repository. The DFlash2 plugins are registered by loading their library into the server process
# (TensorRT-LLM has no plugin-library parameter): LD_PRELOAD it. Extra arguments go to tritonserver
# (to every rank's).
#
# tp > 1: the backend runs one MPI process per GPU (the executor expects an MPI world of tp ranks), so
# this starts `mpirun -n 1 tritonserver ... : -n 1 tritonserver ...` with one app context per rank, as
# TensorRT-LLM's triton_backend/scripts/launch_triton_server.py does: rank 0 loads every model, the other
# ranks only tensorrt_llm (--model-control-mode=explicit --load-model=tensorrt_llm), each with its own
# python-backend shared-memory prefix; LD_PRELOAD is exported to every rank (-x).
set -euo pipefail
REPO="$$(cd "$$(dirname "$${BASH_SOURCE[0]}")" && pwd)"
TP=${tp_size}
PLUGIN_LIB="$${DFLASH2_PLUGIN_LIB:-${plugin_lib}}"
if [ ! -f "$$PLUGIN_LIB" ]; then
  echo "error: DFlash2 plugin library not found: $$PLUGIN_LIB (build it per plugins/README.md, or set DFLASH2_PLUGIN_LIB)" >&2
  exit 1
fi
export LD_PRELOAD="$$PLUGIN_LIB$${LD_PRELOAD:+:$$LD_PRELOAD}"
TRITON="$${TRITONSERVER:-tritonserver}"
PORTS=(--http-port "$${HTTP_PORT:-8000}" --grpc-port "$${GRPC_PORT:-8001}" --metrics-port "$${METRICS_PORT:-8002}")
if [ "$$TP" -le 1 ]; then
  exec "$$TRITON" --model-repository "$$REPO" "$${PORTS[@]}" "$$@"
fi
MPIRUN="$${MPIRUN:-mpirun}"
if ! command -v "$$MPIRUN" >/dev/null 2>&1; then
  echo "error: this engine is tp $$TP: the tensorrtllm backend needs one MPI process per GPU, and $$MPIRUN was not found (TensorRT-LLM's container has it; or set MPIRUN)" >&2
  exit 1
fi
CMD=("$$MPIRUN" --allow-run-as-root -x LD_PRELOAD)
for ((i = 0; i < TP; i++)); do
  if [ "$$i" -gt 0 ]; then CMD+=(":"); fi
  CMD+=(-n 1 "$$TRITON" --model-repository "$$REPO" "$${PORTS[@]}")
  if [ "$$i" -gt 0 ]; then CMD+=(--model-control-mode=explicit --load-model=tensorrt_llm); fi
  CMD+=(--disable-auto-complete-config "--backend-config=python,shm-region-prefix-name=prefix$${i}_" "$$@")
done
exec "$${CMD[@]}"
