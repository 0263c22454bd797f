"""The enqueuer (``_watch.enqueuer``): the streams' keys written to the real ledger in batches -
gathered while a batch is written, none waiting for a window when keys trickle in - finished
when stopped, and its line bounded while nothing drains it."""

from __future__ import annotations

import threading

import pytest

from reconcilers._watch.enqueuer import Enqueuer
from reconcilers.models import WorkItem
from tests.helpers import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_enqueuer_batches_what_waits(redis_client):
    from reconcilers._base.reconcile import Key

    stop = threading.Event()
    enqueuer = Enqueuer(stop)
    for i in range(500):
        enqueuer.put(Key("configmaps", "ns", f"cm{i}"), "added")
    enqueuer.start()
    wait_for(lambda: WorkItem.objects.count() == 500, what="500 keys")
    stop.set()
    enqueuer.join(5)
    assert enqueuer.batches <= 2


def _batches_for(window: float, prefix: str, count: int, every: float) -> int:
    """Keys put one every ``every`` seconds, as watch events: how many batches."""
    import time

    from django.test import override_settings

    from reconcilers._base.reconcile import Key

    stop = threading.Event()
    with override_settings(RECONCILERS_ENQUEUE_WINDOW=window):
        enqueuer = Enqueuer(stop)
        enqueuer.start()
        for i in range(count):
            enqueuer.put(Key("configmaps", "ns", f"{prefix}{i}"), "added")
            time.sleep(every)
    wait_for(lambda: WorkItem.objects.filter(name__startswith=prefix).count() == count,
             what=f"{count} keys")
    stop.set()
    enqueuer.join(5)
    return enqueuer.batches


def test_a_stream_of_events_is_gathered_into_a_few_batches(
        redis_client):
    # 0.3 s of keys, faster than one statement each keeps up with: once keys come in while
    # a batch is written, the next one gathers for the window.
    gathered = _batches_for(0.1, "w", 150, 0.002)
    at_once = _batches_for(0, "n", 150, 0.002)
    assert gathered <= 10 and gathered * 3 <= at_once, (gathered, at_once)


def test_a_trickle_of_events_waits_for_no_window(redis_client):
    # Keys 60 ms apart find the enqueuer idle: each goes at once, none waits the (long)
    # window - a key's latency is its statement, not the window.
    import time

    started = time.monotonic()
    batches = _batches_for(0.5, "t", 8, 0.06)
    assert batches == 8
    assert time.monotonic() - started < 8 * 0.06 + 0.5 + 2, "a key waited for the window"


def test_a_stopped_enqueuer_finishes_what_is_queued_then_ends(redis_client):
    from reconcilers._base.reconcile import Key

    enqueuer = Enqueuer(threading.Event())
    for i in range(50):
        enqueuer.put(Key("configmaps", "ns", f"last{i}"), "added")
    enqueuer.stop()  # before it even started: the keys still reach the ledger
    enqueuer.start()
    enqueuer.join(10)
    assert not enqueuer.is_alive()
    assert WorkItem.objects.filter(name__startswith="last").count() == 50


def test_the_enqueuer_opens_its_database_connection_before_the_first_keys(redis_client):
    from django.db import connection

    opened = []

    def probe():
        from reconcilers._queue import workqueue

        workqueue.connect()  # what the enqueuer's thread does first
        opened.append(connection.connection is not None)
        connection.close()

    thread = threading.Thread(target=probe)
    thread.start()
    thread.join(30)
    assert opened == [True]


def test_the_enqueuers_line_is_bounded_and_a_stop_frees_a_waiting_stream():
    """While PostgreSQL is down nothing drains it: a stream waits at ``put`` instead of piling
    up changes without end, and a stop releases it (the journal keeps what was not put)."""
    import time

    from reconcilers._base.reconcile import Key

    stop = threading.Event()
    enqueuer = Enqueuer(stop, backlog=3)  # never started: nothing drains it
    for i in range(3):
        enqueuer.put(Key("configmaps", "ns", f"k{i}"), "added")
    blocked = threading.Thread(target=enqueuer.put, args=(Key("configmaps", "ns", "k3"), "added"))
    blocked.start()
    time.sleep(1)
    assert blocked.is_alive() and enqueuer.queue.qsize() == 3
    enqueuer.stop()
    blocked.join(2)
    assert not blocked.is_alive()


def _flush_one_by_one(enqueuer: Enqueuer, prefix: str, count: int) -> None:
    """``count`` keys, each put once the one before is in the ledger: a flush each."""
    from reconcilers._base.reconcile import Key

    for i in range(count):
        enqueuer.put(Key("configmaps", "ns", f"{prefix}{i}"), "added")
        wait_for(lambda: WorkItem.objects.filter(name=f"{prefix}{i}").exists(),
                 what=f"key {i}", timeout=10)


def test_a_trickle_of_flushes_checks_its_connection_at_most_once_a_second(
        redis_client, monkeypatch):
    """Each flush is one enqueue statement: the connection's health check (a ``SELECT 1``
    round trip with ``CONN_HEALTH_CHECKS``) runs at most once a second, not before every
    flush - at 100 events a second it was a second statement for each."""
    import time

    from django.db import connections

    checks: list[str] = []
    wrapper_class = type(connections["default"])
    real = wrapper_class.is_usable

    def counted(wrapper):
        checks.append(threading.current_thread().name)
        return real(wrapper)

    monkeypatch.setattr(wrapper_class, "is_usable", counted)
    stop = threading.Event()
    enqueuer = Enqueuer(stop)
    enqueuer.start()
    started = time.monotonic()
    _flush_one_by_one(enqueuer, "h", 20)
    took = time.monotonic() - started
    stop.set()
    enqueuer.join(5)
    mine = [name for name in checks if name == enqueuer.name]
    assert enqueuer.batches >= 20
    assert len(mine) <= 1 + took, (len(mine), took)


def test_a_flush_on_a_connection_the_database_dropped_lands_at_once(redis_client):
    """The check once a second must not cost a broken connection its keys' time: the first
    statement on a connection the database ended (a restart, a failover) fails, and the flush
    runs again at once on a new connection, not after a retry's backoff."""
    import time

    from django.db import connection

    stop = threading.Event()
    enqueuer = Enqueuer(stop)
    enqueuer.start()
    _flush_one_by_one(enqueuer, "before", 1)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                       "WHERE datname = current_database() AND pid <> pg_backend_pid()")
    connection.close()  # the test's own connection was not ended; the enqueuer's was
    started = time.monotonic()
    _flush_one_by_one(enqueuer, "after", 1)
    took = time.monotonic() - started
    stop.set()
    enqueuer.join(5)
    assert took < 0.5, f"the flush after the drop waited {took:.2f}s (a retry's backoff)"
