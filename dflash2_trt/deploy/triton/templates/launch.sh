#!/usr/bin/env bash
# dflash2-trt template, filled by `dflash2-trt deploy triton --backend tensorrtllm`.
#
# Start Triton (TensorRT-LLM's container: tritonserver with the tensorrtllm backend) on this
# repository. The DFlash2 plugins are registered by loading their library into the server process
# (TensorRT-LLM has no plugin-library parameter): LD_PRELOAD it. Extra arguments go to tritonserver.
set -euo pipefail
REPO="$$(cd "$$(dirname "$${BASH_SOURCE[0]}")" && pwd)"
PLUGIN_LIB="$${DFLASH2_PLUGIN_LIB:-${plugin_lib}}"
if [ ! -f "$$PLUGIN_LIB" ]; then
  echo "error: DFlash2 plugin library not found: $$PLUGIN_LIB (build it per plugins/README.md, or set DFLASH2_PLUGIN_LIB)" >&2
  exit 1
fi
export LD_PRELOAD="$$PLUGIN_LIB$${LD_PRELOAD:+:$$LD_PRELOAD}"
exec "$${TRITONSERVER:-tritonserver}" --model-repository "$$REPO" \
  --http-port "$${HTTP_PORT:-8000}" --grpc-port "$${GRPC_PORT:-8001}" --metrics-port "$${METRICS_PORT:-8002}" "$$@"
