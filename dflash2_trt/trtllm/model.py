"""The model class file of the DFlash2 engine: ``trtllm-build --model_cls_file`` loads this file and builds the
class ``--model_cls_name DFlash2ForCausalLM`` names (``TargetOnlyForCausalLM`` for the baseline engine of
``build --baseline``) (trtllm-build imports the file, instantiates the class from
the checkpoint, calls its ``prepare_inputs`` and ``forward`` inside a network, and builds the engine).

The network itself is the package ``dflash2_trt/trtllm/network/`` (one module per target family, the drafter,
the selector, the accept step, the engine I/O: its docstring), loaded once per backend; this file takes the
instance for the current backend (TensorRT-LLM under trtllm-build). ``dflash2_trt.trtllm.register`` puts this
same class into ``tensorrt_llm.models.MODEL_MAP``.
"""

from dflash2_trt.trtllm import backend

_network = backend.load_network(backend.resolve())
DFlash2ForCausalLM = _network.DFlash2ForCausalLM
TargetOnlyForCausalLM = _network.TargetOnlyForCausalLM   # the baseline engine (build --baseline)
