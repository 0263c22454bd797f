"""A worker's consumer that stopped consuming is reported not live (``reconcilers._run.stall``);
a busy, fresh or blind worker never is. Pure logic; the soak shows the whole path (a worker
whose liveness probe fails is restarted, as an orchestrator would)."""

from __future__ import annotations

from reconcilers._run.stall import Sightings, overdue, stalled

AFTER = 60.0


def _judge(**overrides):
    facts = {"now": 1000.0, "last_received": 900.0, "running": 0, "waited": 100.0,
             "stalled_after": AFTER}
    return stalled(**{**facts, **overrides})


def test_a_message_waiting_long_while_an_idle_worker_received_nothing_is_a_stall():
    why = _judge()
    assert why and "100 s" in why and "consumer stopped" in why


def test_a_worker_running_something_is_busy_not_stalled():
    assert _judge(running=1) is None


def test_a_worker_that_received_a_message_lately_is_not_stalled():
    assert _judge(last_received=990.0) is None


def test_a_message_that_has_not_waited_long_is_no_stall():
    assert _judge(waited=10.0) is None


def test_a_worker_with_no_message_waiting_is_not_stalled():
    assert _judge(waited=None) is None


def test_a_message_waits_from_when_it_was_first_seen_next_in_its_queue():
    """Timed on this worker's own clock, whatever the send time it carries says."""
    seen = Sightings()
    assert seen.waited({"celery": b"m1", "slow": None}, now=500.0) == 0.0
    assert seen.waited({"celery": b"m1", "slow": None}, now=530.0) == 30.0
    # m1 was taken; m2, next now, counts from here - as would m1 sent again (a new body).
    assert seen.waited({"celery": b"m2", "slow": None}, now=540.0) == 0.0
    assert seen.waited({"celery": b"m2", "slow": b"s1"}, now=560.0) == 20.0  # the longest


def test_an_emptied_queue_forgets_its_message():
    seen = Sightings()
    seen.waited({"celery": b"m1"}, now=500.0)
    assert seen.waited({"celery": None}, now=510.0) is None
    assert seen.waited({"celery": b"m1"}, now=520.0) == 0.0


def test_the_check_can_be_turned_off():
    assert _judge(stalled_after=0) is None


def test_a_task_is_overdue_only_past_its_hard_limit_and_the_bound_more():
    assert not overdue(started=1000.0, hard_limit=75.0, wall_now=1000.0 + 75 + AFTER,
                       stalled_after=AFTER)
    assert overdue(started=1000.0, hard_limit=75.0, wall_now=1000.0 + 76 + AFTER,
                   stalled_after=AFTER)


def test_a_task_without_a_limit_is_overdue_past_the_bound():
    """The periodic tasks (reaper, resync, timers, pruning) have none and end in seconds."""
    assert not overdue(started=1000.0, hard_limit=None, wall_now=1000.0 + AFTER,
                       stalled_after=AFTER)
    assert overdue(started=1000.0, hard_limit=None, wall_now=1001.0 + AFTER,
                   stalled_after=AFTER)


def test_nothing_is_overdue_before_it_started_or_with_the_check_off():
    assert not overdue(started=None, hard_limit=None, wall_now=1e9, stalled_after=AFTER)
    assert not overdue(started=1000.0, hard_limit=None, wall_now=1e9, stalled_after=0)
