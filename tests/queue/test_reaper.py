"""The reaper's pass, on real PostgreSQL: a run whose worker vanished is ended as every run
ends, with its backoff; a message that left the broker unclaimed is sent again, once; a run
whose lease holds, and a backlog merely waiting, are left alone."""

from __future__ import annotations

import time

import pytest

from reconcilers._base.reconcile import Decision, LeaseLost
from reconcilers._queue import ledger, reaper, upkeep
from reconcilers.models import WorkItem
from tests.queue.test_ledger import LEASE, QUICK, item, key, reap

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_run_whose_worker_died_is_retried_after_backoff_when_its_lease_expires():
    (d,) = ledger.enqueue([key("a")], "added")
    assert ledger.claim(key("a"), d.token, "doomed", lease_seconds=0.2) is not None
    assert reap().lost_runs == []
    time.sleep(0.3)
    reaped = reap()
    assert [k for k, _, _ in reaped.lost_runs] == [key("a")]
    assert reaped.dispatches == []  # not at once: after the key's backoff
    assert item(key("a")).state == "backoff"
    time.sleep(QUICK.delay(1) + 0.05)
    (again,) = reap().dispatches
    claim = ledger.claim(key("a"), again.token, "w", LEASE)
    assert claim.attempts == 1
    assert "added" in claim.triggers and "retry" in claim.triggers


def test_a_key_that_keeps_losing_its_worker_backs_off_ever_longer():
    (d,) = ledger.enqueue([key("a")], "added")
    token, delays = d.token, []
    for _ in range(4):
        assert ledger.claim(key("a"), token, "doomed", lease_seconds=0.05) is not None
        time.sleep(0.1)
        reap()
        row = item(key("a"))
        delays.append((row.due_at - row.last_finished_at).total_seconds())
        time.sleep(row.due_at.timestamp() - time.time() + 0.02)
        (again,) = reap().dispatches
        token = again.token
    assert delays == pytest.approx([0.05, 0.1, 0.2, 0.4], abs=0.01)  # capped at QUICK.cap


def test_a_lost_run_changed_meanwhile_still_waits_out_its_backoff():
    """An event during a run re-runs its key at once - but not after a lost worker: a
    reconcile that kills its worker while events keep coming still backs off. What the lost
    run had taken up waits for its retry, the event's trigger and audit id too."""
    (d,) = ledger.enqueue([key("a")], "added", audit_id=7)
    assert ledger.claim(key("a"), d.token, "doomed", lease_seconds=0.1) is not None
    assert ledger.enqueue([key("a")], "modified", audit_id=8) == []  # dirty
    time.sleep(0.2)
    (lost,) = reap().lost_runs
    assert lost == (key("a"), ["added", "modified"], 1)
    row = item(key("a"))
    assert (row.state, row.dirty, row.dispatched_at) == ("backoff", False, None)
    assert row.pending_triggers == ["added", "modified", "retry"]
    assert row.pending_audit == [7, 8]
    assert row.last_error == "worker lost: lease expired mid-run (doomed)"


def test_the_reaper_leaves_a_run_whose_lease_holds():
    (d,) = ledger.enqueue([key("a")], "added")
    claim = ledger.claim(key("a"), d.token, "busy", LEASE)
    assert reap().lost_runs == []
    with pytest.raises(LeaseLost):  # ended as lost only once its lease expired
        ledger.finish(claim, Decision("error", 1, 0.1, "retry"), 300, lost=True)
    assert item(key("a")).state == "running"


def test_a_paused_key_whose_worker_died_is_not_left_running():
    (d,) = ledger.enqueue([key("a")], "added")
    assert ledger.claim(key("a"), d.token, "doomed", lease_seconds=0.05) is not None
    upkeep.set_paused([key("a")], True)
    time.sleep(0.1)
    assert [k for k, _, _ in reap().lost_runs] == [key("a")]
    assert item(key("a")).state == "backoff"


def test_the_late_finish_of_a_run_that_lost_its_lease_changes_nothing():
    (d,) = ledger.enqueue([key("a")], "added")
    slow = ledger.claim(key("a"), d.token, "slow", lease_seconds=0.1)
    time.sleep(0.2)
    reap()
    (again,) = ledger.enqueue([key("a")], "modified")  # an event: no need to wait the backoff
    fresh = ledger.claim(key("a"), again.token, "fresh", LEASE)
    with pytest.raises(LeaseLost):
        ledger.finish(slow, Decision("success", 0), 300)
    assert item(key("a")).state == "running" and item(key("a")).worker == "fresh"
    ledger.finish(fresh, Decision("success", 0), 300)


def test_a_waiting_backlog_is_not_sent_again_while_the_broker_holds_its_messages():
    keys = [key(f"k{i}") for i in range(50)]
    ledger.enqueue(keys, "added")
    WorkItem.objects.update(dispatched_at=WorkItem.objects.first().dispatched_at.replace(
        year=2000))  # waiting for ages, behind a long backlog
    sent = 0.0  # the oldest message in the queue is older still (1970, the database's clock)
    assert reap(reaper.Backlog({key("a").reconciler: sent})).dispatches == []
    assert reap(reaper.Backlog({}, other=sent)).dispatches == []
    # Their queue moved on (Redis restarted empty, say): send all again...
    assert len(reap(reaper.Backlog({key("a").reconciler: None}, other=sent)).dispatches) == 50
    assert reap(reaper.Backlog({})).dispatches == []  # ...once per interval, not per pass


def test_a_queued_key_whose_message_vanished_is_sent_again():
    (d,) = ledger.enqueue([key("a")], "added")
    assert reap().dispatches == []
    WorkItem.objects.update(dispatched_at=None)  # as if the broker lost the message
    (again,) = reap().dispatches
    assert again.token == d.token  # same token: whichever copy arrives first runs, once
