"""`--device` for the speed benchmarks: checked once, named in their JSON, waited for in timing windows."""

from __future__ import annotations

import torch


def checked_device(device: str) -> str:
    """`device` ("cpu", "cuda", "cuda:N"), or SystemExit when it asks for CUDA on a machine without it."""
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"--device {device}: this machine has no CUDA device")
    return device


def device_name(device: str) -> str | None:
    """The GPU's name for a CUDA device (what the JSON records), None for the CPU."""
    return torch.cuda.get_device_name(device) if device.startswith("cuda") else None


def wait_for(device: str) -> None:
    """Wait for the GPU's queued work, so a timing window counts it (nothing to wait for on the CPU)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
