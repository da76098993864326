"""``python -m dflash2_trt ...`` is ``dflash2-trt ...``: the form an engine's RUN.md gives for another interpreter (a
system Python's scripts directory is not always beside it)."""

from .cli import main

if __name__ == "__main__":
    main()
