"""The work queue's messages, published through the project's Celery app.

Every message is Celery's own: ``send_task`` on the app the project loads at start (as
Celery's Django guide has it: ``from .celery import app`` in the project package's
``__init__``), through its producer pool. So whatever a user configures for Celery applies to
the work queue too - the broker and its transport options, ``CELERY_TASK_ROUTES``, queues and
exchanges, the serializer, compression, message signing, the publish signals
(``before_task_publish``, where Sentry and OpenTelemetry propagate their traces) and
task-sent events for Flower. A reconciler's own ``queue`` is passed as the message's queue and
so wins over a route, as an explicit ``queue=`` does for any Celery task.

What the ledger's recovery asks of the broker (``tasks.broker_backlog``): to tell a message
that is merely waiting from one that is lost, the reaper reads the oldest message of each
queue, which a Redis broker keeps as a list. With any other broker it cannot look, and every
key queued longer than ``RECONCILERS_REDISPATCH_AFTER`` is sent again - still never run twice
(the ledger's token drops the duplicate), only sent more often under a long backlog.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from typing import Iterator, Sequence

from django.core.exceptions import ImproperlyConfigured

from reconcilers._queue import workqueue
from reconcilers._base.conf import RunLimits
from reconcilers._authoring.registry import registry
from reconcilers._base.reconcile import Dispatch

# Every message of the ledger carries the time the ledger dispatched it, by the database's
# clock (``Dispatch.at``), so the reaper can tell which keys were sent before the oldest one
# still waiting in a queue (``tasks.broker_backlog``) without comparing two hosts' clocks.
SENT_AT = "x-sent-at"
UNREGISTERED_TASK = "reconcilers.reconcile_unregistered"
UNREGISTERED_LIMITS = (90, 60)  # (hard, soft) seconds: what that task records takes at most

# A publish must not stall the watcher for long while the broker is down: the reaper re-sends
# whatever the ledger says is queued and no broker took.
PUBLISH_RETRY = {"max_retries": 2, "interval_start": 0.1, "interval_step": 0.5,
                 "interval_max": 1.0}
# Messages a batch holds before kombu flushes them (one pipeline on Redis).
BATCH_SIZE = 500

# The producer of the batch a thread has open (``batch``): each thread sees its own.
_local = threading.local()


def task_name(reconciler: str) -> str:
    return f"reconcile:{reconciler}"


def app():
    """The project's Celery app - the current one, never Celery's unconfigured fallback,
    which would send to a broker nobody named."""
    from celery import current_app

    found = current_app._get_current_object()
    if found.main == "default" and not found.set_as_current:
        raise ImproperlyConfigured(
            "no Celery app is loaded: the work queue sends through your project's Celery app. "
            "Import it in your project package's __init__.py, as Celery's Django guide shows: "
            "`from .celery import app as celery_app`.")
    return found


def default_queue() -> str:
    return app().conf.task_default_queue or "celery"


def queue_for(reconciler: str) -> str:
    """The queue a reconciler's messages go to: its own ``queue``, else where Celery's
    routes (``CELERY_TASK_ROUTES``) send its task, else the default queue."""
    cls = registry.get_class(reconciler) if reconciler in registry else None
    if cls is not None and cls.queue:
        return cls.queue
    routed = app().amqp.router.route({}, task_name(reconciler), (), {})
    queue = routed.get("queue")
    return getattr(queue, "name", None) or default_queue()


def publish(dispatch: Dispatch, task_id: str) -> None:
    """The work queue's sender: one message for one dispatch."""
    name = dispatch.key.reconciler
    kwargs = {"key": str(dispatch.key), "token": dispatch.token}
    if name in registry:
        cls = registry.get_class(name)
        limits = RunLimits.of(cls.timeout)
        task, queue, time_limits = task_name(name), cls.queue, (limits.hard, limits.soft)
    else:
        task, queue, time_limits = UNREGISTERED_TASK, None, UNREGISTERED_LIMITS
    _send(task, task_id, kwargs, repr(kwargs), queue, time_limits,
          countdown=dispatch.countdown or None, sent_at=_sent_at([dispatch]))


def publish_many(dispatches: Sequence[Dispatch], task_id: str) -> None:
    """The work queue's sender for several keys of one reconciler: one message, unless the
    reconciler has a rate limit (the buckets count messages, so each key keeps its own) or is
    not registered here."""
    name = dispatches[0].key.reconciler
    cls = registry.get_class(name) if name in registry else None
    if cls is None or cls.rate_limit or cls.shared_rate_limit:
        for d in dispatches:
            publish(d, workqueue.task_id(d.key, d.token))
        return
    # The prefork pool's limit is per message: each key keeps its own deadline inside
    # (``deadlines.everywhere``); this one only stops a child past all of them.
    hard = RunLimits.of(cls.timeout).hard
    backstop = (len(dispatches) + 1) * hard
    keys = [[str(d.key), d.token] for d in dispatches]
    _send(task_name(name), task_id, {"keys": keys}, f"{{'keys': <{len(keys)} keys>}}",
          cls.queue, (backstop + hard, backstop), sent_at=_sent_at(dispatches))


def _sent_at(dispatches: Sequence[Dispatch]) -> float:
    """The oldest of the message's dispatches, by the database's clock; one the ledger did
    not make (no ``at``) by this host's."""
    stamps = [d.at for d in dispatches if d.at is not None]
    return min(stamps) if len(stamps) == len(dispatches) else time.time()


def send_periodic(task: str) -> None:
    """Send one of the periodic tasks (``periodic.schedule``) now: the leading watcher's
    stand-in for beat. No ``SENT_AT``: the reaper counts it as just sent."""
    _send(task, str(uuid.uuid4()), {}, "{}", None, (None, None), ignore_result=None)


def _send(task: str, task_id: str, kwargs: dict, kwargsrepr: str, queue: str | None,
          time_limits: tuple[float | None, float | None], countdown: float | None = None,
          ignore_result: bool | None = True, sent_at: float | None = None) -> None:
    """Every message: stamped with its send time, retried briefly when the broker blinks, in
    the open batch if any, with its arguments' log form given (Celery's ``saferepr`` of them
    costs as much as the rest of the publish). ``time_limits`` is ``(hard, soft)``; ``None``
    there and in ``ignore_result`` leaves the task's own."""
    options = {}
    if queue:
        options["queue"] = queue
    if ignore_result is not None:
        options["ignore_result"] = ignore_result
    app().send_task(
        task, kwargs=kwargs, task_id=task_id, countdown=countdown, kwargsrepr=kwargsrepr,
        argsrepr="()", headers={} if sent_at is None else {SENT_AT: sent_at},
        time_limit=time_limits[0],
        soft_time_limit=time_limits[1], retry=True, retry_policy=PUBLISH_RETRY,
        producer=getattr(_local, "producer", None), add_to_parent=False, **options)


@contextlib.contextmanager
def batch() -> Iterator[None]:
    """Messages published inside reach the broker together when the block ends (kombu's
    producer batch: one pipeline on Redis) - a relist's or a burst's many; nothing is sent
    if the block fails. Inside another batch, the outer one sends them."""
    if getattr(_local, "producer", None) is not None:
        yield
        return
    with app().producer_or_acquire() as producer, producer.batch(max_size=BATCH_SIZE):
        _local.producer = producer
        try:
            yield
        finally:
            _local.producer = None


def connect() -> None:
    """Do what the first message would, ahead of it: finish the app's lazy set-up and
    connect this process's producer to the broker."""
    celery = app()
    celery.finalize(auto=True)
    with celery.producer_or_acquire() as producer:
        producer.connection.ensure_connection(max_retries=1)


def oldest_waiting(queues: Sequence[str], timeout: float) -> dict[str, bytes | None] | None:
    """The message at the consuming end of each queue (the one that has waited longest);
    ``None`` where the broker keeps no list to look into (not Redis). Raises kombu's
    ``LimitExceeded`` when no pooled connection frees up within ``timeout`` (every one held
    by a send), rather than waiting for one."""
    with app().pool.acquire(block=True, timeout=timeout) as conn:
        if conn.transport.driver_type != "redis":
            return None
        client = conn.default_channel.client
        # kombu prefixes the keys of the commands it uses itself, LINDEX not among them.
        prefixed = "LINDEX" in getattr(client, "PREFIXED_SIMPLE_COMMANDS", ())
        prefix = "" if prefixed else getattr(client, "global_keyprefix", "") or ""
        pipe = client.pipeline(transaction=False)
        for queue in queues:
            pipe.lindex(f"{prefix}{queue}", -1)
        return dict(zip(queues, pipe.execute()))


def sent_at(raw: bytes | None) -> float | None:
    """The ledger's send time a waiting message (as ``oldest_waiting`` reads it) carries, or
    ``None``: no message, or one another sender made."""
    if raw is None:
        return None
    try:
        return float(json.loads(raw)["headers"][SENT_AT])
    except (ValueError, KeyError, TypeError):
        return None


def install() -> None:
    workqueue.set_sender(publish, batch, many=publish_many, connect=connect)
