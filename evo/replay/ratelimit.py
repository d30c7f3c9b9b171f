"""Reverb-style rate limiter: keeps the learner's sampling in step with the collectors' inserts.

``diff = inserts * samples_per_insert - samples``. With ``offset = samples_per_insert *
min_size_to_sample`` a sample of ``n`` items is allowed while ``size >= min_size_to_sample`` and
``diff - n >= offset - error_buffer``; an insert of ``n`` new rows is allowed while
``diff + n * samples_per_insert <= offset + error_buffer``. So a fast learner cannot overfit a slow
collector (it must wait for new rows) and a fast collector cannot run far ahead of the learner.
Only *new* rows count as inserts: a duplicate adds no data, so it must not buy more samples.

In-process, a refused call raises :class:`RateLimited` at once (nothing else could unblock it);
the Ray service instead waits for the other side up to a timeout, then raises.
"""

from __future__ import annotations

from dataclasses import dataclass

from evo.replay.errors import RateLimited, ReplayError


@dataclass
class RateLimiter:
    """``samples_per_insert=None`` limits only by ``min_size_to_sample``."""

    min_size_to_sample: int = 1
    samples_per_insert: float | None = None
    error_buffer: float | None = None
    inserts: int = 0
    samples: int = 0

    def __post_init__(self) -> None:
        if self.min_size_to_sample < 1:
            raise ReplayError(f"min_size_to_sample must be >= 1, found {self.min_size_to_sample}")
        if self.samples_per_insert is not None:
            if self.samples_per_insert <= 0:
                raise ReplayError(f"samples_per_insert must be > 0, found {self.samples_per_insert}")
            if self.error_buffer is None:
                # Reverb's usual choice: room for a little jitter around the target ratio.
                self.error_buffer = max(1.0, self.samples_per_insert) * max(1, self.min_size_to_sample)
            if self.error_buffer < 0:
                raise ReplayError(f"error_buffer must be >= 0, found {self.error_buffer}")

    @property
    def _offset(self) -> float:
        return float(self.samples_per_insert or 0) * self.min_size_to_sample

    @property
    def diff(self) -> float:
        return self.inserts * float(self.samples_per_insert or 0) - self.samples

    def can_sample(self, n: int, size: int) -> bool:
        if size < self.min_size_to_sample:
            return False
        if self.samples_per_insert is None:
            return True
        return self.diff - n >= self._offset - self.error_buffer

    def can_insert(self, n: int) -> bool:
        if self.samples_per_insert is None or n == 0:
            return True
        return self.diff + n * self.samples_per_insert <= self._offset + self.error_buffer

    def _never(self, what: str, units: float) -> None:
        if self.samples_per_insert is not None and units > 2 * self.error_buffer:
            raise RateLimited(
                f"{what} can never pass the rate limiter: it moves the sample/insert balance by {units:g} "
                f"but the error buffer allows a band of only {2 * self.error_buffer:g}; use smaller calls "
                f"or a larger error_buffer",
                retryable=False,
            )

    def check_sample(self, n: int, size: int) -> None:
        self._never(f"a sample of {n} items", n)
        if not self.can_sample(n, size):
            if size < self.min_size_to_sample:
                raise RateLimited(
                    f"sampling refused: the store holds {size} rows, the rate limiter needs "
                    f"min_size_to_sample={self.min_size_to_sample}"
                )
            raise RateLimited(
                f"sampling refused: {self.samples} items sampled for {self.inserts} new rows inserted "
                f"(samples_per_insert={self.samples_per_insert}, error_buffer={self.error_buffer}); "
                f"insert more rows first"
            )

    def check_insert(self, n: int) -> None:
        self._never(f"an insert of {n} new rows", n * float(self.samples_per_insert or 0))
        if not self.can_insert(n):
            raise RateLimited(
                f"insert refused: {n} new rows would put inserts too far ahead of sampling "
                f"({self.inserts} inserted, {self.samples} sampled, samples_per_insert="
                f"{self.samples_per_insert}, error_buffer={self.error_buffer}); sample first"
            )

    def state(self) -> dict:
        return {
            "min_size_to_sample": self.min_size_to_sample,
            "samples_per_insert": self.samples_per_insert,
            "error_buffer": self.error_buffer,
            "inserts": self.inserts,
            "samples": self.samples,
        }

    @classmethod
    def from_state(cls, d: dict) -> RateLimiter:
        return cls(**d)
