"""`--device` of the speed benchmarks: refused with a clear message without CUDA; on CUDA (marker
`gpu`) the fused learner section runs there and still matches the per-member loop in float64. The CPU
named in the benchmarks' JSON: its model and the flags that decide torch's kernels, not "x86_64"."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from benchmarks import efficientzero_speed, fused
from benchmarks.devices import cpu_description, cpu_name, parse_cpuinfo
from benchmarks.hpo.common import machine

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")


@no_cuda
def test_fused_refuses_cuda_without_a_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fused, "DEVICE", "cpu")  # main() sets the module's DEVICE: restored after the test
    with pytest.raises(SystemExit, match="--device cuda: this machine has no CUDA device"):
        fused.main(["--device", "cuda", "--skip", "learner,selfplay,generation"])


@no_cuda
def test_speed_refuses_cuda_without_a_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(efficientzero_speed, "DEVICE", "cpu")  # main() sets it: restored after the test
    monkeypatch.setattr(sys, "argv", ["efficientzero_speed", "--device", "cuda:1", "--only", "learner"])
    with pytest.raises(SystemExit, match="--device cuda:1: this machine has no CUDA device"):
        efficientzero_speed.main()


@pytest.mark.gpu
def test_fused_learner_point_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fused, "DEVICE", "cuda")
    point = fused.learner_point(4, compile=False, windows=1, seconds=0.2)
    assert point["loop_updates_per_s"] > 0 and point["fused_updates_per_s"] > 0
    assert point["max_abs_diff_f64"] < 1e-10
    assert {b.device.type for b in fused.batches(1, torch.float32)[0].values()} == {"cuda"}


EPYC = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9B14
flags\t\t: fpu sse avx2 avx512f avx512_bf16 avx512vl

processor\t: 1
model name\t: Some Other CPU
flags\t\t: fpu amx_bf16 amx_tile
"""
XEON = """processor\t: 0
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8
"""


def test_cpuinfo_gives_the_first_processors_model_and_the_kernel_flags() -> None:
    assert parse_cpuinfo(EPYC) == {"model": "AMD EPYC 9B14", "flags": ["avx2", "avx512f", "avx512_bf16"]}
    assert parse_cpuinfo(XEON) == {"model": "Intel(R) Xeon(R) Processor",
                                   "flags": ["avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"]}
    assert parse_cpuinfo("processor\t: 0\nflags\t\t: fpu\n") == {"model": None, "flags": []}  # some ARM kernels
    assert parse_cpuinfo("") == {"model": None, "flags": []}


def test_this_machines_cpu_is_named_in_the_benchmarks_json() -> None:
    described = cpu_description()
    assert described["model"] == cpu_name() != ""
    if "model name" in (Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""):
        assert described["model"] not in ("x86_64", "aarch64") and described["flags"] is not None
    assert described["torch_capability"] == torch.backends.cpu.get_cpu_capability()
    assert machine()["cpu"] == described  # the suite's and the HPO benchmark's machine record
