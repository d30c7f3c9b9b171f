"""`--device` of the speed benchmarks: refused with a clear message without CUDA; on CUDA (marker
`gpu`) the fused learner section runs there and still matches the per-member loop in float64."""

from __future__ import annotations

import sys

import pytest
import torch

from benchmarks import efficientzero_speed, fused

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
