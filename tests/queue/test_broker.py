"""The work queue's messages, published through the project's Celery app: what Celery's
settings, signals and routes make of them, consumed and run by real Celery workers."""

from __future__ import annotations

import json
import time

import pytest

from reconcilers._queue import broker, workqueue
from reconcilers._base.conf import RunLimits
from reconcilers._authoring.registry import registry
from reconcilers._base.reconcile import Dispatch, Key

pytestmark = pytest.mark.django_db(transaction=True)

UNREGISTERED = "widgets.nowhere.example.com"


def _probe() -> str:
    return next(n for n in registry.names() if n.startswith("probes."))


def _sent(redis_client, queue: str, send) -> dict:
    redis_client.delete(queue)
    send()
    (raw,) = redis_client.lrange(queue, 0, -1)
    redis_client.delete(queue)
    return json.loads(raw)


def test_each_kind_of_message_is_a_celery_task_message_with_its_limits(redis_client):
    """What a worker needs from each message: its task, id, arguments, time limits, countdown
    and the send time the reaper reads."""
    queue = broker.default_queue()
    probe = _probe()
    limits = RunLimits.of(registry.get_class(probe).timeout)
    key = Key(probe, "ns", "one")
    before = time.time()
    one = _sent(redis_client, queue, lambda: broker.publish(Dispatch(key, 3), "id-1"))
    headers = one["headers"]
    assert (headers["task"], headers["id"]) == (f"reconcile:{probe}", "id-1")
    assert headers["timelimit"] == [limits.hard, limits.soft]
    assert headers["eta"] is None and headers["ignore_result"] is True
    assert before <= headers[broker.SENT_AT] <= time.time()
    assert one["properties"]["delivery_info"]["routing_key"] == queue

    later = _sent(redis_client, queue,
                  lambda: broker.publish(Dispatch(key, 3, countdown=30), "id-2"))
    assert later["headers"]["eta"] is not None

    keys = [Dispatch(Key(probe, "ns", n), 1) for n in ("a", "b")]
    shared = _sent(redis_client, queue, lambda: broker.publish_many(keys, "id-3"))
    assert shared["headers"]["timelimit"] == [3 * limits.hard + limits.hard, 3 * limits.hard]
    assert shared["headers"]["kwargsrepr"] == "{'keys': <2 keys>}"

    gone = _sent(redis_client, queue, lambda: broker.publish(
        Dispatch(Key(UNREGISTERED, "ns", "gone"), 1), "id-4"))
    assert gone["headers"]["task"] == broker.UNREGISTERED_TASK
    periodic = _sent(redis_client, queue, lambda: broker.send_periodic("reconcilers.reap"))
    assert periodic["headers"]["task"] == "reconcilers.reap"


def test_celerys_publish_signals_see_every_message_of_the_work_queue(redis_client):
    """``before_task_publish`` / ``after_task_publish`` (Sentry's and OpenTelemetry's hooks)
    fire for the work queue's messages, batched or not, and may add headers."""
    from celery import signals

    seen: list[tuple[str, str]] = []

    def stamp(sender=None, headers=None, routing_key=None, **_):
        seen.append((sender, routing_key))
        headers["traceparent"] = "00-trace-span-01"

    signals.before_task_publish.connect(stamp)
    queue = broker.default_queue()
    try:
        probe = _probe()
        one = _sent(redis_client, queue, lambda: broker.publish(
            Dispatch(Key(probe, "ns", "signal"), 1), "id-s"))
        redis_client.delete(queue)
        with broker.batch():
            for n in range(3):
                broker.publish(Dispatch(Key(probe, "ns", f"b{n}"), 1), f"id-b{n}")
        assert redis_client.llen(queue) == 3
    finally:
        signals.before_task_publish.disconnect(stamp)
        redis_client.delete(queue)
    assert seen == [(f"reconcile:{probe}", queue)] * 4
    assert one["headers"]["traceparent"] == "00-trace-span-01"


def test_a_reconcilers_own_queue_wins_and_celerys_routes_place_the_rest(monkeypatch):
    from celery import current_app
    from celery.app import routes

    probe = _probe()
    table = routes.prepare({f"reconcile:{probe}": {"queue": "routed"}})
    monkeypatch.setattr(current_app.amqp, "router", routes.Router(
        table, current_app.amqp.queues, True, app=current_app))
    assert broker.queue_for(probe) == "routed"
    monkeypatch.setattr(registry.get_class(probe), "queue", "its-own")
    assert broker.queue_for(probe) == "its-own"


def test_without_a_celery_app_the_work_queue_refuses_to_send(monkeypatch):
    """A project that never loads its Celery app would send to Celery's unconfigured
    fallback: refused at start with what to do."""
    from celery import _state

    from reconcilers._queue.checks import check_broker

    assert check_broker(None) == []
    monkeypatch.setattr(_state._tls, "current_app", None)
    monkeypatch.setattr(_state, "default_app", None)
    (error,) = check_broker(None)
    assert error.id == "reconcilers.E005" and "from .celery import app" in error.msg


def test_a_worker_runs_keys_periodic_tasks_and_countdowns_the_broker_sent(celery_worker,
                                                                           redis_client):
    from reconcilers.models import ReconcileRecord

    worker = celery_worker()
    now, later = Key(UNREGISTERED, "ns", "now"), Key(UNREGISTERED, "ns", "later")
    held: list[Dispatch] = []
    workqueue.set_sender(lambda dispatch, task_id: held.append(dispatch))
    try:
        workqueue.add([now, later], "manual")  # queued in the ledger, held back here
    finally:
        broker.install()
    by_name = {d.key.name: d for d in held}
    with broker.batch():
        broker.publish(by_name["now"], workqueue.task_id(now, by_name["now"].token))
        broker.publish(by_name["later"]._replace(countdown=2),
                       workqueue.task_id(later, by_name["later"].token))
    broker.send_periodic("reconcilers.reap")
    deadline = time.monotonic() + 30
    while ReconcileRecord.objects.filter(name__in=["now", "later"]).count() < 2:
        assert time.monotonic() < deadline, worker.log()[-3000:]
        time.sleep(0.1)
    first, second = ReconcileRecord.objects.order_by("started_at")
    assert (first.name, second.name) == ("now", "later")
    assert (second.started_at - first.started_at).total_seconds() >= 1.5  # its countdown
    assert second.task_id == workqueue.task_id(later, by_name["later"].token)
    deadline = time.monotonic() + 30
    while "Task reconcilers.reap" not in worker.log() or "succeeded" not in worker.log():
        assert time.monotonic() < deadline, worker.log()[-3000:]
        time.sleep(0.1)
