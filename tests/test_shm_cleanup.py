"""dflash2_trt.testing.processes.remove_orphan_segments (the session's clean-up of /dev/shm, tests/conftest.py): of the
segments that appeared during a run, those no process maps are removed; one a live process maps is left alone."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from dflash2_trt.testing.processes import mapped_files, remove_orphan_segments

HOLD = """
import mmap, sys, time
fh = open(sys.argv[1], "r+b")
m = mmap.mmap(fh.fileno(), 4096)
print("mapped", flush=True)
time.sleep(60)
"""


def test_only_segments_no_process_maps_are_removed(tmp_path):
    shm = Path("/dev/shm")
    if not shm.is_dir():
        pytest.skip("no /dev/shm on this machine")
    tag = uuid.uuid4().hex
    orphan, held = shm / f"df2shmtest_{tag}_orphan", shm / f"df2shmtest_{tag}_held"
    for p in (orphan, held):
        p.write_bytes(b"\0" * 4096)
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(held)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "mapped"
        deadline = time.monotonic() + 10
        while str(held) not in mapped_files() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert str(held) in mapped_files() and str(orphan) not in mapped_files()
        assert remove_orphan_segments({str(orphan), str(held)}) == [str(orphan)]
        assert not orphan.exists() and held.exists()
    finally:
        proc.kill()
        proc.wait()
        for p in (orphan, held):
            if p.exists():
                os.unlink(p)
