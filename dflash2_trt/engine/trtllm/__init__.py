"""The TensorRT-LLM backend: what the machine has (:mod:`.toolchain`), the plugin library (:mod:`.plugin_library`),
the trtllm-build command line (:mod:`.command`) and the build around it (:mod:`.build`, :mod:`.process`), how the
C++ runtime reads the engine config (:mod:`.runtime_rules`, facts in ``facts/``), the C++ runner (:mod:`.runner`)
and the verify gate through it (:mod:`.verify`)."""
