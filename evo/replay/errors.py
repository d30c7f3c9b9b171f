"""Errors raised by the replay store.

One base class so callers can catch everything the store refuses with a single ``except``.
"""

from __future__ import annotations


class ReplayError(Exception):
    """A replay-store operation was refused: bad batch, unknown key, missing snapshot, ..."""


class RateLimited(ReplayError):
    """The rate limiter refused an insert or a sample (in-process: at once; service: after a timeout).

    ``retryable`` is False when the call could never pass (e.g. a batch wider than the error
    buffer), so the service fails it at once instead of waiting.
    """

    def __init__(self, message: str, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable

    def __reduce__(self):  # keep ``retryable`` across pickling (Ray)
        return (type(self), (str(self), self.retryable))
