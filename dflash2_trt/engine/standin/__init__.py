"""The CPU backend: an engine directory of converted weights (:mod:`.build`) that the CPU stand-in of
``tensorrt_llm`` executes (:mod:`.engine`), checked by the verify gate (:mod:`.verify`) and run with the CPU
runtime (:mod:`.run`)."""
