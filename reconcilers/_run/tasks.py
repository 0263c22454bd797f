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
import json
import logging
import os
import threading
import time
from typing import Iterator

from celery import Task, bootsteps, current_app, shared_task, signals
from celery.exceptions import SoftTimeLimitExceeded
from celery.worker import state
from django import db
from django.apps import apps

from reconcilers._queue import broker, periodic, ratelimit, resync as resyncs, workqueue
from reconcilers._run import consumer as worker_consumer
from reconcilers._run import evidence, history, runner, pool, stall, timers
from reconcilers._base import metrics, probes
from reconcilers._base.conf import RunLimits, process_setting, settings
from reconcilers._authoring.registry import NotRegistered, registry
from reconcilers._base.vocab import Key

log = logging.getLogger(__name__)

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
            workqueue.send([workqueue.Dispatch(Key.parse(key), int(token), countdown=wait)])
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
    sent = {queue: _sent_at(raw) for queue, raw in oldest.items()}
    return workqueue.Backlog({name: sent[q] for name, q in queue_of.items()},
                             other=sent[default])


def _sent_at(raw: bytes | None) -> float | None:
    if raw is None:
        return None
    try:
        return float(json.loads(raw)["headers"][broker.SENT_AT])
    except (ValueError, KeyError, TypeError):
        return None


class WorkerProbes:
    """The worker's ``/metrics``, ``/healthz`` and ``/readyz`` (``OPERATOR_WORKER_HTTP_PORT``),
    served by its main process: live while its consumer has not shut down and has not stalled
    (``stall``), ready while it consumes (not stalled either) from the broker and PostgreSQL
    answers. Its scrape
    adds the pool's size and the runs in progress (children count everything else into the
    multiprocess files)."""

    def __init__(self, consumer) -> None:
        self.consumer = consumer
        self.last_received = time.monotonic()
        self._reading: threading.Thread | None = None
        # The queues it started to consume: a stalled consumer's own list is not to be trusted.
        self.queues = list(consumer.app.amqp.queues.consume_from or ()) or [
            broker.default_queue()]
        signals.task_received.connect(self._received, weak=False)

    def _received(self, **_) -> None:
        self.last_received = time.monotonic()

    def live(self) -> dict[str, bool]:
        why = self.stalled()
        if why:
            log.error("worker not live: %s", why)
        return {"worker": self.consumer.controller.blueprint.state in (None, bootsteps.RUN),
                "consuming": why is None}

    def stalled(self) -> str | None:
        """Why the consumer looks stalled (``stall.stalled``), or ``None``."""
        after = settings().worker_stalled_after
        now = time.monotonic()
        if after <= 0 or now - self.last_received < after:
            return None  # the cheap tests first: most probes end here
        running = self._running(after)
        if running:
            return None
        oldest = self._oldest_waiting()
        if oldest is None:  # cannot tell: readiness reports the broker, a restart would not help
            return None
        sent = [t for t in (_sent_at(raw) for raw in oldest.values()) if t is not None]
        return stall.stalled(now=now, last_received=self.last_received, running=running,
                             oldest_sent=min(sent) if sent else None, wall_now=time.time(),
                             stalled_after=after)

    def watch(self) -> None:
        """Ends this worker once it has stayed stalled ``RECONCILERS_WORKER_STALLED_AFTER``
        after it was first seen (``stall.end``: compose restarts only what exits)."""
        first = None
        while (after := settings().worker_stalled_after) > 0:
            time.sleep(max(1.0, after / 4))
            why = self.stalled()
            if why is None:
                first = None
            elif first is None:
                first = time.monotonic()
            elif time.monotonic() - first >= after:
                stall.end(why)
                return

    @staticmethod
    def _running(after: float) -> int:
        """Tasks in progress that can still end (``stall.overdue``)."""
        wall_now = time.time()
        return sum(1 for request in list(state.active_requests)
                   if not stall.overdue(started=request.time_start,
                                        hard_limit=(request.time_limits or (None,))[0]
                                        or getattr(request.task, "time_limit", None),
                                        wall_now=wall_now, stalled_after=after))

    def ready(self) -> dict[str, bool]:
        url = current_app.conf.broker_url
        return {"consuming": self.consumer.blueprint.state == bootsteps.RUN
                and self.stalled() is None,
                "broker": probes.answers(lambda t: probes.check_redis(url, t)),
                "database": probes.answers(probes.check_database)}

    def _oldest_waiting(self, timeout: float = 1.0) -> dict[str, bytes | None] | None:
        """The oldest message of each queue this worker started to consume, read in a
        thread of its own and given ``timeout``: a broker cut off by the network must not hold
        the probe past its own timeout (the kubelet would count that as a failure). ``None``:
        not known in time, or a read is still hanging from an earlier probe."""
        if self._reading is not None and self._reading.is_alive():
            return None
        found: dict[str, dict] = {}

        def read() -> None:
            try:
                found["oldest"] = broker.oldest_waiting(self.queues, timeout) or {}
            except Exception as exc:  # the broker down
                log.warning("could not read this worker's queues: %s", exc)

        self._reading = threading.Thread(target=read, name="stall-check", daemon=True)
        self._reading.start()
        self._reading.join(timeout)
        return found.get("oldest")

    def gauges(self) -> list[tuple[str, str, list[str], list]]:
        active: dict[str, int] = {cls.name(): 0 for cls in registry}
        if pool.configured():  # the runs are this process's threads: count keys
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
    threading.Thread(target=worker.watch, name="stall-watch", daemon=True).start()
    probes.serve(probes.Endpoint("worker", worker.live, worker.ready,
                                 [metrics.Computed(worker.gauges)], _scraped),
                 process_setting("OPERATOR_WORKER_HTTP_PORT", 8082))


def _scraped(body: bytes) -> None:
    """Level 4's evidence: this scrape served metric families reconcilers declare their own."""
    served = evidence.served_families(body)
    own = [cls.name() for cls in registry if served & set(cls.metrics)]
    if not own:
        return
    try:
        evidence.record_scraped(own)
    finally:
        db.connection.close()  # each scrape has its own thread, and so its own connection


def _size_run_pool(sender, **_) -> None:
    """The thread pool's runs share the process: at most its concurrency at once, messages
    carrying several keys included (``runpool``). Prefork children run them one by one."""
    if sender.controller.pool_cls.__module__.endswith(".thread"):
        pool.configure(sender.controller.concurrency)


def _child_exited(**_) -> None:
    metrics.process_exited(os.getpid())


_installed = False


def install() -> None:
    """Tasks for every registered reconciler, beat's schedule (a project's own
    ``CELERY_BEAT_SCHEDULE`` entry of the same name wins) and the worker's consumer
    (``consumer``, unless the project names its own ``CELERY_WORKER_CONSUMER``). Once per
    process: the app's ``ready`` calls it where Celery was loaded first, this module's import
    where it was loaded after Django's set-up (a worker started in-process, Celery's
    autodiscovery)."""
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
    signals.worker_ready.connect(_serve_worker_probes, weak=False)
    signals.worker_ready.connect(_size_run_pool, weak=False)
    signals.worker_process_shutdown.connect(_child_exited, weak=False)


if apps.ready:
    install()
