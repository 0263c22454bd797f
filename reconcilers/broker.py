"""The work queue's messages, written to the Redis broker in Celery's own format.

Celery consumes them - workers run ``reconcile:<reconciler>`` tasks, with their rate limits,
time limits and acknowledgements - but no process needs Celery to *send* one. A message is
what Celery's ``apply_async`` puts on a Redis queue (task message protocol 2, in kombu's Redis
envelope: a JSON object with the body base64-encoded, pushed onto the list named after the
queue), so a worker cannot tell the two apart. The watcher sends every key it sees and is the
process whose start a restart waits for: importing Celery and making its first message
(the app's finalisation, the producer, the queue's declaration) took a fifth of a restarted
watcher's CPU before its first key (docs/benchmarks.md, change 31). Every process sends the
same way, so there is one sender to trust.

What follows from writing the list directly: the broker is Redis (``CELERY_BROKER_URL``,
``redis://``, ``rediss://`` or ``unix://``; a check refuses anything else at start), a message
goes to its reconciler's ``queue`` or ``CELERY_TASK_DEFAULT_QUEUE`` (``CELERY_TASK_ROUTES``
does not apply to it), and a ``global_keyprefix`` in ``CELERY_BROKER_TRANSPORT_OPTIONS`` is
honoured as kombu does.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import socket
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone
from typing import Iterator, Sequence

import redis
from django.conf import settings as django_settings

from . import workqueue
from .cache import client_for
from .conf import RunLimits
from .registry import registry

# Every message carries the time it was sent, so the reaper can tell how long the oldest one
# still waiting in a queue has waited (``tasks.broker_backlog``).
SENT_AT = "x-sent-at"
UNREGISTERED_TASK = "reconcilers.reconcile_unregistered"
UNREGISTERED_LIMITS = (90, 60)  # (hard, soft) seconds: what that task records takes at most
SCHEMES = ("redis://", "rediss://", "unix://")

# A publish must not stall the watcher for long while Redis is down: the reaper re-sends
# whatever the ledger says is queued and no broker took. Seconds before each new attempt.
RETRY_DELAYS = (0.1, 0.6)

_EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
_HOST = socket.gethostname()
# No result is ever sent back (every task ignores its result): any stable id will do.
_REPLY_TO = str(uuid.uuid4())
_local = threading.local()


def task_name(reconciler: str) -> str:
    return f"reconcile:{reconciler}"


def broker_url() -> str:
    return getattr(django_settings, "CELERY_BROKER_URL", None) or django_settings.REDIS_URL


def default_queue() -> str:
    return getattr(django_settings, "CELERY_TASK_DEFAULT_QUEUE", None) or "celery"


def queue_key(queue: str) -> str:
    """The Redis list holding ``queue``'s messages (kombu's name for priority 0)."""
    options = getattr(django_settings, "CELERY_BROKER_TRANSPORT_OPTIONS", None) or {}
    return f"{options.get('global_keyprefix') or ''}{queue}"


def client() -> redis.Redis:
    return client_for(broker_url())


def message(task: str, task_id: str, kwargs: dict, kwargsrepr: str, queue: str,
            time_limits: tuple[float | None, float | None] = (None, None),
            countdown: float | None = None, ignore_result: bool | None = True) -> bytes:
    """One Celery message as kombu's Redis transport stores it. ``time_limits`` is
    ``(hard, soft)``; ``None`` there and in ``ignore_result`` leaves the task's own."""
    now = time.time()
    eta = None
    if countdown:
        eta = (datetime.now(timezone.utc) + timedelta(seconds=countdown)).isoformat()
    body = json.dumps([[], kwargs, _EMBED]).encode()
    return json.dumps({
        "body": base64.b64encode(body).decode(),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {
            "lang": "py", "task": task, "id": task_id, "shadow": None, "eta": eta,
            "expires": None, "group": None, "group_index": None, "retries": 0,
            "timelimit": list(time_limits), "root_id": task_id, "parent_id": None,
            "argsrepr": "()", "kwargsrepr": kwargsrepr, "origin": f"gen{os.getpid()}@{_HOST}",
            "ignore_result": ignore_result, "replaced_task_nesting": 0, "stamped_headers": None,
            "stamps": {}, SENT_AT: now},
        "properties": {
            "correlation_id": task_id, "reply_to": _REPLY_TO, "delivery_mode": 2,
            "delivery_info": {"exchange": "", "routing_key": queue}, "priority": 0,
            "body_encoding": "base64", "delivery_tag": str(uuid.uuid4())},
    }).encode()


def publish(dispatch: workqueue.Dispatch, task_id: str) -> None:
    """The work queue's sender: one message for one dispatch."""
    name = dispatch.key.reconciler
    kwargs = {"key": str(dispatch.key), "token": dispatch.token}
    if name in registry:
        cls = registry.get_class(name)
        limits = RunLimits.of(cls.timeout)
        task, queue, time_limits = task_name(name), cls.queue, (limits.hard, limits.soft)
    else:
        task, queue, time_limits = UNREGISTERED_TASK, None, UNREGISTERED_LIMITS
    queue = queue or default_queue()
    _push(queue, message(task, task_id, kwargs, repr(kwargs), queue, time_limits,
                         dispatch.countdown or None))


def publish_many(dispatches: Sequence[workqueue.Dispatch], task_id: str) -> None:
    """The work queue's sender for several keys of one reconciler: one message, unless the
    reconciler has a ``rate_limit`` (Celery's token bucket counts messages, so each key keeps
    its own) or is not registered here."""
    name = dispatches[0].key.reconciler
    cls = registry.get_class(name) if name in registry else None
    if cls is None or cls.rate_limit:
        for d in dispatches:
            publish(d, workqueue.task_id(d.key, d.token))
        return
    # The prefork pool's limit is per message: each key keeps its own deadline inside
    # (``deadlines.everywhere``); this one only stops a child past all of them.
    hard = RunLimits.of(cls.timeout).hard
    backstop = (len(dispatches) + 1) * hard
    keys = [[str(d.key), d.token] for d in dispatches]
    queue = cls.queue or default_queue()
    _push(queue, message(task_name(name), task_id, {"keys": keys},
                         f"{{'keys': <{len(keys)} keys>}}", queue, (backstop + hard, backstop)))


def send_periodic(task: str) -> None:
    """Send one of the periodic tasks (``periodic.schedule``) now: the leading watcher's
    stand-in for beat."""
    queue = default_queue()
    _push(queue, message(task, str(uuid.uuid4()), {}, "{}", queue, ignore_result=None))


@contextlib.contextmanager
def batch() -> Iterator[None]:
    """Messages published inside reach Redis in one round trip when the block ends (a
    relist's or a burst's many); nothing is sent if the block fails."""
    outer = getattr(_local, "pending", None)
    if outer is not None:  # nested: the outer block sends
        yield
        return
    _local.pending = pending = []
    try:
        yield
    finally:
        _local.pending = None
    if pending:
        _with_retry(lambda: _push_all(pending))


def _push(queue: str, raw: bytes) -> None:
    pending = getattr(_local, "pending", None)
    if pending is not None:
        pending.append((queue, raw))
    else:
        _with_retry(lambda: client().lpush(queue_key(queue), raw))


def _push_all(pending: list[tuple[str, bytes]]) -> None:
    """One LPUSH per queue, the messages in the order they were published (the consumer
    pops from the other end)."""
    by_queue: dict[str, list[bytes]] = {}
    for queue, raw in pending:
        by_queue.setdefault(queue, []).append(raw)
    pipe = client().pipeline(transaction=False)
    for queue, raws in by_queue.items():
        pipe.lpush(queue_key(queue), *raws)
    pipe.execute()


def _with_retry(push) -> None:
    for delay in (*RETRY_DELAYS, None):
        try:
            push()
            return
        except (redis.ConnectionError, redis.TimeoutError):
            if delay is None:
                raise
            time.sleep(delay)


def connect() -> None:
    """Open this process's broker connection ahead of the first message."""
    client().ping()


def oldest_waiting(queues: Sequence[str]) -> dict[str, bytes | None]:
    """The message at the consuming end of each queue (the one that has waited longest)."""
    pipe = client().pipeline(transaction=False)
    for queue in queues:
        pipe.lindex(queue_key(queue), -1)
    return dict(zip(queues, pipe.execute()))


def install() -> None:
    workqueue.set_sender(publish, batch, many=publish_many, connect=connect)
