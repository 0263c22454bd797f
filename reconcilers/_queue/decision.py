"""What follows a run: one pure function from its result or exception to a ``Decision``.

controller-runtime's ``reconcileHandler`` switch, as data: no I/O here. The one ``Decision`` is
handed to history (what happened) and to the work queue (what happens next), so the two can
never disagree.

| run ended with                          | outcome         | attempts  | next run            |
| --------------------------------------- | --------------- | --------- | ------------------- |
| ``None`` / ``Result.done()``            | ``success``     | reset     | none                |
| ``Result.after(s)``                     | ``requeue_after``| reset    | after ``s``         |
| ``Result.again()``                      | ``requeue``     | +1        | after the backoff   |
| ``TemporaryError(delay=s)``             | ``error``       | +1        | after ``s`` or backoff |
| API error 401/403/408/409/429/5xx       | ``error``       | +1        | Retry-After or backoff |
| ``PermanentError``, API error other 4xx | ``permanent``   | reset     | none (until a change) |
| any other exception                     | ``error``       | +1        | after the backoff   |
| object gone / deleting, not ours        | ``gone`` / ``skipped`` | reset | none          |
| worker lost (``worker_lost``)           | ``error``       | +1        | after the backoff   |

An event that arrives during the run (the key is dirty) runs it again at once, whatever the
decision - except after a lost worker, whose retry always waits out the backoff: the ledger
applies both rules.
"""

from __future__ import annotations

import math
import traceback as tb

from reconcilers._base.conf import Backoff
from reconcilers._kube.kube import ApiError
from reconcilers._base.reconcile import (Decision, Outcome, PermanentError, Result,
                                         TemporaryError, Trigger)

# Longest delay a run may ask for (7 days). Past it a value is a bug (``Result.after(inf)``),
# and PostgreSQL could not store it as an interval anyway.
MAX_DELAY = 7 * 24 * 3600.0

# The error class of a run whose worker vanished: no exception of its own says so.
LOST = "WorkerLost"


def clamp_delay(delay: float | None, fallback: float) -> float:
    """A usable delay: ``fallback`` for a missing, negative or NaN one, at most ``MAX_DELAY``
    (an infinite one included)."""
    if delay is None or math.isnan(delay) or delay < 0:
        return fallback
    return min(float(delay), MAX_DELAY)


def decide(*, attempts: int, backoff: Backoff, result: Result | None = None,
           error: BaseException | None = None, decided: str = "") -> Decision:
    """The decision after a run that had failed ``attempts`` times in a row before it.

    ``decided`` is an outcome settled before user code ran (``gone``, ``skipped``).
    """
    failures = attempts + 1
    if error is not None:
        return _after_error(error, failures, backoff)
    if decided:
        return Decision(decided)
    if result is None or (not result.requeue and result.requeue_after is None):
        return Decision(Outcome.SUCCESS)
    if result.requeue_after is not None:
        # Polling is not failing: reset the backoff (client-go Forget + AddAfter).
        return Decision(Outcome.REQUEUE_AFTER, 0,
                        clamp_delay(result.requeue_after, backoff.delay(1)), Trigger.REQUEUE)
    return Decision(Outcome.REQUEUE, failures, backoff.delay(failures), Trigger.REQUEUE)


def worker_lost(*, attempts: int, backoff: Backoff, worker: str) -> Decision:
    """The decision on a run whose worker vanished mid-run (its lease expired; the reaper
    ends it): an error, retried after the key's next backoff - a reconcile that kills its
    worker every time is retried ever more slowly, never in a tight loop."""
    failures = attempts + 1
    return Decision(Outcome.ERROR, failures, backoff.delay(failures), Trigger.RETRY,
                    error_class=LOST,
                    error_message=f"worker lost: lease expired mid-run ({worker})")


def _after_error(exc: BaseException, failures: int, backoff: Backoff) -> Decision:
    error = {
        "error_class": f"{type(exc).__module__}.{type(exc).__qualname__}",
        "error_message": str(exc)[:4000],
        "traceback": "".join(tb.format_exception(exc))[-16000:],
    }
    if isinstance(exc, PermanentError):
        return Decision(Outcome.PERMANENT, **error)
    requested = None
    if isinstance(exc, TemporaryError):
        requested = exc.delay
    elif isinstance(exc, ApiError):
        if exc.permanent:
            return Decision(Outcome.PERMANENT, **error)
        requested = exc.retry_after
    delay = clamp_delay(requested, backoff.delay(failures))
    return Decision(Outcome.ERROR, failures, delay, Trigger.RETRY, **error)
