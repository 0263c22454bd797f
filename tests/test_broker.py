"""The work queue's messages, written to Redis without Celery: the same messages Celery would
write, consumed by kombu and run by real Celery workers."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reconcilers import broker, workqueue
from reconcilers.conf import RunLimits
from reconcilers.registry import registry
from reconcilers.vocab import Key

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parent.parent
UNREGISTERED = "widgets.nowhere.example.com"


def _probe() -> str:
    return next(n for n in registry.names() if n.startswith("probes."))


def _shape(raw: bytes) -> tuple[dict, list, str | None]:
    """A message without what differs between any two sends: ids of the delivery and the
    sender, the send time; the ETA apart (it is a time)."""
    message = json.loads(raw)
    body = json.loads(base64.b64decode(message.pop("body")))
    headers, properties = message["headers"], message["properties"]
    for name in ("origin", broker.SENT_AT):
        headers.pop(name)
    for name in ("reply_to", "delivery_tag",
                 # Celery copies its log forms into the properties too; no consumer reads them.
                 "argsrepr", "kwargsrepr"):
        properties.pop(name, None)
    return message, body, headers.pop("eta")


def _sent(redis_client, queue: str, send) -> bytes:
    redis_client.delete(queue)
    send()
    (raw,) = redis_client.lrange(queue, 0, -1)
    redis_client.delete(queue)
    return raw


def test_a_message_is_what_celery_itself_sends(redis_client):
    """Each kind of message the work queue sends, written once by ``broker`` and once by
    Celery's own ``apply_async`` / ``send_task``: the same message, field for field."""
    from celery import current_app

    from reconcilers import tasks

    queue = broker.default_queue()
    probe = _probe()
    limits = RunLimits.of(registry.get_class(probe).timeout)
    key = Key(probe, "ns", "one")
    kwargs = {"key": str(key), "token": 3}
    keys = [[str(Key(probe, "ns", n)), 1] for n in ("a", "b")]
    backstop = 3 * limits.hard
    gone = Key(UNREGISTERED, "ns", "gone")
    cases = {
        "one key": (
            lambda: broker.publish(workqueue.Dispatch(key, 3), "id-1"),
            lambda: tasks.task_for(probe).apply_async(
                kwargs=kwargs, kwargsrepr=repr(kwargs), argsrepr="()", task_id="id-1",
                queue=queue, headers={broker.SENT_AT: 0.0})),
        "a countdown": (
            lambda: broker.publish(workqueue.Dispatch(key, 3, countdown=30), "id-2"),
            lambda: tasks.task_for(probe).apply_async(
                kwargs=kwargs, kwargsrepr=repr(kwargs), argsrepr="()", task_id="id-2",
                queue=queue, headers={broker.SENT_AT: 0.0}, countdown=30)),
        "keys sharing a message": (
            lambda: broker.publish_many([workqueue.Dispatch(Key.parse(k), t) for k, t in keys],
                                        "id-3"),
            lambda: tasks.task_for(probe).apply_async(
                kwargs={"keys": keys}, kwargsrepr="{'keys': <2 keys>}", argsrepr="()",
                task_id="id-3", queue=queue, headers={broker.SENT_AT: 0.0},
                soft_time_limit=backstop, time_limit=backstop + limits.hard)),
        "an unregistered reconciler's key": (
            lambda: broker.publish(workqueue.Dispatch(gone, 1), "id-4"),
            lambda: tasks.reconcile_unregistered.apply_async(
                kwargs={"key": str(gone), "token": 1},
                kwargsrepr=repr({"key": str(gone), "token": 1}), argsrepr="()",
                task_id="id-4", queue=queue, headers={broker.SENT_AT: 0.0})),
    }
    for case, (ours, celery) in cases.items():
        mine, theirs = _shape(_sent(redis_client, queue, ours)), _shape(
            _sent(redis_client, queue, celery))
        assert mine[:2] == theirs[:2], case
        if theirs[2] is None:
            assert mine[2] is None, case
        else:
            from datetime import datetime

            gap = datetime.fromisoformat(mine[2]) - datetime.fromisoformat(theirs[2])
            assert abs(gap.total_seconds()) < 5, case

    periodic = _shape(_sent(redis_client, queue, lambda: broker.send_periodic("reconcilers.reap")))
    celery = _shape(_sent(redis_client, queue, lambda: current_app.send_task(
        "reconcilers.reap", headers={broker.SENT_AT: 0.0}, kwargs={}, kwargsrepr="{}")))
    for shape in (periodic, celery):  # the ids are made by each sender
        for name in ("id", "root_id"):
            shape[0]["headers"].pop(name)
        shape[0]["properties"].pop("correlation_id")
    assert periodic[:2] == celery[:2]
    assert periodic[0]["properties"]["delivery_info"]["routing_key"] == queue


def test_kombu_reads_a_message_from_a_prefixed_queue(redis_client, settings):
    """``global_keyprefix`` moves every kombu key; a consumer configured with it receives
    what ``broker`` sent."""
    from kombu import Connection

    settings.CELERY_BROKER_TRANSPORT_OPTIONS = {"global_keyprefix": "tenant-a:"}
    broker.publish(workqueue.Dispatch(Key(UNREGISTERED, "ns", "prefixed"), 7), "id-p")
    assert redis_client.llen("tenant-a:celery") == 1
    with Connection(settings.CELERY_BROKER_URL,
                    transport_options={"global_keyprefix": "tenant-a:"}) as conn:
        queue = conn.SimpleQueue("celery")
        message = queue.get(timeout=5)
        message.ack()
        queue.close()
    assert message.headers["id"] == "id-p"
    assert message.payload[1] == {"key": str(Key(UNREGISTERED, "ns", "prefixed")), "token": 7}


def test_a_worker_runs_keys_periodic_tasks_and_countdowns_the_broker_sent(celery_worker,
                                                                           redis_client):
    from reconcilers.models import ReconcileRecord

    worker = celery_worker()
    now, later = Key(UNREGISTERED, "ns", "now"), Key(UNREGISTERED, "ns", "later")
    held: list[workqueue.Dispatch] = []
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


def test_a_broker_that_does_not_answer_leaves_the_key_to_the_reaper(settings, caplog):
    from reconcilers.models import WorkItem

    settings.CELERY_BROKER_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    key = Key(UNREGISTERED, "ns", "unsent")
    workqueue.add([key], "manual")
    assert "the reaper will retry" in caplog.text
    assert WorkItem.objects.get(name="unsent").state == "queued"  # the reaper re-sends it


def test_a_broker_the_sender_cannot_write_to_is_refused_at_start(settings, monkeypatch):
    from reconcilers.checks import check_broker

    assert check_broker(None) == []
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)
    for url in ("amqp://guest@localhost//", "sentinel://a:26379;sentinel://b:26379",
                "redis://a:6379/0;redis://b:6379/0", ""):
        settings.CELERY_BROKER_URL = url
        assert [e.id for e in check_broker(None)] == ["reconcilers.E005"], url
    settings.CELERY_BROKER_URL = "rediss://redis:6380/0?ssl_cert_reqs=required"
    settings.CELERY_BROKER_USE_SSL = {"ssl_cert_reqs": "required"}
    settings.CELERY_ACCEPT_CONTENT = ["pickle"]
    settings.CELERY_TASK_DEFAULT_PRIORITY = 5
    assert [e.id for e in check_broker(None)] == [
        "reconcilers.E006", "reconcilers.E007", "reconcilers.W002"]


def test_the_sender_writes_where_celery_sends(settings, monkeypatch):
    """Celery's write URL wins over its read URL, and the environment over the settings."""
    settings.CELERY_BROKER_URL = "redis://settings-read/0"
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)
    monkeypatch.delenv("CELERY_BROKER_WRITE_URL", raising=False)
    assert broker.broker_url() == "redis://settings-read/0"
    monkeypatch.setenv("CELERY_BROKER_URL", "redis://env-read/0")
    assert broker.broker_url() == "redis://env-read/0"
    settings.CELERY_BROKER_WRITE_URL = "redis://settings-write/0"
    assert broker.broker_url() == "redis://settings-write/0"
    monkeypatch.setenv("CELERY_BROKER_WRITE_URL", "redis://env-write/0")
    assert broker.broker_url() == "redis://env-write/0"


def test_a_message_sent_again_after_a_lost_reply_has_a_delivery_tag_of_its_own(
        redis_client, monkeypatch):
    """Redis may have taken a batch whose reply the connection lost: the copy sent again must
    not share the first one's delivery tag (kombu keys its unacknowledged records by it)."""
    pipeline = type(broker.client().pipeline())
    execute, calls = pipeline.execute, []

    def reply_lost(self, *args, **kwargs):
        result = execute(self, *args, **kwargs)
        calls.append(1)
        if len(calls) == 1:
            import redis

            raise redis.ConnectionError("connection reset after the write")
        return result

    monkeypatch.setattr(pipeline, "execute", reply_lost)
    queue = broker.default_queue()
    redis_client.delete(queue)
    with broker.batch():
        broker.publish(workqueue.Dispatch(Key(UNREGISTERED, "ns", "twice"), 1), "id-twice")
    copies = [json.loads(raw) for raw in redis_client.lrange(queue, 0, -1)]
    assert [c["headers"]["id"] for c in copies] == ["id-twice", "id-twice"]
    assert len({c["properties"]["delivery_tag"] for c in copies}) == 2


def test_the_watcher_does_not_import_celery():
    """The watcher sends its keys without Celery: nothing on its way imports it."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "manage.py", "watch", "--help"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    imported = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines()
                if line.startswith("import time:") and "|" in line}
    assert "django.db.models" in imported and "reconcilers.broker" in imported
    assert not {m for m in imported if m.split(".")[0] in ("celery", "kombu", "billiard")}


def test_tasks_imported_after_djangos_set_up_are_registered_all_the_same():
    """A process that loads Celery only after Django's set-up (a worker started in-process,
    a project that does not import its Celery app at start) still gets every reconciler's
    task: without it, a worker would drop their messages as unregistered."""
    script = (
        "import sys; sys.argv[1:] = ['watch']\n"  # the settings package leaves Celery out
        "import django; django.setup()\n"
        "assert 'celery' not in sys.modules\n"
        "from operator_project.celery import app\n"
        "import reconcilers.tasks\n"
        "from reconcilers.registry import registry\n"
        "app.finalize(auto=True)\n"
        "missing = [n for n in registry.names() if f'reconcile:{n}' not in app.tasks]\n"
        "assert registry.names() and not missing, missing\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
