"""``dflash2-trt bench``: datasets in trtllm-bench's format, throughput / latency / acceptance per
concurrency with speculation and without, a JSON report, plots, and a roofline projection to GPUs.

Modules: :mod:`.dataset` (prepare-dataset, reading a dataset), :mod:`.cpu` (the CPU-engine load
generator), :mod:`.autoregressive` (the target-only baseline engine), :mod:`.metrics` (percentiles,
per-run figures), :mod:`.report` (the report document and its text rendering), :mod:`.trtllm_bench`
(the trtllm-bench launcher, its options file and model folder, its report parser; facts in
``trtllm_bench_1_2.yaml``), :mod:`.gpu` (gptManagerBenchmark command builder and output parser), :mod:`.projection` (the roofline model),
:mod:`.plot` (PNG), :mod:`.io` (atomic writes).
"""
