"""Run one reconcile for one key and say how it ended. Plain Python: no Celery here.

``work()`` is client-go's worker loop and ``Job.run`` its ``processNextWorkItem`` +
``syncHandler``: claim the key in the work queue (or drop a stale message), let ``call.attempt``
read the object, call the user's code and decide what follows, then end the run with one statement
(``workqueue.done``: the key moved on, the run's history row written, the follow-up message
sent once committed) - which, when another key waits for this run thread, also claims that
key (``Done`` then ``Get``), and the loop goes on with it. The pool (``pool``) only provides
the threads, the line of waiting keys and a ``Lane`` to take from it.

A run's deadline (``RunLimits``) bounds it three ways: the worker interrupts user code at the
soft limit (recorded as an error, retried with backoff), ends the process at the hard limit
(the prefork pool does both itself; in the thread pool ``deadlines`` does),
and the key's lease outlasts both - so the reaper only ever re-queues a key whose run can no
longer act. Every write ``ctx`` makes first checks the claim is still held (a fence for a run
whose process was stopped past its lease).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from contextlib import contextmanager, nullcontext
from typing import Iterator, Sequence
from dataclasses import dataclass, replace
from types import SimpleNamespace

from django.db import close_old_connections, connection, transaction

from reconcilers._kube import kube
from reconcilers._run import call, deadlines, history, inputs, pool, timers
from reconcilers._base import connections, logs, metrics
from reconcilers._queue import workqueue
from reconcilers._base.conf import Backoff, RunLimits, settings
from reconcilers._kube.context import fence_until
from reconcilers._queue.decision import decide
from reconcilers._base.reconcile import Claim, Decision, Dispatch, Key, LeaseLost, Outcome, Trigger
from reconcilers._queue.workqueue import ClaimRequest
from reconcilers._run.evidence import HEALED, new_evidence
from reconcilers._authoring.registry import (NotRegistered, ReconcilerRegistry,
                                          registry as default_registry)
from reconcilers._authoring.reconciler import Reconciler
from reconcilers._base.vocab import utcnow

log = logging.getLogger(__name__)


class RunAbandoned(TimeoutError):
    """A run still going at its hard limit in a thread-pool worker: blocked outside Python (a
    sleep, a socket without a timeout), where the soft limit's exception cannot reach it."""


@dataclass(frozen=True)
class RunReport:
    """What happened to one message."""

    dropped: bool = False  # stale or duplicate message: nothing ran
    outcome: str = ""
    error: str = ""
    record_id: int | None = None
    follow_up: Dispatch | None = None  # the next message for this key (already sent)


def worker_identity() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def run(key_text: str, token: int, *, registry: ReconcilerRegistry | None = None,
        worker: str | None = None, task_id: str = "",
        soft_limit_error: type[BaseException] | None = None) -> RunReport:
    """Process one message ``(key, token)`` here and now; never raises for anything user code
    does. ``soft_limit_error``: see ``Job``."""
    return Job(Key.parse(key_text), token, registry or default_registry,
               worker or worker_identity(), task_id, soft_limit_error).run()


@dataclass(frozen=True)
class Job:
    """One key of a message, to run: what ``run`` needs, so a run thread can take it up."""

    key: Key
    token: int
    registry: ReconcilerRegistry
    worker: str
    task_id: str
    # What the worker raises in user code at the run's soft limit - the task layer passes
    # Celery's SoftTimeLimitExceeded, as the prefork pool raises it, so a reconciler catches
    # the same exception in either pool and this module needs no Celery. A run it ended is
    # recorded as past its deadline. None: ``deadlines`` raises its own (TimeoutError), which
    # is not told apart from user code's own TimeoutError.
    soft_limit_error: type[BaseException] | None = None

    def run(self, lane: pool.Lane | None = None, claimed: object = pool.NOTHING) -> RunReport:
        """Claim (unless the statement that ended the run before it on this thread did:
        ``claimed`` is that claim, or ``None`` for a stale message), reconcile, decide, end -
        and, given the thread's ``lane``, take up the next waiting key in that ending."""
        key, cls = self.key, _class_of(self.registry, self.key)
        claim = claimed if isinstance(claimed, Claim) or claimed is None else _claim(
            self.claim_request())
        if claim is None:
            metrics.messages_stale_total.labels(key.reconciler).inc()
            return RunReport(dropped=True)
        metrics.queue_duration_seconds.labels(key.reconciler).observe(claim.waited)
        with logs.bound(reconciler=key.reconciler, namespace=key.namespace, name=key.name,
                        trigger=",".join(claim.triggers), attempt=claim.attempts + 1,
                        task_id=self.task_id), _in_progress(key.reconciler):
            return _run_claimed(claim, cls, self, lane)

    def claim_request(self) -> ClaimRequest:
        cls = _class_of(self.registry, self.key)
        return ClaimRequest(self.key, self.token, self.worker,
                            RunLimits.of(cls and cls.timeout).lease)


def _class_of(registry: ReconcilerRegistry, key: Key) -> type[Reconciler] | None:
    try:
        return registry.get_class(key.reconciler)
    except NotRegistered:
        return None


# Runs between claim and finish, by reconciler: written by run threads, under the lock.
_running: dict[str, int] = {}
_running_lock = threading.Lock()


@contextmanager
def _in_progress(reconciler: str) -> Iterator[None]:
    with _running_lock:
        _running[reconciler] = _running.get(reconciler, 0) + 1
    try:
        yield
    finally:
        with _running_lock:
            _running[reconciler] -= 1


def in_progress() -> dict[str, int]:
    """Runs of this process between their claim and their finish, by reconciler: in a thread-
    pool worker, what its workers are doing (a message may carry several keys, run at once)."""
    with _running_lock:
        return dict(_running)


def run_many(items: Sequence[tuple[str, int] | tuple[str, int, str]], *,
             registry: ReconcilerRegistry | None = None, worker: str | None = None,
             soft_limit_error: type[BaseException] | None = None) -> list[RunReport]:
    """The ``(key, token)`` pairs of one message carrying several (or one; a third value is
    the task id when it is not ``<key>#<token>``): each run as ``run`` runs a message of its
    own - its own claim, deadline, record, and the task id its own message would have had -
    at once where the process has run threads (``runpool``). ``soft_limit_error``: see
    ``Job``."""
    registry, worker = registry or default_registry, worker or worker_identity()
    jobs = []
    for item in items:
        key = Key.parse(item[0])
        task_id = item[2] if len(item) > 2 else workqueue.task_id(key, item[1])
        jobs.append(Job(key, item[1], registry, worker, task_id, soft_limit_error))
    return pool.run_all(work, jobs)


def work(entry: pool.Waiting[Job], lane: pool.Lane) -> None:
    """A run thread's loop, client-go's ``processNextWorkItem`` over and over: claim the key
    (unless the statement that ended the run before did), reconcile, decide, then end the run
    - and, when a key waits, claim it in that same statement - and go on with that key. The
    pool only provides the threads, the line and the lane; every step is ``Job.run``'s."""
    current: pool.Waiting[Job] | None = entry
    while current is not None:
        try:
            current.settle(current.item.run(lane, current.handed))
        except BaseException as exc:  # noqa: BLE001 - whoever waits for the run re-raises it
            current.settle(exception=exc)
        current = lane.next_up()


def _claim(request: ClaimRequest) -> Claim | None:
    """``workqueue.claim`` on a sound connection: checked at most once a second per thread
    (connections outlive tasks, ``CELERY_DB_REUSE_MAX``); one the database dropped since
    fails the claim, which then runs once more on a new one."""
    return connections.once_more_on_new(lambda: workqueue.claim(*request), request.key, "claim")


def _run_claimed(claim: Claim, cls: type[Reconciler] | None, job: Job,
                 lane: pool.Lane | None) -> RunReport:
    key, conf = claim.key, settings()
    registry, worker, task_id = job.registry, job.worker, job.task_id
    limits = RunLimits.of(cls and cls.timeout)

    started = utcnow()
    t0 = time.perf_counter()
    backoff = conf.backoff(cls and cls.backoff_base, cls and cls.backoff_max)
    on_hard = None
    if lane is not None and (release := lane.abandoner()) is not None:  # abandoned if stuck
        start = _RunStart(started, t0, worker, task_id)
        on_hard = lambda: _abandon(claim, limits, backoff, start, release)  # noqa: E731
    # Every api-server call of this run names it (User-Agent): the audit log shows who wrote.
    interrupt = job.soft_limit_error or deadlines.SOFT_LIMIT_ERROR
    with deadlines.guard(str(key), limits.soft, limits.hard, abandon=on_hard,
                         interrupt=interrupt), \
            kube.acting_for_run(f"{claim.token}-{uuid.uuid4().hex[:8]}"):
        done = call.attempt(key, cls, registry, attempts=claim.attempts, backoff=backoff,
                       fence=fence_until(claim.check_held, claim.held_until),
                       triggers=claim.triggers)
    if claim.released.is_set():  # abandoned: its record is written, its key released
        # What it ended with is said here, the one place it shows: a write its fence refused
        # (LeaseLost) is how such a run usually ends.
        ended = f" (it ended with {type(done.error).__name__}: {done.error})" \
            if done.error is not None else ""
        log.warning("%s: an abandoned run returned after %.1f s; its outcome is dropped%s",
                    key, time.perf_counter() - t0, ended)
        return RunReport(dropped=True)
    decision, seen = done.decision, done.seen
    if decision.trigger == Trigger.RETRY and call.only_timers(claim.triggers):
        # A failed timer is retried as that timer, not as a reconcile.
        decision = replace(decision, trigger=timers.PREFIX + timers.fired(claim.triggers)[0])
    duration = time.perf_counter() - t0
    if decision.outcome == Outcome.ERROR and decision.error_class == _qualname(
            job.soft_limit_error):
        decision = replace(decision, error_message=(
            f"run deadline of {limits.soft:g}s exceeded (the reconciler's timeout): "
            f"{decision.error_message or decision.error_class}")[:4000])

    changed = ", ".join(done.ctx.changed_children)[:500] if done.ctx is not None else ""
    # A reported action keeps what the run changed with it: the capability evidence asks for
    # an action the cluster saw, not only a sentence (``evidence.EVIDENCE``).
    capabilities = [{**c, "changed": changed} if changed else c for c in seen.capabilities]
    if Trigger.OWNED in claim.triggers and changed:
        capabilities = [*capabilities, {"action": HEALED, "detail": changed}]
    facts = history.RunFacts(started=started, duration=duration, worker=worker, task_id=task_id,
                             obj=seen.obj, final=seen.final, events=seen.events,
                             phase=seen.phase, capabilities=capabilities)
    t1 = time.perf_counter()
    record_id, follow_up = _finish(claim, decision, facts, cls.debounce if cls else 0.0, lane)
    if record_id is not None:  # a run whose record rolled back (lease lost) is not counted
        metrics.history_write_seconds.observe(time.perf_counter() - t1)
        metrics.observe_run(key.reconciler, decision.outcome, duration,
                            retry=decision.delay is not None and decision.attempts > 0)
        logs.bind(record_id=record_id)
    if record_id is not None and seen.read is not None and inputs.wanted(decision.outcome):
        _keep_inputs(record_id, done, claim.triggers)
    if decision.outcome in (Outcome.ERROR, Outcome.PERMANENT):
        log.warning("%s: %s after %.1f ms: %s", key, decision.outcome, duration * 1000,
                    decision.error_message)
    return RunReport(outcome=decision.outcome, error=decision.error_message,
                     record_id=record_id, follow_up=follow_up)


def _qualname(error: type[BaseException] | None) -> str | None:
    """An exception class as ``Decision.error_class`` names it."""
    return None if error is None else f"{error.__module__}.{error.__qualname__}"


def _keep_inputs(record_id: int, done: call.Attempt, triggers: Sequence[str]) -> None:
    """Keep what the run read and wrote for a replay; never at the run's expense."""
    try:
        inputs.keep(record_id, done.seen.read, done.ctx.lister.reads or [] if done.ctx else [],
                    done.ctx.writes if done.ctx else [], list(triggers))
    except Exception as exc:  # noqa: BLE001 - a replay aid, not the run
        log.warning("run #%s: inputs not kept (%s)", record_id, exc)


@dataclass(frozen=True)
class _RunStart:
    """What an abandonment knows of the run it abandons."""

    started: object
    t0: float
    worker: str
    task_id: str


def _abandon(claim: Claim, limits: RunLimits, backoff: Backoff, run: _RunStart,
             release: pool.Abandon) -> None:
    """Past the hard limit, in a thread of its own: record the run as an error, release its
    key for a retry with backoff, fence its writes, and hand its place in the pool to a new
    thread; the stuck one is left to finish on its own. Too many still stuck: drain and exit."""
    claim.released.set()  # from here the stuck run's writes raise LeaseLost
    error = RunAbandoned(
        f"run deadline of {limits.soft:g}s exceeded and still running at the hard limit "
        f"({limits.hard:g}s): blocked outside Python (a sleep, a socket read without a "
        "timeout), where the interruption cannot reach it; its thread was abandoned and "
        "replaced, and the key is retried with backoff")
    decision = decide(attempts=claim.attempts, backoff=backoff, error=error)
    facts = history.RunFacts(started=run.started, duration=time.perf_counter() - run.t0,
                             worker=run.worker, task_id=run.task_id, phase="reconcile")
    record_id, follow_up = None, None
    try:
        record_id, follow_up = _finish(claim, decision, facts)
        metrics.observe_run(claim.key.reconciler, decision.outcome, facts.duration, retry=True)
    finally:
        connection.close()  # this thread's own
        stuck = release(RunReport(outcome=decision.outcome, error=decision.error_message,
                                  record_id=record_id, follow_up=follow_up))
    log.error("%s: abandoned past its hard limit (%g s); %d abandoned run thread(s) of this "
              "process still stuck", claim.key, limits.hard, stuck)
    if stuck > settings().abandoned_runs_max:
        deadlines.drain_and_exit(f"{stuck} abandoned run threads still stuck (more than "
                                 "RECONCILERS_ABANDONED_RUNS_MAX)")


def _finish(claim: Claim, decision: Decision, facts: history.RunFacts, debounce: float = 0.0,
            lane: pool.Lane | None = None) -> tuple[int | None, Dispatch | None]:
    """End the run: one statement (``workqueue.done``) moves its key on and writes its history
    row - a recorded run is always a finished run - and, when a key waits for this run thread
    (``lane``), claims that one too, handed to its run, which follows on this thread (one
    round trip instead of two: the ledger's statements cost PostgreSQL and the worker more
    than anything else in a run). A run that proves a capability criterion for the first time
    also writes that evidence, in one transaction with the statement.

    The next key is taken only on the first attempt and without evidence to write: a failed
    statement (or a rolled-back transaction) claimed nothing, and the key taken then claims
    for itself, as does a second message for this run's own key."""
    values = history.new_values(claim, decision, facts)
    row = history.as_row(values)
    evidence = bool(new_evidence(SimpleNamespace(**values), claim.attempts))
    for attempt in range(3):
        waiting = lane.take() if lane is not None and attempt == 0 and not evidence else None
        job = waiting.item if waiting is not None and isinstance(waiting.item, Job) else None
        then = job.claim_request() if job is not None and job.key != claim.key else None
        if then is not None:
            # this statement claims a run: a busy thread's only claim
            connections.check_now_and_then()
        try:
            with transaction.atomic() if evidence else nullcontext():
                finished = workqueue.done(claim, decision, debounce, row, then)
                if evidence:
                    history.record_evidence_of(finished.record_id, values, claim.attempts)
            if then is not None:
                waiting.handed = finished.next_claim  # type: ignore[union-attr]
            return finished.record_id, finished.follow_up
        except LeaseLost as exc:
            # Outlived its lease (a stopped process, a deadline ignored): another run has the
            # key now. No record was written; the reaper's "worker lost" record stands. The
            # next key's claim, made by the same statement, stands too.
            if then is not None:
                waiting.handed = exc.next_claim  # type: ignore[union-attr]
            log.warning("%s", exc)
            return None, None
        except Exception:
            # The database blinked; the lease still protects the key. If all attempts fail,
            # the lease expires and the reaper re-queues it: the run is retried, not lost.
            log.exception("%s: could not record the run (attempt %d)", claim.key, attempt + 1)
            close_old_connections()
            connection.close()
            time.sleep(0.5 * (attempt + 1))
    return None, None
