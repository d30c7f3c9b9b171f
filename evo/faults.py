"""What can go wrong with a member, and the words the engine uses for it (docs/faults.md).

* `Diverged`: raised by an agent (or by the engine's own checks after `train`/`evaluate`) when a
  loss, a parameter or the fitness is not finite. Not retried: the same seed diverges again.
* `Failure`: one failed attempt of one member in one generation, as the scheduler reports it and
  the run store records it. Its `kind` says what happened:

  - ``"lost"``: the worker running the member died (process killed, actor lost, node gone) —
    retried from the member's generation-start state up to `resources.max_failures` times;
  - ``"diverged"``: non-finite loss / parameters / fitness — not retried;
  - ``"error"``: an exception in the member's `train` or `evaluate` — not retried;
  - ``"timeout"``: no result within `resources.timeout_s` — its worker is replaced, not retried.

* `GenerationFailed`: every member of a generation failed; the run stops (exit 1).
* `ResourceRequestError`: the experiment asks the cluster for what it cannot give (exit 2).
"""

from __future__ import annotations

import math
import traceback
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["Diverged", "Failure", "GenerationFailed", "ResourceRequestError", "RETRYABLE", "check_finite",
           "describe_exception"]

#: failure kinds that are retried (the member's own code is not to blame)
RETRYABLE = frozenset({"lost"})


class Diverged(ArithmeticError):
    """A member's loss, parameters or fitness stopped being finite (e.g. an lr that explodes)."""


def check_finite(value: Any, what: str) -> float:
    """`value` if finite, else raise `Diverged` naming `what` — one cheap check per update's loss."""
    detach = getattr(value, "detach", None)  # a loss tensor: read its value without touching autograd
    value = float(detach() if detach is not None else value)
    if not math.isfinite(value):
        raise Diverged(f"{what} is {value}")
    return value


@dataclass(frozen=True)
class Failure:
    """One failed attempt: member `index` in `generation`, attempt number `attempt` (1 = first try)."""

    index: int
    kind: str
    message: str
    attempt: int = 1
    generation: int = -1
    retried: bool = False

    @property
    def retryable(self) -> bool:
        return self.kind in RETRYABLE

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Failure:
        return cls(**{k: data[k] for k in ("index", "kind", "message", "attempt", "generation", "retried") if k in data})

    def summary(self) -> str:
        return f"member {self.index} {self.kind} (attempt {self.attempt}): {self.message}"


def describe_exception(exc: BaseException) -> str:
    """`Type: message (at file:line in function)` — the innermost frame of the member's own code."""
    text = f"{type(exc).__name__}: {exc}"
    frames = traceback.extract_tb(exc.__traceback__)
    if frames:
        f = frames[-1]
        text += f" (at {f.filename}:{f.lineno} in {f.name})"
    return text


class GenerationFailed(RuntimeError):
    """Every member of generation `generation` failed; `failures` says how, member by member."""

    def __init__(self, generation: int, failures: list[Failure]) -> None:
        self.generation, self.failures = generation, list(failures)
        lines = "; ".join(f"member {f.index}: {f.kind}: {f.message}" for f in self.failures)
        super().__init__(f"every member of generation {generation} failed — {lines}")


class ResourceRequestError(ValueError):
    """The experiment asks for resources the cluster does not have. `str()` names the field, what was
    asked and what the cluster offers."""

    def __init__(self, field: str, asked: str, offered: str, hint: str = "") -> None:
        self.field, self.asked, self.offered = field, asked, offered
        message = f"{field}: asked for {asked}, but the cluster offers {offered}"
        super().__init__(message + (f"; {hint}" if hint else ""))
