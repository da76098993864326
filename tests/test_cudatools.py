"""dflash2_trt.cudatools.find_cuda_tool: where nvcc, compute-sanitizer and ncu are looked up (PATH, then the toolkit's
bin under CUDA_HOME / CUDA_PATH / /usr/local/cuda, then extra places such as Nsight Compute's own folder)."""

from __future__ import annotations

from dflash2_trt.cudatools import find_cuda_tool


def _tool(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return str(path)


def test_path_first_then_the_toolkits_then_the_extra_places(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "nowhere"))
    name = "df2-test-tool-none-has"
    assert find_cuda_tool(name) is None
    old = _tool(tmp_path / "opt" / "2024.1" / name)
    new = _tool(tmp_path / "opt" / "2025.3.1" / name)
    assert find_cuda_tool(name, (str(tmp_path / "opt" / "*" / name),)) == new != old    # the newest by name
    home = _tool(tmp_path / "cuda" / "bin" / name)
    monkeypatch.setenv("CUDA_PATH", str(tmp_path / "cuda"))
    assert find_cuda_tool(name, (str(tmp_path / "opt" / "*" / name),)) == home
    on_path = _tool(tmp_path / "bin" / name)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert find_cuda_tool(name) == on_path
