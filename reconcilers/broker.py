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

What follows from writing the list directly: the broker is Redis, named as Celery names the
one it sends to (``CELERY_BROKER_WRITE_URL``, else ``CELERY_BROKER_URL``, each from the
environment first, then the Django setting), ``redis://`` or ``rediss://`` with any TLS options
in the URL's query; a check refuses anything else at start (``checks.check_broker``). A message
goes to its reconciler's ``queue`` or ``CELERY_TASK_DEFAULT_QUEUE`` (``CELERY_TASK_ROUTES`` does
not apply to it), at priority 0, as JSON; a ``global_keyprefix`` in
``CELERY_BROKER_TRANSPORT_OPTIONS`` is honoured as kombu does. Settings given only to the
Celery app object in code (``app.conf...``) are not seen here.
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
from functools import partial
from typing import Callable, Iterator, Sequence

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
SCHEMES = ("redis://", "rediss://")

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
    """The URL Celery sends to, found where Celery looks for it ("" when none is set)."""
    for name in ("CELERY_BROKER_WRITE_URL", "CELERY_BROKER_URL"):
        url = os.environ.get(name) or getattr(django_settings, name, None)
        if url:
            return url
    return ""


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
    _push(queue, partial(message, task, task_id, kwargs, repr(kwargs), queue, time_limits,
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
    _push(queue, partial(message, task_name(name), task_id, {"keys": keys},
                         f"{{'keys': <{len(keys)} keys>}}", queue,
                         (backstop + hard, backstop)))


def send_periodic(task: str) -> None:
    """Send one of the periodic tasks (``periodic.schedule``) now: the leading watcher's
    stand-in for beat."""
    queue = default_queue()
    _push(queue, partial(message, task, str(uuid.uuid4()), {}, "{}", queue,
                         ignore_result=None))


@contextlib.contextmanager
def batch() -> Iterator[None]:
    """Messages published inside reach Redis together (one ``MULTI``/``EXEC``: all or none)
    when the block ends - a relist's or a burst's many; nothing is sent if the block fails.
    Inside another batch, the outer one sends them."""
    if getattr(_local, "pending", None) is not None:
        yield
        return
    _local.pending = pending = []
    try:
        yield
    finally:
        _local.pending = None
    if pending:
        _with_retry(lambda: _push_all(pending))


# A message is made again for every attempt to send it: each has a delivery tag of its own, as
# each of kombu's publish attempts does. Two copies under one tag - the first written before a
# dropped connection hid its reply - would share kombu's unacknowledged-message record, and the
# first copy's ack would take the second's protection from a worker's death with it.
Made = Callable[[], bytes]


def _push(queue: str, make: Made) -> None:
    pending = getattr(_local, "pending", None)
    if pending is not None:
        pending.append((queue, make))
    else:
        _with_retry(lambda: client().lpush(queue_key(queue), make()))


def _push_all(pending: list[tuple[str, Made]]) -> None:
    """One LPUSH per queue, the messages in the order they were published (the consumer
    pops from the other end)."""
    by_queue: dict[str, list[bytes]] = {}
    for queue, make in pending:
        by_queue.setdefault(queue, []).append(make())
    pipe = client().pipeline(transaction=True)
    for queue, raws in by_queue.items():
        pipe.lpush(queue_key(queue), *raws)
    pipe.execute()


def _with_retry(push: Callable[[], object]) -> None:
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
