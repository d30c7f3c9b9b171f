"""The machine a benchmark ran on: `--device` checked once, named in the JSON, waited for in timing windows;
and the CPU named by its model, since sessions land on different CPUs (an AMD EPYC, an AMX Xeon) whose
speeds on the same shapes differ, and `platform.processor()` says only "x86_64"."""

from __future__ import annotations

import platform
from pathlib import Path

import torch

# the CPU flags that decide which kernels torch picks for the learners (bf16 autocast gains on some, not others)
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


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


def parse_cpuinfo(text: str) -> dict[str, object]:
    """The first processor's model name and which of `CPU_FLAGS` it has, from /proc/cpuinfo's text."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break  # the first processor's block is enough: the cores of one machine match
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    flags = set(fields.get("flags", "").split())
    return {"model": fields.get("model name") or None, "flags": [f for f in CPU_FLAGS if f in flags]}


def read_cpuinfo() -> dict[str, object]:
    """`parse_cpuinfo` of this machine's /proc/cpuinfo; model and flags None where there is none (not Linux)."""
    try:
        return parse_cpuinfo(Path("/proc/cpuinfo").read_text())
    except OSError:
        return {"model": None, "flags": None}


def cpu_name() -> str:
    """The CPU's model name (this session's: "Intel(R) Xeon(R) Processor"), else what `platform` knows."""
    return str(cpu_description()["model"])


def cpu_description() -> dict[str, object]:
    """model (as `cpu_name`), flags (of `CPU_FLAGS`; None where /proc/cpuinfo is missing) and torch's kernel
    capability (`torch.backends.cpu.get_cpu_capability()`: "AVX512", "AVX2", ...)."""
    info = read_cpuinfo()
    return {"model": info["model"] or platform.processor() or platform.machine(), "flags": info["flags"],
            "torch_capability": torch.backends.cpu.get_cpu_capability()}
