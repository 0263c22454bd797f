"""Celery tasks: thin adapters from a message to plain-Python operator code.

One task per registered reconciler, named ``reconcile:<reconciler>``, so each kind has its own
``rate_limit`` (Celery's token bucket stands in for the WorkQueue's overall rate limiter) and
queue. The message carries ``(key, token)``, never the object; its task id is the work queue's
``<key>#<token>``. A retry is a new message of the same task with the ledger's per-key backoff
as its countdown, sent by the work queue like every other message (``broker``, through the
same Celery app); this module is the consuming side.

``install()`` (called from ``AppConfig.ready`` where a Celery app runs) registers the tasks and
beat's periodic tasks on whichever Celery app the project runs: nothing here names it.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Iterator

from celery import Task, current_app, shared_task, signals
from celery.exceptions import SoftTimeLimitExceeded
from django import db

from reconcilers._queue import broker, periodic, ratelimit, resync as resyncs, workqueue
from reconcilers._run import consumer as worker_consumer
from reconcilers._run import health, history, runner, pool, timers
from reconcilers._base import metrics
from reconcilers._base.conf import RunLimits
from reconcilers._authoring.registry import NotRegistered, registry
from reconcilers._base.reconcile import Dispatch, Key

log = logging.getLogger(__name__)

# Every reconciler's task, made by ``task_for`` when ``install`` runs in the app's ``ready()``
# (one thread, at start-up); Celery keeps one task per name per process, so this does too.
_tasks: dict[str, Task] = {}


def _make_task(reconciler: str) -> Task:
    try:
        cls = registry.get_class(reconciler)
        rate_limit, limits = cls.rate_limit, RunLimits.of(cls.timeout)
        shared_rate = cls.shared_rate_limit
    except NotRegistered:
        rate_limit, limits, shared_rate = None, RunLimits.of(None), None

    # The run deadline, enforced by the prefork pool (by ``deadlines`` in the thread pool):
    # SoftTimeLimitExceeded is raised in user code at ``soft``; the process running it is
    # ended at ``hard`` (its lease outlasts that).
    @shared_task(name=broker.task_name(reconciler), bind=True, acks_late=True,
                 reject_on_worker_lost=True, ignore_result=True, rate_limit=rate_limit,
                 soft_time_limit=limits.soft, time_limit=limits.hard, typing=False)
    def reconcile_key(self: Task, key: str = "", token: int = 0,
                      keys: list[list] | None = None) -> str:
        worker = f"{self.request.hostname}:{os.getpid()}"
        if keys:  # a message carrying several keys (``workqueue.messages``)
            reports = runner.run_many([(k, int(t)) for k, t in keys], worker=worker,
                                      soft_limit_error=SoftTimeLimitExceeded)
            return ",".join("dropped" if r.dropped else r.outcome for r in reports)
        if shared_rate and (wait := ratelimit.take(reconciler, shared_rate)):
            # Not this message's turn across the workers: the key comes back when it is.
            workqueue.send([Dispatch(Key.parse(key), int(token), countdown=wait)])
            return "rate-limited"
        return _run_alone(key, token, worker, self.request.id or "")

    return reconcile_key


def task_for(reconciler: str) -> Task:
    """The task of ``reconciler`` (made on first use, so late registrations work too)."""
    task = _tasks.get(reconciler)
    if task is None:
        task = _tasks[reconciler] = _make_task(reconciler)
    return task


@shared_task(name=broker.UNREGISTERED_TASK, bind=True, acks_late=True,
             reject_on_worker_lost=True, ignore_result=True, typing=False,
             soft_time_limit=broker.UNREGISTERED_LIMITS[1],
             time_limit=broker.UNREGISTERED_LIMITS[0])
def reconcile_unregistered(self: Task, key: str, token: int) -> str:
    """A key of a reconciler this process does not know (removed from the code, or a typo in
    a manual resync): the runner records it as permanent instead of Celery dropping it as an
    unregistered task, which would leave the key queued for ever."""
    return _run_alone(key, token, f"{self.request.hostname}:{os.getpid()}",
                      self.request.id or "")


def _run_alone(key: str, token: int, worker: str, task_id: str) -> str:
    """A message carrying one key: run on a run thread where the process has them."""
    (report,) = runner.run_many([(key, token, task_id)], worker=worker,
                                soft_limit_error=SoftTimeLimitExceeded)
    return "dropped" if report.dropped else report.outcome


@shared_task(name="reconcilers.reap", ignore_result=True)
def reap() -> int:
    """Beat: re-queue runs whose worker died, re-send lost messages, send due retries."""
    with _periodic_connection():
        found = workqueue.reap(broker_backlog(), record=history.lost_row)
        for key, _triggers, _attempts in found.lost_runs:  # recorded as errors: counted so
            metrics.observe_lost_run(key.reconciler)
        return len(found.dispatches)


@shared_task(name="reconcilers.resync", ignore_result=True)
def resync() -> int:
    """Beat: re-enqueue every cached object of each reconciler whose resync period passed."""
    with _periodic_connection():
        return resyncs.resync_due()


@shared_task(name="reconcilers.timers", ignore_result=True)
def fire_timers() -> int:
    """Every second (when a reconciler declares a timer): enqueue the objects whose timers
    are due."""
    with _periodic_connection():
        return timers.fire_due(registry)


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
        if pool.configured():
            db.connection.close()


def broker_backlog() -> workqueue.Backlog | None:
    """When the oldest message still waiting in each reconciler's queue was sent.

    Redis queues are lists, first in, first out: the oldest waiting message is the list's
    tail, and its ``SENT_AT`` header says when the ledger dispatched it, by the database's
    clock - never this host's, which may disagree with the senders' by any amount. A message
    without one (another sender's) counts as just sent, which can only make the reaper
    re-send sooner, never hide a loss. ``None`` when the broker does not answer or keeps no
    lists (not Redis)."""
    try:
        default = broker.default_queue()
        queue_of = {cls.name(): broker.queue_for(cls.name()) for cls in registry}
        queues = sorted({default, *queue_of.values()})
        oldest = broker.oldest_waiting(queues, timeout=10.0)  # the reaper must not hang
    except Exception as exc:  # broker down: the reaper falls back to re-sending
        log.warning("could not read the broker's queues: %s", exc)
        return None
    if oldest is None:
        return None
    sent = {queue: broker.sent_at(raw) for queue, raw in oldest.items()}
    return workqueue.Backlog({name: sent[q] for name, q in queue_of.items()},
                             other=sent[default])


def _size_run_pool(sender, **_) -> None:
    """The thread pool's runs share the process: at most its concurrency at once, messages
    carrying several keys included (``runpool``). Prefork children run them one by one."""
    if sender.controller.pool_cls.__module__.endswith(".thread"):
        pool.configure(sender.controller.concurrency)


def _child_exited(**_) -> None:
    metrics.process_exited(os.getpid())


# Set once, by the thread that runs the app's ``ready()`` (at start-up, before any worker
# thread or child exists): Celery's signals and schedule are the process's own.
_installed = False


def install() -> None:
    """Tasks for every registered reconciler, beat's schedule (a project's own
    ``CELERY_BEAT_SCHEDULE`` entry of the same name wins) and the worker's consumer
    (``consumer``, unless the project names its own ``CELERY_WORKER_CONSUMER``). Once per
    process, from the app's ``ready`` where Celery is loaded - the project's package imports
    its Celery app, as Celery's Django guide has it, and ``celery -A`` loads it before Django's
    set-up - never at this module's import."""
    global _installed
    if _installed:
        return
    _installed = True
    for cls in registry:
        task_for(cls.name())
    app = current_app
    app.conf.beat_schedule = {**periodic.schedule(timers.any_declared(registry)),
                              **(app.conf.beat_schedule or {})}
    if app.conf.worker_consumer == worker_consumer.CELERY_DEFAULT:  # a project's own wins
        app.conf.worker_consumer = worker_consumer.CONSUMER
    signals.worker_ready.connect(health.serve, weak=False)
    signals.worker_ready.connect(_size_run_pool, weak=False)
    signals.worker_process_shutdown.connect(_child_exited, weak=False)

