"""The work ledger keeps client-go's WorkQueue contract, on real PostgreSQL.

Scenarios ported from client-go's ``util/workqueue/queue_test.go`` and
``rate_limiting_queue_test.go``; "processing" here is claim -> finish, as a worker does it.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest
from django.db import connection

from reconcilers._queue import cursor, ledger, reaper, upkeep
from reconcilers._base.conf import Backoff
from reconcilers._base.reconcile import Claim, Decision, Dispatch, Key, LeaseLost
from reconcilers.models import WorkItem

pytestmark = pytest.mark.django_db(transaction=True)

R = "probes.test.operator.local"
LEASE = 30.0
QUICK = Backoff(0.05, 0.4)  # lost runs' backoff in these tests


def reap(backlog: reaper.Backlog | None = None) -> reaper.Reaped:
    return reaper.reap(redispatch_after=60, backoff=QUICK, backlog=backlog)


def key(name: str, ns: str = "ns") -> Key:
    return Key(R, ns, name)


def process(k: Key, token: int, outcome: str = "success", attempts: int = 0,
            delay: float | None = None, max_countdown: float = 300) -> Dispatch | None:
    claim = ledger.claim(k, token, "test", LEASE)
    assert claim is not None, f"claim of {k} with token {token} failed"
    return ledger.finish(claim, Decision(outcome, attempts, delay), max_countdown).follow_up


def item(k: Key) -> WorkItem:
    return WorkItem.objects.get(reconciler=k.reconciler, namespace=k.namespace, name=k.name)


def test_first_add_queues_the_key_and_asks_for_one_message():
    (d,) = ledger.enqueue([key("a")], "added")
    assert d.key == key("a") and d.token == 1
    assert item(key("a")).state == "queued"


def test_repeated_adds_of_a_waiting_key_collapse_into_one_message():
    first = ledger.enqueue([key("a")], "added")
    again = [ledger.enqueue([key("a")], t) for t in ("modified", "modified", "resync")]
    assert len(first) == 1 and again == [[], [], []]
    assert item(key("a")).pending_triggers == ["added", "modified", "resync"]


def test_one_batch_with_duplicates_sends_one_message_per_key():
    dispatches = ledger.enqueue([key("a"), key("b"), key("a")], "added")
    assert sorted(d.key.name for d in dispatches) == ["a", "b"]


def test_a_stale_or_duplicate_message_claims_nothing():
    (d,) = ledger.enqueue([key("a")], "added")
    assert ledger.claim(key("a"), d.token + 1, "w", LEASE) is None  # from the future
    claim = ledger.claim(key("a"), d.token, "w", LEASE)
    assert claim is not None
    assert ledger.claim(key("a"), d.token, "w2", LEASE) is None  # redelivered duplicate
    ledger.finish(claim, Decision("success", 0), 300)
    assert ledger.claim(key("a"), d.token, "w3", LEASE) is None  # late duplicate


def test_add_while_processing_reruns_once_after_done():
    (d,) = ledger.enqueue([key("a")], "added")
    claim = ledger.claim(key("a"), d.token, "w", LEASE)
    assert ledger.enqueue([key("a")], "modified") == []  # no second message while running
    assert ledger.enqueue([key("a")], "modified") == []
    assert item(key("a")).dirty is True
    follow = ledger.finish(claim, Decision("success", 0), 300).follow_up
    assert follow is not None and follow.countdown is None
    second = ledger.claim(key("a"), follow.token, "w", LEASE)
    assert second.triggers == ["modified"]
    assert ledger.finish(second, Decision("success", 0), 300).follow_up is None
    assert item(key("a")).state == "idle"


def test_a_debounced_rerun_waits_and_gathers_every_change_meanwhile():
    """Reconciler.debounce: changes during a run are merged into one re-run, sent with a
    countdown; changes during the wait add no message (the key is queued)."""
    (d,) = ledger.enqueue([key("a")], "added")
    claim = ledger.claim(key("a"), d.token, "w", LEASE)
    ledger.enqueue([key("a")], "modified")
    follow = ledger.finish(claim, Decision("success", 0), 300, debounce=0.5).follow_up
    assert follow is not None and follow.countdown == 0.5
    row = item(key("a"))
    assert row.state == "queued" and row.due_at is not None
    assert [ledger.enqueue([key("a")], t) for t in ("modified", "resync")] == [[], []]
    second = ledger.claim(key("a"), follow.token, "w", LEASE)
    assert second.triggers == ["modified", "resync"]
    assert ledger.finish(second, Decision("success", 0), 300, debounce=0.5).follow_up is None
    assert item(key("a")).state == "idle"
    # A quiet key's first change is not delayed: debounce only spaces re-runs.
    assert ledger.enqueue([key("a")], "modified")[0].countdown is None


def test_failures_back_off_exponentially_and_success_forgets():
    backoff = Backoff(0.005, 1000)
    assert [backoff.delay(n) for n in range(1, 6)] == [0.005, 0.01, 0.02, 0.04, 0.08]
    assert backoff.delay(30) == 1000

    (d,) = ledger.enqueue([key("a")], "added")
    token = d.token
    for failures in (1, 2, 3):
        claim = ledger.claim(key("a"), token, "w", LEASE)
        assert claim.attempts == failures - 1
        follow = ledger.finish(claim, Decision("error", failures, backoff.delay(failures)),
                               300).follow_up
        assert follow.countdown == backoff.delay(failures)
        assert item(key("a")).state == "backoff"
        time.sleep(follow.countdown)
        token = follow.token
    claim = ledger.claim(key("a"), token, "w", LEASE)
    assert claim.triggers == ["retry"]
    ledger.finish(claim, Decision("success", 0), 300)
    assert item(key("a")).attempts == 0
    assert item(key("a")).last_success_at is not None


def test_requeue_after_returns_a_countdown_and_runs_when_due():
    (d,) = ledger.enqueue([key("a")], "added")
    follow = process(key("a"), d.token, "requeue_after", 0, delay=0.5)
    assert follow.countdown == 0.5
    assert item(key("a")).state == "backoff"
    assert item(key("a")).attempts == 0
    assert ledger.claim(key("a"), follow.token, "w", LEASE) is not None


def test_a_new_event_during_backoff_is_processed_without_waiting():
    (d,) = ledger.enqueue([key("a")], "added")
    retry = process(key("a"), d.token, "error", 1, delay=600)  # long backoff
    assert retry is None  # longer than the countdown limit: kept in the ledger
    (now,) = ledger.enqueue([key("a")], "modified")
    assert now.token > d.token
    claim = ledger.claim(key("a"), now.token, "w", LEASE)
    assert claim is not None and "modified" in claim.triggers
    assert claim.attempts == 1  # the failure count survives until a success


def test_delays_beyond_the_countdown_limit_wait_in_the_ledger_for_the_reaper():
    (d,) = ledger.enqueue([key("a")], "added")
    assert process(key("a"), d.token, "error", 1, delay=0.3, max_countdown=0.1) is None
    assert reap().dispatches == []  # not due yet
    time.sleep(0.4)
    (due,) = reap().dispatches
    assert ledger.claim(key("a"), due.token, "w", LEASE) is not None


def _row(claim: Claim, decision: Decision) -> ledger.Row:
    from datetime import datetime, timezone

    from reconcilers._run import history

    facts = history.RunFacts(started=datetime.now(timezone.utc), duration=0.01, worker="w",
                             task_id=f"{claim.key}#{claim.token}", obj=None, phase="reconcile")
    return history.as_row(history.new_values(claim, decision, facts))


def test_ending_a_run_can_claim_the_next_key_in_the_same_statement():
    """client-go's Done then Get, in one round trip: the first run ends (and its re-run for an
    event seen meanwhile is asked for), its record is written, and the next key is claimed -
    or, for a stale message, nothing is."""
    from reconcilers.models import ReconcileRecord

    da, db, dc = ledger.enqueue([key("a"), key("b"), key("c")], "added")
    first = ledger.claim(key("a"), da.token, "w", LEASE)
    ledger.enqueue([key("a")], "modified")  # seen during the run: dirty
    then = ledger.ClaimRequest(key("b"), db.token, "w", LEASE)
    follow, record_id, second = ledger.finish(
        first, Decision("success", 0), 300, 0.0, _row(first, Decision("success", 0)), then)
    assert follow[:2] == (key("a"), da.token + 1) and record_id > 0
    assert second is not None and second.key == key("b") and second.triggers == ["added"]
    assert item(key("b")).state == "running" and item(key("a")).state == "queued"
    assert ReconcileRecord.objects.get(pk=record_id).name == "a"

    stale = ledger.ClaimRequest(key("c"), dc.token + 1, "w", LEASE)
    follow, _, nothing = ledger.finish(
        second, Decision("success", 0), 300, 0.0, _row(second, Decision("success", 0)), stale)
    assert follow is None and nothing is None
    assert item(key("b")).state == "idle" and item(key("c")).state == "queued"
    with pytest.raises(ValueError):  # its own key: that message waits for this run's end
        ledger.finish(second, Decision("success", 0), 300, 0.0,
                                          _row(second, Decision("success", 0)),
                                          ledger.ClaimRequest(key("b"), 1, "w", LEASE))


def test_a_run_that_lost_its_lease_still_hands_on_the_key_it_claimed_next():
    """The finish finds the run's lease gone (the reaper took the key) and changes nothing for
    it - no record - but the next key's claim in the same statement stands and is handed on
    with the ``LeaseLost``: dropping it would leave that key running with no one running it."""
    from reconcilers.models import ReconcileRecord

    da, db = ledger.enqueue([key("a"), key("b")], "added")
    slow = ledger.claim(key("a"), da.token, "slow", lease_seconds=0.1)
    time.sleep(0.2)
    reap()
    with pytest.raises(LeaseLost) as lost:
        ledger.finish(slow, Decision("success", 0), 300, 0.0,
                                          _row(slow, Decision("success", 0)),
                                          ledger.ClaimRequest(key("b"), db.token, "w", LEASE))
    assert lost.value.next_claim is not None and lost.value.next_claim.key == key("b")
    assert item(key("b")).state == "running" and item(key("a")).state == "backoff"
    assert not ReconcileRecord.objects.exists()


def test_a_claim_knows_locally_when_its_lease_may_be_gone():
    (d,) = ledger.enqueue([key("a")], "added")
    claim = ledger.claim(key("a"), d.token, "w", lease_seconds=1.2)
    claim.check_held()
    time.sleep(0.3)
    with pytest.raises(LeaseLost):
        claim.check_held()  # one second of safety before the database's expiry


def test_relist_sized_enqueue_is_a_few_statements():
    from django.test.utils import CaptureQueriesContext

    keys = [key(f"obj-{i}") for i in range(5000)]
    with CaptureQueriesContext(connection) as q:
        dispatches = ledger.enqueue(keys, "added", batch=1000)
    assert len(dispatches) == 5000
    assert len(q.captured_queries) == 5  # 1,000 keys per statement


def test_many_producers_and_consumers_never_process_a_key_twice_at_once():
    """client-go TestBasic: producers add keys repeatedly, consumers drain concurrently."""
    names = [f"k{i}" for i in range(20)]
    in_flight: Counter = Counter()
    overlaps: list[str] = []
    runs: Counter = Counter()
    lock = threading.Lock()
    pending: list[Dispatch] = []
    done = threading.Event()

    def producer(n: int) -> None:
        for i in range(50):
            ds = ledger.enqueue([key(names[(n * 7 + i) % len(names)])], "modified")
            with lock:
                pending.extend(ds)
        connection.close()

    def consumer() -> None:
        while not done.is_set() or pending:
            with lock:
                d = pending.pop() if pending else None
            if d is None:
                time.sleep(0.001)
                continue
            claim = ledger.claim(d.key, d.token, threading.current_thread().name, LEASE)
            if claim is None:
                continue
            with lock:
                in_flight[d.key] += 1
                if in_flight[d.key] > 1:
                    overlaps.append(d.key.name)
                runs[d.key] += 1
            time.sleep(0.001)
            with lock:
                in_flight[d.key] -= 1
            follow = ledger.finish(claim, Decision("success", 0), 300).follow_up
            if follow is not None:
                with lock:
                    pending.append(follow)
        connection.close()

    producers = [threading.Thread(target=producer, args=(n,)) for n in range(5)]
    consumers = [threading.Thread(target=consumer, name=f"c{n}") for n in range(4)]
    for t in producers + consumers:
        t.start()
    for t in producers:
        t.join()
    done.set()
    for t in consumers:
        t.join(60)
    assert overlaps == []
    assert set(runs) == {key(n) for n in names}
    assert WorkItem.objects.exclude(state="idle").count() == 0
    assert sum(runs.values()) < 5 * 50  # dedup collapsed adds


def _prepared() -> list[str]:
    with connection.cursor() as db:
        db.execute("SELECT statement FROM pg_prepared_statements")
        return [s for (s,) in db.fetchall() if cursor.TABLE in s]


@pytest.mark.parametrize("prepared", [True, False])
def test_the_ledgers_statements_are_prepared_once_per_connection_unless_turned_off(
        prepared, settings):
    """Planning the ledger's statements cost PostgreSQL more than running them; prepared, a
    connection plans each once. Off (``RECONCILERS_PREPARED_STATEMENTS=0``) for a pooler
    that cannot keep prepared statements: the ledger then works without any."""
    settings.RECONCILERS_PREPARED_STATEMENTS = prepared
    connection.close()  # a fresh session: nothing prepared yet
    for round_ in range(3):
        (d,) = ledger.enqueue([key("a")], "modified")
        assert process(d.key, d.token) is None
    statements = _prepared()
    if prepared:
        assert any("INSERT INTO" in s for s in statements)  # enqueue
        assert any("state = 'running', started_at = now()" in s for s in statements)  # claim
        assert len(statements) == len(set(statements))  # each once, reused by later rounds
    else:
        assert statements == []
    assert WorkItem.objects.get(name="a").state == "idle"


def _keys_in_reverse_id_order(n: int) -> list[Key]:
    """``n`` keys whose rows were created last-key-first: id order is the reverse of key
    order, as after objects are created in any order the watcher does not choose."""
    keys = [key(f"k{i:04d}") for i in range(n)]
    for k in reversed(keys):
        ledger.enqueue([k], "added")
    return keys


def _race(*steps) -> list[BaseException]:
    """Run each step in its own thread - its own database connection - all at once; return
    what they raised."""
    errors: list[BaseException] = []
    start = threading.Barrier(len(steps))

    def run(step) -> None:
        try:
            start.wait()
            step()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(s,)) for s in steps]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return errors


@pytest.mark.slow
def test_enqueue_and_pause_over_the_same_rows_never_deadlock():
    """Both statements lock many rows; locked in two orders (keys by name, the other by id),
    PostgreSQL finds a deadlock within a few rounds and kills one of them."""
    keys = _keys_in_reverse_id_order(400)

    def enqueue() -> None:
        for _ in range(30):
            ledger.enqueue(keys, "modified")

    def pause() -> None:
        for i in range(30):
            upkeep.set_paused(keys, i % 2 == 0)

    assert _race(enqueue, pause) == []


@pytest.mark.slow
def test_enqueue_and_reap_over_the_same_rows_never_deadlock():
    keys = _keys_in_reverse_id_order(400)
    for _ in range(15):
        WorkItem.objects.update(state="running", lease_expires_at="2000-01-01T00:00:00Z",
                                worker="gone", paused=False)
        assert _race(lambda: ledger.enqueue(keys, "modified"), reap) == []


def test_ending_a_run_and_claiming_the_next_key_never_deadlocks_with_an_enqueue():
    """That statement locks two rows, the ended run's and the next key's. An enqueue of both
    (one statement, or as here one transaction to hold the window open) locks them in key
    order: the next key's ("a-...") first. Ending the run must not hold "z-..." meanwhile."""
    from django.db import transaction

    ending, following = key("z-ending"), key("a-next")
    decision = Decision("success", 0)
    for _ in range(3):
        WorkItem.objects.update(state="idle", dirty=False, pending_triggers=[])
        (de,) = ledger.enqueue([ending], "added")
        running = ledger.claim(ending, de.token, "w", LEASE)
        (dn,) = ledger.enqueue([following], "added")
        then = ledger.ClaimRequest(following, dn.token, "w", LEASE)
        holds_next = threading.Event()

        def enqueue_in_key_order() -> None:
            with transaction.atomic():
                ledger.enqueue([following], "modified")
                holds_next.set()
                time.sleep(0.3)  # the run ends meanwhile
                ledger.enqueue([ending], "modified")

        def end_and_claim() -> None:
            assert holds_next.wait(5)
            ledger.finish(running, decision, 300, 0.0,
                                              _row(running, decision), then)

        assert _race(enqueue_in_key_order, end_and_claim) == []


def test_the_reapers_statements_never_deadlock_with_an_enqueue():
    """The reaper's passes (lost runs, lost messages, due retries) each lock rows in key
    order; held together in one transaction, the first pass's "z-..." and the second's
    "a-..." were not in key order any more against an enqueue of both."""
    from django.db import transaction

    lost, waiting = key("z-lost"), key("a-waiting")
    for _ in range(3):
        WorkItem.objects.update(state="idle", dirty=False, pending_triggers=[])
        (dl,) = ledger.enqueue([lost], "added")
        ledger.claim(lost, dl.token, "gone", LEASE)
        ledger.enqueue([waiting], "added")
        WorkItem.objects.filter(name=lost.name).update(lease_expires_at="2000-01-01T00:00:00Z")
        WorkItem.objects.filter(name=waiting.name).update(dispatched_at="2000-01-01T00:00:00Z")
        holds_first = threading.Event()

        def enqueue_in_key_order() -> None:
            with transaction.atomic():
                ledger.enqueue([waiting], "modified")
                holds_first.set()
                time.sleep(0.3)  # the reaper runs meanwhile
                ledger.enqueue([lost], "modified")

        def reap_meanwhile() -> None:
            assert holds_first.wait(5)
            time.sleep(0.05)
            reap()

        assert _race(enqueue_in_key_order, reap_meanwhile) == []
