"""What a reconcile returns or raises - the control words of the loop.

``reconcile()`` returns ``None``/``Result.done()`` (converged), ``Result.again()`` (run again
soon, with backoff), ``Result.after(seconds)`` (poll later; resets the backoff), or raises
``TemporaryError`` (retry, optionally after ``delay``), ``PermanentError`` (record it, stop
retrying until the object changes) or any other exception (retry with backoff). What each one
leads to is decided in one place: ``decision.decide``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Result:
    requeue: bool = False
    requeue_after: float | None = None

    @classmethod
    def done(cls) -> "Result":
        return cls()

    @classmethod
    def again(cls) -> "Result":
        """Run again with the key's backoff (client-go's ``Result{Requeue: true}``)."""
        return cls(requeue=True)

    @classmethod
    def after(cls, seconds: float) -> "Result":
        """Run again after ``seconds``; the way to poll (client-go's ``RequeueAfter``)."""
        if seconds < 0:
            raise ValueError("requeue_after must be >= 0")
        return cls(requeue_after=float(seconds))


class ReconcileError(Exception):
    """Base of the control-word exceptions."""


class TemporaryError(ReconcileError):
    """Retry later: after ``delay`` seconds if given, else after the key's backoff."""

    def __init__(self, message: str = "", delay: float | None = None):
        super().__init__(message)
        self.delay = delay


class PermanentError(ReconcileError):
    """The spec can never work as it is: record it and stop retrying until the object changes."""
