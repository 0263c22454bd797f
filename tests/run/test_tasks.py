"""Celery tasks run in real worker processes, fed through the real Redis broker."""

from __future__ import annotations

import contextlib
import time

import pytest
from django.db import DatabaseError, connection

from reconcilers._queue import workqueue
from reconcilers.models import ReconcileRecord
from reconcilers._base.reconcile import Dispatch, Key

pytestmark = pytest.mark.django_db(transaction=True)


def _children_of(pid: int) -> set[int]:
    from pathlib import Path

    children = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            children.add(int(stat.parent.name))
    return children


def _records(key: Key, count: int, timeout: float = 30) -> list[ReconcileRecord]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = list(ReconcileRecord.objects.filter(name=key.name).order_by("id"))
        if len(rows) >= count:
            return rows
        time.sleep(0.1)
    raise AssertionError(f"expected {count} records of {key}, got {len(rows)}")


def test_a_worker_process_runs_a_key_sent_through_redis(celery_worker, redis_client):
    worker = celery_worker()
    key = Key("widgets.nowhere.example.com", "ns", "sent")
    assert workqueue.add([key], "manual") == 1

    (record,) = _records(key, 1)
    assert record.outcome == "permanent", worker.log()[-3000:]
    assert record.task_id == f"{key}#1"  # the work queue's id: key and token
    pid = int(record.worker.rsplit(":", 1)[1])
    # The task ran in the worker's pool, not in this test process.
    assert pid in _children_of(worker.pid) | {worker.pid}


def test_every_retry_is_a_new_message_with_the_id_of_its_token(operator, kube):
    from kubernetes import client

    operator.start_worker()
    client.CustomObjectsApi(kube).create_namespaced_custom_object(
        "test.operator.local", "v1", operator.namespace, "probes",
        {"apiVersion": "test.operator.local/v1", "kind": "Probe",
         "metadata": {"name": "flaky"}, "spec": {"value": 1, "failTimes": 2}})
    key = Key("probes.test.operator.local", operator.namespace, "flaky")
    workqueue.add([key], "manual")

    records = _records(key, 3)
    assert [r.outcome for r in records] == ["error", "error", "success"]
    ids = [r.task_id for r in records]
    assert len(set(ids)) == 3, ids  # a retry is never the old task id again
    tokens = [int(i.rpartition("#")[2]) for i in ids]
    assert ids == [f"{key}#{t}" for t in tokens] and tokens == sorted(tokens)


def test_the_reaper_resends_only_what_the_broker_lost(redis_client, settings):
    from reconcilers._run import tasks

    settings.RECONCILERS_REDISPATCH_AFTER = 0.5
    keys = [Key("widgets.nowhere.example.com", "ns", f"k{i}") for i in range(30)]
    workqueue.add(keys, "manual")  # 30 messages wait in Redis: no worker runs
    time.sleep(1.2)
    backlog = tasks.broker_backlog()
    # The oldest waiting message says when the ledger sent it, by the database's clock.
    from reconcilers.models import WorkItem
    first = min(WorkItem.objects.values_list("dispatched_at", flat=True))
    assert backlog.other == pytest.approx(first.timestamp(), abs=1e-3)
    assert tasks.reap() == 0  # a backlog, not a loss: nothing is multiplied
    time.sleep(0.8)
    assert tasks.reap() == 0  # however long it waits

    redis_client.flushdb()  # Redis restarted empty
    assert tasks.reap() == 30
    assert redis_client.llen("celery") == 30
    assert tasks.reap() == 0  # once per redispatch interval, not per pass
    time.sleep(1.2)
    assert tasks.reap() == 0  # and the re-sent messages wait like any others


@contextlib.contextmanager
def _history_refusing_rows():
    """The history table refuses every insert while this lasts, as a full disk, a statement
    timeout or a lost connection would refuse one: a trigger in the test database."""
    with connection.cursor() as cursor:
        cursor.execute("""
            CREATE FUNCTION test_refuse_record() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN RAISE EXCEPTION 'history refuses this row'; END $$;
            CREATE TRIGGER test_refuse_record BEFORE INSERT ON reconcilers_reconcilerecord
                FOR EACH ROW EXECUTE FUNCTION test_refuse_record();""")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER test_refuse_record ON reconcilers_reconcilerecord;"
                           "DROP FUNCTION test_refuse_record();")


def test_the_reaper_ends_a_lost_run_with_its_record_or_not_at_all(redis_client, settings):
    """A run whose worker died is ended by the reaper and recorded as lost in the same
    statement: when its record cannot be written, the run is not ended either, and the next
    pass ends and records it. History never misses a run the ledger moved on from."""
    from reconcilers._run import tasks
    from reconcilers.models import WorkItem

    settings.RECONCILERS_BACKOFF_BASE = 60  # the retry stays in backoff while this test looks

    key = Key("widgets.nowhere.example.com", "ns", "doomed")
    workqueue.add([key], "manual")
    assert workqueue.claim(key, 1, "doomed-host:1", lease_seconds=0.1) is not None
    time.sleep(0.2)  # the lease expires: the worker is gone

    with _history_refusing_rows():
        with contextlib.suppress(DatabaseError):  # how the pass reports it is not the point
            tasks.reap()
        item = WorkItem.objects.get(name="doomed")
        assert (item.state, item.token) == ("running", 1), "ended without its record"
        assert not ReconcileRecord.objects.exists()

    tasks.reap()
    item = WorkItem.objects.get(name="doomed")
    assert (item.state, item.attempts) == ("backoff", 1)
    (record,) = ReconcileRecord.objects.all()
    assert (record.name, record.outcome, record.error_class, record.attempt) == (
        "doomed", "error", "WorkerLost", 1)
    assert record.triggers == ["manual"] and "lease expired" in record.error_message


def test_messages_a_worker_took_and_never_ran_are_sent_again(redis_client, settings):
    """A worker that died (or hangs) holding messages: they left the queue but no run claimed
    them, while the messages behind them still wait their turn."""
    from reconcilers._queue import broker
    from reconcilers._run import tasks

    settings.RECONCILERS_REDISPATCH_AFTER = 0.5
    taken = [Key("widgets.nowhere.example.com", "ns", f"taken{i}") for i in range(3)]
    workqueue.add(taken, "manual")
    for _ in taken:
        assert redis_client.rpop("celery") is not None
    time.sleep(1.0)
    waiting = [Key("widgets.nowhere.example.com", "ns", f"k{i}") for i in range(10)]
    workqueue.add(waiting, "manual")
    # Stale messages (a key's earlier token) at the head of the queue do not hide the loss.
    broker.publish(Dispatch(waiting[0], 99), "stale")
    assert tasks.reap() == 3
    assert tasks.reap() == 0
    assert redis_client.llen("celery") == 11 + 3


def test_one_lost_message_is_sent_again_by_the_reaper_running_in_a_worker(celery_worker,
                                                                           redis_client):
    """The reaper runs as a Celery task itself: its own message (and any other the workers
    hold at that moment) must not hide a single lost one."""
    from reconcilers._run import tasks
    from reconcilers.models import WorkItem

    key = Key("widgets.nowhere.example.com", "ns", "lost")
    workqueue.add([key], "manual")
    assert redis_client.rpop("celery") is not None  # taken by a worker that then died
    WorkItem.objects.update(dispatched_at="2000-01-01T00:00:00Z")
    celery_worker()
    tasks.reap.delay()

    (record,) = _records(key, 1)
    assert record.outcome == "permanent" and record.task_id == f"{key}#1"


def test_beat_tasks_ride_out_a_database_restart(celery_worker, redis_client):
    """A worker process keeps its database connection between tasks; when PostgreSQL drops
    it, the next beat task must reconnect, not fail on the dead connection for ever."""
    from django.db import connection

    from reconcilers._queue import broker
    from reconcilers._run import tasks
    from reconcilers.models import WorkItem

    worker = celery_worker()  # one process: every task below runs on the same connection
    tasks.resync.delay()
    worker.wait_for_log("reconcilers.resync", timeout=30)
    time.sleep(1)
    with connection.cursor() as cursor:  # PostgreSQL ends every other session
        cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                       "WHERE pid <> pg_backend_pid() AND datname = current_database()")
    key = Key("widgets.nowhere.example.com", "ns", "after-restart")

    def broker_down(dispatch, task_id):
        raise ConnectionError("Redis is restarting")

    workqueue.set_sender(broker_down)  # lost: only the reaper can bring it back
    try:
        workqueue.add([key], "manual")
    finally:
        broker.install()
    WorkItem.objects.update(dispatched_at="2000-01-01T00:00:00Z")
    for beat_task in (tasks.resync, tasks.resync, tasks.reap, tasks.reap):
        beat_task.delay()

    (record,) = _records(key, 1)
    assert record.outcome == "permanent", worker.log()[-3000:]


def test_periodic_tasks_leave_no_connection_on_a_thread_pool_workers_celery_threads(
        celery_worker, redis_client):
    """A thread-pool worker's runs hold its connections, one per run thread; its Celery
    threads only hand keys over. The reaper, resync and prune tasks run on those Celery
    threads: each must close what it opened, or every Celery thread ends up holding a
    connection too - twice the concurrency the worker's database budget is sized for."""
    from django.db import connection

    from bench.probes import established_ports
    from reconcilers._run import tasks

    worker = celery_worker(concurrency=2, pool="threads")
    sent = 0
    for _ in range(4):  # several at once, so both Celery threads take some
        for task in (tasks.reap, tasks.resync, tasks.prune_history):
            task.delay()
            sent += 1
    deadline = time.monotonic() + 30
    while worker.log().count("succeeded in") < sent:
        assert time.monotonic() < deadline, worker.log()[-2000:]
        time.sleep(0.1)
    held = len(established_ports([worker.pid], int(connection.settings_dict["PORT"])))
    assert held <= 1, f"{held} connections held by a worker with no run going"
