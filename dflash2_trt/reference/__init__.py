"""Plain-PyTorch reference of DFlash2 (CPU and GPU). Everything else in the project (conversion
checks, plugins, ONNX, engines) is judged against this package.

Modules:
    conv      ``dynamic_conv`` (block-local two-tap dynamic conv, fp32 accumulation) and the
              ``DynamicConv`` module (``base_kernel [2, K, H]``, ``kernel_projection``).
    selector  ``transform_unary_logits``, ``topk_candidates`` (ties: lower token id first),
              ``pairwise_lattice``, the walks ``walk_greedy`` / ``walk_sample`` /
              ``walk_viterbi`` / ``walk_none`` and the ``PairwiseSelector`` module.
    verify    ``accept_greedy``, ``accept_sampling`` (proposal supported on the candidates),
              ``scatter_proposal``, ``target_probs``, ``sample_from_probs``.
    drafter   ``DFlash2Drafter`` (strict load of the published tensors, committed-context KV
              cache), ``extract_taps``.
    loop      ``speculative_generate`` (batch 1, crop / snapshot-replay of the target cache),
              ``target_generate`` (the oracle), ``load_pair``.
    generate  what ``dflash2-trt generate`` runs.

Submodules are imported explicitly (``from dflash2_trt.reference.conv import dynamic_conv``) so
that importing the package stays cheap.
"""
