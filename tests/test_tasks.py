"""Celery tasks run in real worker processes, fed through the real Redis broker."""

from __future__ import annotations

import time

import pytest

from reconcilers import workqueue
from reconcilers.models import ReconcileRecord
from reconcilers.vocab import Key

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
    from reconcilers import tasks
    from reconcilers.models import WorkItem

    keys = [Key("widgets.nowhere.example.com", "ns", f"k{i}") for i in range(30)]
    workqueue.add(keys, "manual")  # 30 messages wait in Redis: no worker runs
    assert tasks.broker_in_flight() == 30
    WorkItem.objects.update(dispatched_at="2000-01-01T00:00:00Z")  # waiting for ages
    assert tasks.reap() == 0  # a backlog, not a loss: nothing is multiplied
    redis_client.flushdb()  # Redis restarted empty
    assert tasks.reap() == 30
    assert tasks.broker_in_flight() == 30
    WorkItem.objects.update(dispatched_at="2000-01-01T00:00:00Z")
    assert tasks.reap() == 0


def test_messages_a_dead_worker_took_long_ago_count_as_lost(redis_client, settings):
    import json
    import time as clock

    from reconcilers import tasks
    from reconcilers.models import WorkItem

    keys = [Key("widgets.nowhere.example.com", "ns", f"k{i}") for i in range(10)]
    workqueue.add(keys, "manual")
    # A worker took 3 messages (Redis keeps them in its unacked set) and then died.
    for tag in range(3):
        message = redis_client.rpop("celery")
        redis_client.hset("unacked", f"tag{tag}", json.dumps([message.decode(), "", "celery"]))
        redis_client.zadd("unacked_index", {f"tag{tag}": clock.time() - 3600})
    WorkItem.objects.update(dispatched_at="2000-01-01T00:00:00Z")
    assert tasks.broker_in_flight() == 7
    assert tasks.reap() == 10  # the lost three come back (with the rest, once)

    # Taken just now by a live worker: still deliverable, nothing is sent again.
    redis_client.zadd("unacked_index", {f"tag{t}": clock.time() for t in range(3)})
    WorkItem.objects.update(dispatched_at="2000-01-01T00:00:00Z")
    assert tasks.broker_in_flight() == 20
    assert tasks.reap() == 0
