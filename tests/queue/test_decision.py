"""What follows a run, decided in one pure function (no services needed)."""

from __future__ import annotations

import math

import pytest

from reconcilers._base.conf import Backoff
from reconcilers._queue.decision import MAX_DELAY, decide
from reconcilers._kube.kube import ApiError
from reconcilers._base.reconcile import PermanentError, Result, TemporaryError

BACKOFF = Backoff(0.005, 1000.0)


def test_success_forgets_the_failures():
    for result in (None, Result.done()):
        d = decide(attempts=7, backoff=BACKOFF, result=result)
        assert (d.outcome, d.attempts, d.delay, d.ok) == ("success", 0, None, True)


def test_requeue_after_polls_without_counting_a_failure():
    d = decide(attempts=3, backoff=BACKOFF, result=Result.after(30))
    assert (d.outcome, d.attempts, d.delay, d.trigger) == ("requeue_after", 0, 30.0, "requeue")


def test_again_retries_with_the_keys_backoff():
    d = decide(attempts=2, backoff=BACKOFF, result=Result.again())
    assert (d.outcome, d.attempts, d.delay) == ("requeue", 3, 0.02)


def test_an_exception_retries_with_backoff_and_keeps_its_traceback():
    try:
        {}["missing"]
    except KeyError as exc:
        d = decide(attempts=0, backoff=BACKOFF, error=exc)
    assert (d.outcome, d.attempts, d.delay, d.trigger) == ("error", 1, 0.005, "retry")
    assert d.error_class == "builtins.KeyError" and "missing" in d.traceback


def test_a_temporary_error_chooses_its_delay():
    d = decide(attempts=0, backoff=BACKOFF, error=TemporaryError("later", delay=7))
    assert (d.outcome, d.delay) == ("error", 7.0)


def test_a_permanent_error_stops_retrying():
    d = decide(attempts=4, backoff=BACKOFF, error=PermanentError("never"))
    assert (d.outcome, d.attempts, d.delay) == ("permanent", 0, None)


@pytest.mark.parametrize("status,outcome", [(409, "error"), (429, "error"), (503, "error"),
                                            (401, "error"), (403, "error"),
                                            (422, "permanent"), (400, "permanent")])
def test_api_errors_are_retried_only_when_they_can_pass(status, outcome):
    # 401/403 pass too: a restarted api-server refuses for a moment before its authorization
    # caches fill, and a Role granted later must not wait for the object to change.
    d = decide(attempts=0, backoff=BACKOFF, error=ApiError(status, "Reason", "msg"))
    assert d.outcome == outcome


def test_retry_after_of_the_api_server_is_honoured():
    d = decide(attempts=0, backoff=BACKOFF, error=ApiError(429, "TooMany", "slow", retry_after=3))
    assert d.delay == 3


@pytest.mark.parametrize("delay", [math.inf, math.nan, -5.0])
def test_absurd_delays_are_clamped(delay):
    d = decide(attempts=0, backoff=BACKOFF, error=TemporaryError("x", delay=delay))
    assert d.delay == (MAX_DELAY if delay == math.inf else 0.005)
    d = decide(attempts=0, backoff=BACKOFF, result=Result(requeue_after=delay))
    assert 0 <= d.delay <= MAX_DELAY


def test_gone_and_skipped_are_decided_before_user_code():
    d = decide(attempts=5, backoff=BACKOFF, decided="gone")
    assert (d.outcome, d.attempts, d.delay) == ("gone", 0, None)


def test_a_run_whose_worker_was_lost_is_an_error_retried_ever_more_slowly():
    from reconcilers._queue.decision import worker_lost

    backoff = Backoff(1.0, 8.0)
    decisions = [worker_lost(attempts=n, backoff=backoff, worker="host:1") for n in range(5)]
    assert {(d.outcome, d.trigger, d.error_class) for d in decisions} == {
        ("error", "retry", "WorkerLost")}
    assert [(d.attempts, d.delay) for d in decisions] == [
        (1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (5, 8.0)]
    assert decisions[0].error_message == "worker lost: lease expired mid-run (host:1)"
