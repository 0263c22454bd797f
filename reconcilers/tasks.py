"""Celery tasks: thin adapters from a message to plain-Python operator code.

One task per registered reconciler, named ``reconcile:<reconciler>``, so each kind has its own
``rate_limit`` and queue. The message carries ``(key, token)``, never the object. Retries go
through Celery's ``retry`` with the ledger's per-key backoff as the countdown.
"""

from __future__ import annotations

import os
import socket
import time

from celery import Task, shared_task

from operator_project.celery import app

from . import conf, dispatch, history, ledger, runner
from .cache import get_redis
from .models import Outcome
from .registry import NotRegistered, registry

HEARTBEAT_KEY = "operator:heartbeat:worker"

_tasks: dict[str, Task] = {}


def task_name(reconciler: str) -> str:
    return f"reconcile:{reconciler}"


def _make_task(reconciler: str) -> Task:
    try:
        rate_limit = registry.get_class(reconciler).rate_limit
    except NotRegistered:
        rate_limit = None

    @app.task(name=task_name(reconciler), bind=True, acks_late=True,
              reject_on_worker_lost=True, ignore_result=True, max_retries=None,
              rate_limit=rate_limit, typing=False)
    def reconcile_key(self: Task, key: str, token: int) -> str:
        report = runner.run(key, token, worker=f"{self.request.hostname}:{os.getpid()}",
                            task_id=self.request.id or "")
        follow = report.follow_up
        if follow is not None and follow.countdown and report.outcome in (
                Outcome.ERROR, Outcome.REQUEUE):
            # AddRateLimited: Celery's retry carries the ledger's backoff and the new token.
            raise self.retry(kwargs={"key": key, "token": follow.token},
                             countdown=follow.countdown)
        if follow is not None:
            dispatch.send([follow])
        return "dropped" if report.dropped else report.outcome

    return reconcile_key


def task_for(reconciler: str) -> Task:
    """The task of ``reconciler`` (made on first use, so late registrations work too)."""
    task = _tasks.get(reconciler)
    if task is None:
        task = _tasks[reconciler] = _make_task(reconciler)
    return task


def register_all() -> None:
    for cls in registry:
        task_for(cls.name())


@shared_task(name="reconcilers.reap", ignore_result=True)
def reap() -> int:
    """Beat: re-queue runs whose worker died, re-send lost messages, send due retries."""
    found = ledger.reap(float(conf.get("RECONCILERS_REDISPATCH_AFTER")))
    if found.lost_runs:
        history.record_lost_runs(found.lost_runs)
    return dispatch.send(found.dispatches)


@shared_task(name="reconcilers.resync", ignore_result=True)
def resync() -> int:
    """Beat: re-enqueue every cached object of each reconciler whose resync period passed."""
    from . import resync as resync_mod

    return resync_mod.resync_due()


@shared_task(name="reconcilers.prune_history", ignore_result=True)
def prune_history() -> int:
    return history.prune()


@shared_task(name="reconcilers.heartbeat", ignore_result=True)
def heartbeat() -> None:
    """Record that a worker consumed a message; the worker health check reads it."""
    get_redis().hset(HEARTBEAT_KEY, f"{socket.gethostname()}:{os.getpid()}", time.time())
