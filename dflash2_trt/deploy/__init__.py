"""Serving deployments of engine directories (``dflash2-trt deploy ...``)."""
