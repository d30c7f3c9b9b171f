"""What a thread that trains or evaluates members sets first, in one place.

Each setting is measured where it is defined:
- one intra-op thread for torch (process-wide): tight loops of small ops stall with two or more
  threads on small machines (ILQL measured ~10x slower with 2 threads on 2 cores);
- freed memory kept in the process (`evo.allocator`, once per process): no page faults per update;
- denormal floats flushed to zero on this thread (`evo.denormals`, per thread): they slowed the
  EfficientZero update ~2x late in training on an Intel CPU.

Schedulers call it where a worker starts and where each member's round starts; an agent calls it in
its own `train`/`evaluate` too, so a member built by hand, outside a scheduler, runs the same way.
"""

from __future__ import annotations

from evo.allocator import keep_freed_memory
from evo.denormals import flush_denormals

__all__ = ["prepare_training_thread"]


def prepare_training_thread(threads: int | None = 1) -> None:
    """Set up the calling thread to train members: `threads` intra-op threads for torch (at least 1;
    None leaves torch's setting as it is), freed memory kept, denormals flushed (unless
    `EVO_DENORMALS=keep`). Cheap enough to call every round."""
    keep_freed_memory()
    if threads is not None:
        import torch

        torch.set_num_threads(max(1, threads))
    flush_denormals()
