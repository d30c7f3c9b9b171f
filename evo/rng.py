"""Random streams: how a run's randomness is split between members and generations, and how a
member's streams are saved and restored.

Every member owns two streams, a `torch.Generator` and a `numpy.random.Generator`, and draws
nothing from global state, so a member restored from its state continues exactly as the original
would have, in any process.

A founder's streams come from `member_seed(run seed, index)`; a child's from
`child_seed(run seed, index, birth generation)`, so an unmutated clone does not replay its
parent's training draw for draw, while the run stays exactly reproducible and resumable.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import torch

__all__ = ["member_seed", "child_seed", "generation_rng", "evaluation_seed", "new_streams", "streams_state", "restore_streams"]


def member_seed(seed: int, index: int) -> int:
    """A founder's own seed: independent streams for every (run seed, index) pair."""
    return int(np.random.SeedSequence([seed, index]).generate_state(1, dtype=np.uint64)[0] >> 1)


_CHILD_TAG = 0xC411D  # keeps child seeds apart from founders' [seed, index] sequences


def child_seed(seed: int, index: int, generation: int) -> int:
    """The seed of a child born as member `index` in `generation`: its own streams, never its parent's.

    Tagged so it never coincides with a founder's `member_seed` or a generation's stream.
    """
    sequence = np.random.SeedSequence([seed, index, generation, _CHILD_TAG])
    return int(sequence.generate_state(1, dtype=np.uint64)[0] >> 1)


def generation_rng(seed: int, generation: int) -> np.random.Generator:
    """The engine's stream for selection and mutation in `generation` (resumes make the same choices)."""
    return np.random.default_rng(np.random.SeedSequence([seed, generation, 0x5E1EC7]))


def evaluation_seed(seed: int, index: int, progress: int) -> int:
    """A seed for one evaluation's randomness, from (run seed, member index, training progress).

    Derived from the member's state, not drawn from its streams or a call counter, so
    `evaluate()` is repeatable: a checkpoint, a clone or an exported agent evaluates exactly as
    the run did.
    """
    return int(np.random.SeedSequence([seed, index, progress, 0xE7A1]).generate_state(1, dtype=np.uint64)[0] >> 1)


def new_streams(seed: int) -> tuple[torch.Generator, np.random.Generator]:
    """A fresh (torch, numpy) pair seeded from one integer."""
    return torch.Generator().manual_seed(int(seed)), np.random.default_rng(int(seed))


def streams_state(generator: torch.Generator, rng: np.random.Generator) -> dict[str, Any]:
    """Both streams' positions as checkpointable values (a uint8 tensor and a JSON string)."""
    return {"torch": generator.get_state(), "numpy": json.dumps(rng.bit_generator.state)}


def restore_streams(state: dict[str, Any]) -> tuple[torch.Generator, np.random.Generator]:
    """The streams `streams_state` saved, at exactly the saved positions."""
    generator = torch.Generator()
    generator.set_state(state["torch"])
    rng = np.random.default_rng()
    rng.bit_generator.state = json.loads(state["numpy"])
    return generator, rng
