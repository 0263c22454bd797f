"""Celery tasks run in real worker processes, fed through the real Redis broker."""

from __future__ import annotations

import time

import pytest

from reconcilers import tasks

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


def test_a_worker_process_consumes_a_task_sent_through_redis(celery_worker, redis_client):
    worker = celery_worker()
    tasks.heartbeat.delay()

    deadline = time.monotonic() + 30
    beats: dict = {}
    while time.monotonic() < deadline and not beats:
        beats = redis_client.hgetall(tasks.HEARTBEAT_KEY)
        time.sleep(0.1)
    assert len(beats) == 1, worker.log()[-3000:]
    (identity,) = beats
    pid = int(identity.decode().rsplit(":", 1)[1])
    # The task ran in the worker's pool, not in this test process.
    assert pid in _children_of(worker.pid) | {worker.pid}
