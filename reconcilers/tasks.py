"""Celery tasks: thin adapters from a message to plain-Python operator code.

One task per registered reconciler, named ``reconcile:<reconciler>``, so each kind has its own
``rate_limit`` (Celery's token bucket stands in for the WorkQueue's overall rate limiter) and
queue. The message carries ``(key, token)``, never the object; its task id is the work queue's
``<key>#<token>``. A retry is a new message of the same task with the ledger's per-key backoff
as its countdown, sent by the work queue like every other message.

``install()`` (called from ``AppConfig.ready``) registers the tasks, the work queue's sender and
beat's periodic tasks on whichever Celery app the project runs: nothing here names it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from typing import Iterator, Sequence

from celery import Task, bootsteps, current_app, shared_task, signals
from celery.exceptions import SoftTimeLimitExceeded
from celery.worker import state
from django import db

from . import (capabilities, deadlines, history, metrics, probes, resync as resyncs, runner,
               runpool, workqueue)
from .conf import RunLimits, process_setting, settings
from .registry import NotRegistered, registry

# Every message carries the time it was sent, so the reaper can tell how long the oldest one
# still waiting in a queue has waited (``broker_backlog``).
SENT_AT = "x-sent-at"

# Publishing must not stall the watcher for long when Redis is down; the reaper covers it.
PUBLISH_RETRY = {"max_retries": 2, "interval_start": 0.1, "interval_step": 0.5,
                 "interval_max": 1.0}

log = logging.getLogger(__name__)

_tasks: dict[str, Task] = {}


def task_name(reconciler: str) -> str:
    return f"reconcile:{reconciler}"


def _make_task(reconciler: str) -> Task:
    try:
        cls = registry.get_class(reconciler)
        rate_limit, limits = cls.rate_limit, RunLimits.of(cls.timeout)
    except NotRegistered:
        rate_limit, limits = None, RunLimits.of(None)

    # The run deadline, enforced by the prefork pool (by ``deadlines`` in the thread pool):
    # SoftTimeLimitExceeded is raised in user code at ``soft``; the process running it is
    # ended at ``hard`` (its lease outlasts that).
    @shared_task(name=task_name(reconciler), bind=True, acks_late=True,
                 reject_on_worker_lost=True, ignore_result=True, rate_limit=rate_limit,
                 soft_time_limit=limits.soft, time_limit=limits.hard, typing=False)
    def reconcile_key(self: Task, key: str = "", token: int = 0,
                      keys: list[list] | None = None) -> str:
        worker = f"{self.request.hostname}:{os.getpid()}"
        if keys:  # a message carrying several keys (``workqueue.messages``)
            reports = runner.run_many([(k, int(t)) for k, t in keys], worker=worker)
            return ",".join("dropped" if r.dropped else r.outcome for r in reports)
        return _run_alone(key, token, worker, self.request.id or "")

    return reconcile_key


def task_for(reconciler: str) -> Task:
    """The task of ``reconciler`` (made on first use, so late registrations work too)."""
    task = _tasks.get(reconciler)
    if task is None:
        task = _tasks[reconciler] = _make_task(reconciler)
    return task


@shared_task(name="reconcilers.reconcile_unregistered", bind=True, acks_late=True,
             reject_on_worker_lost=True, ignore_result=True, typing=False,
             soft_time_limit=60, time_limit=90)
def reconcile_unregistered(self: Task, key: str, token: int) -> str:
    """A key of a reconciler this process does not know (removed from the code, or a typo in
    a manual resync): the runner records it as permanent instead of Celery dropping it as an
    unregistered task, which would leave the key queued for ever."""
    return _run_alone(key, token, f"{self.request.hostname}:{os.getpid()}",
                      self.request.id or "")


def _run_alone(key: str, token: int, worker: str, task_id: str) -> str:
    """A message carrying one key: run on a run thread where the process has them."""
    (report,) = runner.run_many([(key, token, task_id)], worker=worker)
    return "dropped" if report.dropped else report.outcome


_publishing = threading.local()


@contextlib.contextmanager
def publishing_batch() -> Iterator[None]:
    """Messages published inside go to Redis in one pipeline when the block ends (kombu's
    producer batch): a relist's or a burst's messages cost one round trip, not one each."""
    with current_app.producer_or_acquire() as producer, producer.batch(max_size=500):
        _publishing.producer = producer
        try:
            yield
        finally:
            _publishing.producer = None


def connect_broker() -> None:
    """Do what the first message would: connect this process's producer to the broker,
    declare the default queue, and finish Celery's lazy set-up (its task registry, the
    result backend's class) - ~13 ms more than the connection on a restarted watcher."""
    current_app.finalize(auto=True)
    current_app.backend  # noqa: B018 - created on first use by every apply_async
    with current_app.producer_or_acquire() as producer:
        producer.maybe_declare(current_app.amqp.queues[current_app.conf.task_default_queue])


def publish(dispatch: workqueue.Dispatch, task_id: str) -> None:
    """The work queue's sender: one Celery message for one dispatch."""
    name = dispatch.key.reconciler
    if name in registry:
        task, queue = task_for(name), registry.get_class(name).queue
    else:
        task, queue = reconcile_unregistered, None
    kwargs = {"key": str(dispatch.key), "token": dispatch.token}
    _apply(task, kwargs, repr(kwargs), task_id, queue, countdown=dispatch.countdown or None)


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
    _apply(task_for(name), {"keys": keys}, f"{{'keys': <{len(keys)} keys>}}", task_id,
           cls.queue, soft_time_limit=backstop, time_limit=backstop + hard)


def _apply(task: Task, kwargs: dict, kwargsrepr: str, task_id: str, queue: str | None,
           **options) -> None:
    """Every message: stamped with its send time, retried briefly when Redis blinks, in the
    open publishing batch if any, with its arguments' log form given (Celery's ``saferepr``
    of them cost as much as the rest of the publish)."""
    task.apply_async(
        kwargs=kwargs, kwargsrepr=kwargsrepr, argsrepr="()", task_id=task_id,
        queue=queue or None, headers={SENT_AT: time.time()}, retry=True,
        retry_policy=PUBLISH_RETRY, producer=getattr(_publishing, "producer", None), **options)


@shared_task(name="reconcilers.reap", ignore_result=True)
def reap() -> int:
    """Beat: re-queue runs whose worker died, re-send lost messages, send due retries."""
    with _periodic_connection():
        found = workqueue.reap(broker_backlog())
        if found.lost_runs:
            history.record_lost_runs(found.lost_runs)
            for key, _triggers, _attempts in found.lost_runs:  # recorded as errors: counted so
                metrics.observe_lost_run(key.reconciler)
        return len(found.dispatches)


@shared_task(name="reconcilers.resync", ignore_result=True)
def resync() -> int:
    """Beat: re-enqueue every cached object of each reconciler whose resync period passed."""
    with _periodic_connection():
        return resyncs.resync_due()


@shared_task(name="reconcilers.prune_history", ignore_result=True)
def prune_history() -> int:
    """Beat: history retention, and the ledger rows of objects long gone."""
    with _periodic_connection():
        return history.prune() + workqueue.forget_gone()


@contextlib.contextmanager
def _periodic_connection() -> Iterator[None]:
    """A periodic task's database connection. In a thread-pool worker the runs' connections
    are its run threads' (one each, its concurrency); the periodic tasks run on Celery's own
    threads, which otherwise hold nothing - so they close what they opened rather than leave
    a connection on every Celery thread (twice the connections the worker is sized for). A
    reconnect every few seconds at most. Elsewhere (prefork children) the connection stays."""
    db.close_old_connections()
    try:
        yield
    finally:
        if runpool.configured():
            db.connection.close()


def broker_backlog() -> workqueue.Backlog | None:
    """How long the oldest message still waiting in each reconciler's queue has waited.

    Redis queues are lists, first in, first out: the oldest waiting message is the list's
    tail, and its ``SENT_AT`` header says when it was sent. A message without one (another
    sender's) counts as just sent, which can only make the reaper re-send sooner, never hide
    a loss. ``None`` when the broker is not Redis (or does not answer)."""
    app = current_app
    default = app.conf.task_default_queue or "celery"
    queue_of = {cls.name(): cls.queue or default for cls in registry}
    queues = sorted({default, *queue_of.values()})
    try:
        with app.connection_for_write() as conn:
            client = conn.default_channel.client
            if not hasattr(client, "lindex"):
                return None
            pipe = client.pipeline()
            for queue in queues:
                pipe.lindex(queue, -1)
            oldest = dict(zip(queues, pipe.execute()))
    except Exception as exc:  # broker down: the reaper falls back to re-sending
        log.warning("could not read the broker's queues: %s", exc)
        return None
    now = time.time()
    waited = {queue: max(0.0, now - _sent_at(raw, now)) for queue, raw in oldest.items()}
    return workqueue.Backlog({name: waited[q] for name, q in queue_of.items()},
                             other=waited[default])


def _sent_at(raw: bytes | None, now: float) -> float:
    if raw is None:
        return now
    try:
        return float(json.loads(raw)["headers"][SENT_AT])
    except (ValueError, KeyError, TypeError):
        return now


def beat_schedule() -> dict[str, dict]:
    return {
        # The reaper also sends retries whose delay was too long for a broker countdown.
        "reconcilers-reap": {"task": "reconcilers.reap",
                             "schedule": settings().reaper_interval},
        "reconcilers-resync": {"task": "reconcilers.resync", "schedule": 30.0},
        "reconcilers-prune-history": {"task": "reconcilers.prune_history",
                                      "schedule": 3600.0},
    }


def send_periodic(name: str) -> None:
    """Send one of ``beat_schedule``'s tasks now (the leading watcher's stand-in for beat)."""
    current_app.send_task(name, retry=True, retry_policy=PUBLISH_RETRY)


class WorkerProbes:
    """The worker's ``/metrics``, ``/healthz`` and ``/readyz`` (``OPERATOR_WORKER_HTTP_PORT``),
    served by its main process: live while its consumer has not shut down, ready while it
    consumes from the broker and PostgreSQL answers. Its scrape adds the pool's size and the
    runs in progress (children count everything else into the multiprocess files)."""

    def __init__(self, consumer) -> None:
        self.consumer = consumer

    def live(self) -> dict[str, bool]:
        return {"worker": self.consumer.controller.blueprint.state in (None, bootsteps.RUN)}

    def ready(self) -> dict[str, bool]:
        url = current_app.conf.broker_url
        return {"consuming": self.consumer.blueprint.state == bootsteps.RUN,
                "broker": probes.answers(lambda t: probes.check_redis(url, t)),
                "database": probes.answers(probes.check_database)}

    def gauges(self) -> list[tuple[str, str, list[str], list]]:
        active: dict[str, int] = {cls.name(): 0 for cls in registry}
        if runpool.configured():  # the runs are this process's threads: count keys
            for name, n in runner.in_progress().items():
                if name in active:
                    active[name] = n
        else:  # a prefork child runs one key at a time: count the messages it was given
            for request in list(state.active_requests):
                name = request.task_name.partition(":")[2]
                if request.task_name.startswith("reconcile:") and name in active:
                    active[name] += 1
        concurrency = self.consumer.controller.concurrency
        return [
            ("controller_runtime_max_concurrent_reconciles",
             "Maximum number of concurrent reconciles per controller", ["controller"],
             [((name,), concurrency) for name in active]),
            ("controller_runtime_active_workers",
             "Number of currently used workers per controller", ["controller"],
             [((name,), n) for name, n in active.items()]),
        ]


def _serve_worker_probes(sender, **_) -> None:
    worker = WorkerProbes(sender)
    probes.serve(probes.Endpoint("worker", worker.live, worker.ready,
                                 [metrics.Computed(worker.gauges)], _scraped),
                 process_setting("OPERATOR_WORKER_HTTP_PORT", 8082))


def _scraped(body: bytes) -> None:
    """Level 4's evidence: this scrape served these reconcilers' counts."""
    try:
        capabilities.record_scraped(metrics.reconcilers_counted(body))
    finally:
        db.connection.close()  # each scrape has its own thread, and so its own connection


def _size_run_pool(sender, **_) -> None:
    """The thread pool's runs share the process: at most its concurrency at once, messages
    carrying several keys included (``runpool``). Prefork children run them one by one."""
    if sender.controller.pool_cls.__module__.endswith(".thread"):
        runpool.configure(sender.controller.concurrency)


def _child_exited(**_) -> None:
    metrics.process_exited(os.getpid())


def install() -> None:
    """Tasks for every registered reconciler, the work queue's sender, beat's schedule (a
    project's own ``CELERY_BEAT_SCHEDULE`` entry of the same name wins)."""
    for cls in registry:
        task_for(cls.name())
    workqueue.set_sender(publish, publishing_batch, many=publish_many, connect=connect_broker)
    runner.deadline_errors.add(f"{SoftTimeLimitExceeded.__module__}."
                               f"{SoftTimeLimitExceeded.__qualname__}")
    deadlines.soft_limit_error = SoftTimeLimitExceeded  # the thread pool's, as prefork's
    app = current_app
    app.conf.beat_schedule = {**beat_schedule(), **(app.conf.beat_schedule or {})}
    signals.worker_ready.connect(_serve_worker_probes, weak=False)
    signals.worker_ready.connect(_size_run_pool, weak=False)
    signals.worker_process_shutdown.connect(_child_exited, weak=False)
