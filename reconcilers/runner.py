"""Run one reconcile for one key and say how it ended. Plain Python: no Celery here.

``run()`` is client-go's ``processNextWorkItem`` + ``syncHandler``: claim the key in the ledger
(or drop a stale message), re-read the object from the cache (404 = gone), call the user's
``reconcile`` / ``finalize`` inside exception capture and a renewed lease, map the result to one
outcome (``success | requeue | requeue_after | error | permanent | gone | skipped``), write one
history record and finish the ledger item in one transaction, and return the follow-up message
(dirty re-run, retry countdown) for the caller to send.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime, timezone

from django.db import close_old_connections, connection, transaction
from kubernetes.client.exceptions import ApiException

from . import cache, conf, history, kube, ledger
from .context import Context
from .ledger import Claim, Dispatch, Finish, Key
from .models import Outcome
from .registry import NotRegistered, Registry, registry as default_registry
from .results import PermanentError, Result, TemporaryError
from .spec import Reconciler

log = logging.getLogger(__name__)


@dataclass
class RunReport:
    """What happened to one message."""

    dropped: bool = False  # stale or duplicate message: nothing ran
    outcome: str = ""
    follow_up: Dispatch | None = None
    error: str = ""
    record_id: int | None = None


@dataclass
class _Run:
    outcome: str = Outcome.SUCCESS
    delay: float | None = None
    attempts: int = 0
    retry_trigger: str = "retry"
    error_class: str = ""
    error_message: str = ""
    tb: str = ""
    obj: dict | None = None
    final: dict | None = None  # the object as the run left it (status written)
    phase: str = ""
    events: list = field(default_factory=list)


def worker_identity() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class _LeaseKeeper:
    """Renews the claim's lease every third of its length while user code runs."""

    def __init__(self, claim: Claim, lease: float):
        self.claim, self.lease = claim, lease
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name=f"lease:{claim.key}")

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(5)

    def _loop(self) -> None:
        try:
            while not self._stop.wait(self.lease / 3):
                if not ledger.renew(self.claim, self.lease):
                    log.warning("%s: lease lost while running", self.claim.key)
                    return
        except Exception:  # a failed renewal only risks a duplicate run after expiry
            log.exception("%s: lease renewal failed", self.claim.key)
        finally:
            connection.close()


def read_object(cls: type[Reconciler], key: Key, api) -> dict | None:
    """The current object: from the cache once it is synced, else from the api-server."""
    gvr = cls.primary()
    namespace = key.namespace if gvr.namespaced else None
    if cache.is_synced(gvr):
        return cache.get(gvr, namespace, key.name)
    try:
        return kube.request(api, "GET", gvr.path(namespace, key.name))
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def _call(reconciler: Reconciler, cls: type[Reconciler], obj: dict, ctx: Context,
          state: _Run) -> tuple[str, Result | None]:
    """Finalizer handling around the user's code. Returns (outcome if decided here, result)."""
    finalizer = cls.finalizer_name()
    meta = obj["metadata"]
    if meta.get("deletionTimestamp"):
        if finalizer and finalizer in (meta.get("finalizers") or []):
            state.phase = "finalize"
            result = reconciler.finalize(obj, ctx)  # type: ignore[attr-defined]
            if result is None or (not result.requeue and result.requeue_after is None):
                ctx.remove_finalizer(finalizer)
            return "", result
        return Outcome.SKIPPED, None
    state.phase = "reconcile"
    if finalizer:
        ctx.add_finalizer(finalizer)
        obj = ctx.obj
    if cls.resource is None:
        return "", reconciler.reconcile(obj, ctx)
    typed = cls.resource(obj)
    result = reconciler.reconcile(typed, ctx)
    patch = typed.status_patch()
    if patch.get("status"):
        ctx.patch_status(patch["status"])
    return "", result


def _classify(run: _Run, result: Result | None, decided: str, backoff: conf.Backoff) -> None:
    failures = run.attempts + 1
    if decided:
        run.outcome, run.attempts = decided, 0
    elif result is None or (not result.requeue and result.requeue_after is None):
        run.outcome, run.attempts = Outcome.SUCCESS, 0
    elif result.requeue_after is not None:
        # Polling is not failing: reset the backoff (client-go Forget + AddAfter).
        run.outcome, run.attempts = Outcome.REQUEUE_AFTER, 0
        run.delay, run.retry_trigger = result.requeue_after, "requeue"
    else:
        run.outcome, run.attempts = Outcome.REQUEUE, failures
        run.delay, run.retry_trigger = backoff.delay(failures), "requeue"


def _capture(run: _Run, exc: BaseException, backoff: conf.Backoff) -> None:
    failures = run.attempts + 1
    run.error_class = f"{type(exc).__module__}.{type(exc).__qualname__}"
    run.error_message = str(exc)[:4000]
    run.tb = "".join(traceback.format_exception(exc))[-16000:]
    if isinstance(exc, PermanentError):
        run.outcome, run.attempts = Outcome.PERMANENT, 0
        return
    delay = None
    if isinstance(exc, TemporaryError):
        delay = exc.delay
    elif isinstance(exc, ApiException):
        err = kube.classify(exc)
        run.error_message = f"{err.status} {err.reason}: {err.message}"[:4000]
        if err.permanent:
            run.outcome, run.attempts = Outcome.PERMANENT, 0
            return
        delay = err.retry_after
    run.outcome, run.attempts = Outcome.ERROR, failures
    run.delay = delay if delay is not None else backoff.delay(failures)


def run(key_text: str, token: int, *, registry: Registry | None = None,
        worker: str | None = None, task_id: str = "") -> RunReport:
    """Process one message ``(key, token)``; never raises for anything user code does."""
    registry = registry or default_registry
    key = Key.parse(key_text)
    worker = worker or worker_identity()
    try:
        cls: type[Reconciler] | None = registry.get_class(key.reconciler)
    except NotRegistered:
        cls = None
    lease = float((cls and cls.timeout) or conf.get("RECONCILERS_LEASE_SECONDS"))
    close_old_connections()  # connections outlive tasks (CELERY_DB_REUSE_MAX): retire stale ones
    claim = ledger.claim(key, token, worker, lease)
    if claim is None:
        return RunReport(dropped=True)

    started = datetime.now(timezone.utc)
    t0 = time.perf_counter()
    state = _Run(attempts=claim.attempts)
    backoff = conf.Backoff(
        float((cls and cls.backoff_base) or conf.get("RECONCILERS_BACKOFF_BASE")),
        float((cls and cls.backoff_max) or conf.get("RECONCILERS_BACKOFF_MAX")))
    try:
        if cls is None:
            raise PermanentError(f"no reconciler named {key.reconciler!r} is registered here")
        api = kube.api_client()
        obj = read_object(cls, key, api)
        state.obj = obj
        if obj is None:
            state.outcome, state.attempts = Outcome.GONE, 0
        else:
            ctx = Context(key, cls, obj, api)
            try:
                with _LeaseKeeper(claim, lease):
                    decided, result = _call(registry.get(key.reconciler), cls, obj, ctx, state)
            finally:
                state.events, state.final = ctx.events, ctx.obj
            _classify(state, result, decided, backoff)
    except Exception as exc:
        _capture(state, exc, backoff)
    duration = time.perf_counter() - t0

    if state.outcome in (Outcome.ERROR, Outcome.PERMANENT):
        log.warning("%s: %s after %.1f ms: %s", key, state.outcome, duration * 1000,
                    state.error_message)
    follow_up, record_id = _finish(claim, state, started, duration, worker, task_id)
    return RunReport(outcome=state.outcome, follow_up=follow_up, error=state.error_message,
                     record_id=record_id)


def _finish(claim: Claim, state: _Run, started: datetime, duration: float, worker: str,
            task_id: str) -> tuple[Dispatch | None, int | None]:
    """History and ledger in one transaction: a recorded run is always a finished run."""
    for attempt in range(3):
        try:
            with transaction.atomic():
                record = history.record_run(
                    claim, state.obj, outcome=state.outcome, started=started,
                    duration=duration, requeue_after=state.delay,
                    error_class=state.error_class, error_message=state.error_message,
                    traceback=state.tb, worker=worker, task_id=task_id, events=state.events,
                    final=state.final, phase=state.phase)
                follow_up = ledger.finish(claim, Finish(
                    outcome=state.outcome, attempts=state.attempts, delay=state.delay,
                    retry_trigger=state.retry_trigger, error=state.error_message),
                    max_countdown=float(conf.get("RECONCILERS_MAX_COUNTDOWN")))
            return follow_up, record.pk
        except Exception:
            # The database blinked; the lease still protects the key. If all attempts fail,
            # the lease expires and the reaper re-queues it: the run is retried, not lost.
            log.exception("%s: could not record the run (attempt %d)", claim.key, attempt + 1)
            close_old_connections()
            connection.close()
            time.sleep(0.5 * (attempt + 1))
    return None, None
