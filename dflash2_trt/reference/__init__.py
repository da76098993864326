"""Plain-PyTorch reference of DFlash2 (drafter, dynamic conv, pairwise selector, verification,
speculative loop). Everything else in the project (conversion checks, plugins, ONNX, engines) is
judged against this package. Runs on CPU and GPU."""
