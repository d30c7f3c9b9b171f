"""Flush denormal floats to zero where members train.

A float32 below 1.18e-38 in magnitude is *denormal* (subnormal). Intel CPUs handle an SSE/AVX
operation on one through a microcode assist that costs on the order of a hundred cycles, where a
normal operand costs a few. An EfficientZero CartPole member's backward pass starts to produce such
values a few thousand env steps into training (9 of an update's 105 matrix products returned ~7,000
of them), and from then on its updates ran about 2x slower on this project's Intel Xeon (AMX)
machine; measured in docs/efficientzero.md ("Denormals flushed to zero"). The benchmark windows
recorded earlier on an AMD EPYC show no such decline.

`flush_denormals()` sets the calling thread's FTZ and DAZ bits through `torch.set_flush_denormal`:
results below the normal range become 0, and such inputs read as 0. TensorFlow does the same on its
CPU threads; PyTorch leaves it to the user. Summed with values of a network's usual scale, numbers
this small vanish below a float32's resolution anyway: one update late in a CartPole member's
training was bitwise equal with and without flushing, and tests/test_golden.py still matches its
recording. The bits are per thread (a thread created later inherits them), so the call is made where
a member's work runs: `evo.scheduler.base.train_and_evaluate` (both schedulers), the fused trainer,
and EfficientZero's `train` / `evaluate` (a member built by hand).

Set `EVO_DENORMALS=keep` to keep denormals (a benchmark's arm measuring the old behaviour does):
the call then clears the bits instead.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["flush_denormals", "denormals_state", "ENV"]

#: the opt-out: EVO_DENORMALS=keep
ENV = "EVO_DENORMALS"

_state: dict[str, Any] = {"flushed": False, "reason": "not asked"}


def flush_denormals() -> bool:
    """Flush denormals to zero on the calling thread (FTZ + DAZ) unless `EVO_DENORMALS=keep`, in which
    case clear those bits; True when denormals are flushed afterwards. Cheap: call it per round."""
    import torch

    if os.environ.get(ENV, "").strip().lower() == "keep":
        torch.set_flush_denormal(False)
        _state.update(flushed=False, reason=f"{ENV}=keep")
        return False
    ok = bool(torch.set_flush_denormal(True))
    _state.update(flushed=ok, reason="FTZ+DAZ" if ok else "this CPU cannot flush denormals (not x86 SSE3 or AArch64)")
    return ok


def denormals_state() -> dict[str, Any]:
    """What the last `flush_denormals` call in this process did, and why."""
    return dict(_state)
