"""The work queue: client-go's WorkQueue, durable in PostgreSQL, delivered by Celery.

The only way work enters, runs and leaves. Each operation pairs one ledger transition
(``ledger.py``, one SQL statement each) with the messages it implies, sent after the
surrounding transaction commits:

- ``add(keys, trigger)``   enqueue (dedup; a running key is only marked dirty). Batched.
- ``claim(key, token)``    a message becomes a run, or is recognised as stale and dropped.
- ``done(claim, decision)``the run's ``Decision`` moves the key on: idle, backoff (retry after
                           the per-key backoff), or queued again (dirty) - with the run's
                           history row and the claim of the next key, in one statement.
- ``pause(keys)``          pause / resume.
- ``reap()``               recover lost runs (each ended as ``done`` ends a run, with its
                           record), lost messages and due retries (beat).

Messages go through one sender, registered at start-up (``AppConfig.ready`` registers the
Celery one), so this module knows nothing of Celery. Every message's task id is derived from
key and token (``task_id``): one dispatch, one id, whether first try, retry or re-send. When
many keys of one reconciler are due at once (a relist, a stream of events), up to
``RECONCILERS_KEYS_PER_MESSAGE`` of them share a message (one delivery, one ack); each is
still claimed, run and recorded on its own, under its own id. A delayed dispatch (a retry, a
debounced re-run) always has a message of its own.

A message that cannot be sent (broker down) is only logged: the ledger already says
"queued", and the reaper sends it again after ``redispatch_after``, so no key is lost.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Callable, ContextManager, Iterable, Sequence

from django.db import connection as db_connection, transaction

from reconcilers._queue import ledger, reaper, upkeep
from reconcilers._base import metrics
from reconcilers._base.conf import settings
from reconcilers._base.reconcile import Claim, Decision, Dispatch, Key
from reconcilers._queue.ledger import ClaimRequest, Finished, Row
from reconcilers._queue.reaper import Backlog, LostRecord, LostRun, Reaped

__all__ = ["Backlog", "ClaimRequest", "Finished", "LostRecord", "LostRun", "Reaped", "Row",
           "add", "claim", "done", "connect",
           "messages", "pause", "reap", "send", "set_sender", "shared_task_id", "task_id",
           "forget_gone"]

log = logging.getLogger(__name__)

Sender = Callable[[Dispatch, str], None]
ManySender = Callable[[Sequence[Dispatch], str], None]

# The sender (see ``set_sender``): written by the app's ``ready()`` at start-up, and by tests;
# read by every thread that adds or ends a run. Module level because every caller of this
# module sends through the one sender its process registered.
_sender: Sender | None = None
_sender_many: ManySender | None = None
_batch: Callable[[], ContextManager] = contextlib.nullcontext
_connect: Callable[[], None] = lambda: None
_connecting = threading.Lock()


# Why a registered sender rather than ``from reconcilers._queue import broker``: ``broker``
# builds its messages from this module's words (``Dispatch``, ``task_id``), so the import
# would close a cycle; and this module - through which the runner ends every run - stays
# free of Celery, which is ``broker``'s side. The app's ``ready`` registers it once per
# process through this function (never an attribute assigned from outside); tests register
# their own to hold messages back or to fail them.
def set_sender(sender: Sender | None, batch: Callable[[], ContextManager] | None = None,
               many: ManySender | None = None, connect: Callable[[], None] | None = None) -> None:
    """Install the function that publishes one message: ``sender(dispatch, task_id)``;
    optionally ``batch()``: a context in which the sender's messages go to the broker together
    when it ends (one round trip for a relist's or a burst's many); ``many(dispatches,
    task_id)``: one message for several keys of one reconciler (without it, each has its
    own); and ``connect()``: open the broker connection ahead of the first message."""
    global _sender, _sender_many, _batch, _connect
    _sender, _sender_many = sender, many
    _batch, _connect = batch or contextlib.nullcontext, connect or (lambda: None)


def connect() -> None:
    """Open this thread's database connection and the sender's broker connection before the
    first ``add`` needs them, so a restarted watcher's first keys do not wait for both."""
    db_connection.ensure_connection()
    connect_sender()


def connect_sender() -> None:
    """The sender's connection and set-up, which the process shares: a watcher makes them
    while its start-up waits on the network. One at a time: a second caller waits for the
    first and reuses its connection rather than opening another beside it."""
    with _connecting:
        _connect()


def task_id(key: Key, token: int) -> str:
    """Derived from key and token, so the same dispatch always has the same task id."""
    return f"{key}#{token}"


def shared_task_id(dispatches: Sequence[Dispatch]) -> str:
    """A message carrying several keys: its first key's id and how many more it carries."""
    first = dispatches[0]
    return f"{task_id(first.key, first.token)}+{len(dispatches) - 1}"


def messages(dispatches: Sequence[Dispatch], per_message: int) -> list[list[Dispatch]]:
    """Dispatches packed into messages: those due now, up to ``per_message`` of one
    reconciler together; each delayed one alone (its countdown is its own)."""
    out: list[list[Dispatch]] = []
    open_: dict[str, list[Dispatch]] = {}
    for d in dispatches:
        if d.countdown or per_message <= 1:
            out.append([d])
            continue
        current = open_.get(d.key.reconciler)
        if current is None or len(current) >= per_message:
            current = open_[d.key.reconciler] = []
            out.append(current)
        current.append(d)
    return out


def send(dispatches: Sequence[Dispatch]) -> int:
    """Publish the dispatches now (several keys to a message where they can share one);
    returns how many keys the broker took."""
    if dispatches and _sender is None:
        raise RuntimeError("no message sender is registered: is 'reconcilers' in "
                           "INSTALLED_APPS (its AppConfig.ready registers one)?")
    per_message = settings().keys_per_message if _sender_many is not None else 1
    taken: list[Dispatch] = []
    try:
        with _batch() if len(dispatches) > 1 else contextlib.nullcontext():
            for message in messages(dispatches, per_message):
                try:
                    if len(message) == 1:
                        (d,) = message
                        _sender(d, task_id(d.key, d.token))  # type: ignore[misc]
                    else:
                        _sender_many(message, shared_task_id(message))  # type: ignore[misc]
                    taken.extend(message)
                except Exception as exc:  # broker down: the reaper re-sends from the ledger
                    for d in message:
                        metrics.messages_unsent_total.labels(d.key.reconciler).inc()
                    log.error("could not send %s (token %s)%s: %s; the reaper will retry",
                              message[0].key, message[0].token,
                              f" and {len(message) - 1} more" if len(message) > 1 else "", exc)
    except Exception as exc:  # the batch never reached the broker: none of it was sent
        for d in taken:
            metrics.messages_unsent_total.labels(d.key.reconciler).inc()
        log.error("could not send %d messages (%s ...): %s; the reaper will retry",
                  len(taken), taken[0].key if taken else "-", exc)
        return 0
    for d in taken:
        metrics.messages_sent_total.labels(d.key.reconciler).inc()
    return len(taken)


def _send_on_commit(dispatches: Sequence[Dispatch]) -> None:
    """Send once the surrounding transaction commits (at once in autocommit): a message must
    never announce a state the database may still roll back."""
    if dispatches:
        dispatches = list(dispatches)
        transaction.on_commit(lambda: send(dispatches))


def add(keys: Iterable[Key], trigger: str, audit_id: int | None = None) -> int:
    """The single way keys enter the queue (watcher, resync, admin, commands).

    Returns how many keys needed a new message (the rest were already queued or running).
    """
    dispatches = ledger.enqueue(keys, trigger, audit_id, batch=settings().enqueue_batch)
    _send_on_commit(dispatches)
    _count_adds(dispatches)
    return len(dispatches)


def _count_adds(dispatches: Sequence[Dispatch]) -> None:
    per: dict[str, int] = {}
    for d in dispatches:
        per[d.key.reconciler] = per.get(d.key.reconciler, 0) + 1
    for name, count in per.items():
        metrics.adds_total.labels(name).inc(count)


def claim(key: Key, token: int, worker: str, lease_seconds: float) -> Claim | None:
    """The run for message ``(key, token)``, or ``None``: a stale message, drop it."""
    return ledger.claim(key, token, worker, lease_seconds)


def done(claim_: Claim, decision: Decision, debounce: float = 0.0, record: Row | None = None,
         then: ClaimRequest | None = None) -> Finished:
    """End a run as ``decision`` says, in one statement (``ledger.finish``); its follow-up
    message (if any) is sent once the surrounding transaction commits - at once outside one.

    ``debounce``: a re-run for changes seen during this run waits that long, gathering more.
    ``record``: the run's history row, written by the same statement (a recorded run is a
    finished run). ``then``: the key the same run thread takes up next, claimed by it too
    (``Finished.next_claim``; on ``LeaseLost`` the exception's ``next_claim``).
    """
    finished = ledger.finish(claim_, decision, settings().max_countdown, debounce, record, then)
    if finished.follow_up is not None:
        _send_on_commit([finished.follow_up])
    return finished


def pause(keys: Sequence[Key], paused: bool) -> int:
    """Pause (never claimed until resumed) or resume keys; resuming sends what waited."""
    dispatches = upkeep.set_paused(keys, paused)
    _send_on_commit(dispatches)
    return len(dispatches)


def forget_gone(older_than: float = 3600.0) -> int:
    """Drop the ledger rows of objects gone for an hour (beat, with history pruning)."""
    return upkeep.forget_gone(older_than)


def forget_outside(covered: dict[str, set[str] | None]) -> int:
    """Drop the rows of keys no watcher covers (``scopes``): for each reconciler some
    deployment runs, its keys in namespaces none of them watches - unless running (the run
    ends first; the next reap forgets it). A message still on its way then finds no row and
    is dropped as stale."""
    forgotten = 0
    for reconciler, namespaces in sorted(covered.items()):  # the ledger's lock order
        if namespaces is not None:
            forgotten += upkeep.forget_outside(reconciler, namespaces)
    if forgotten:
        log.warning("forgot %d keys in namespaces no watcher covers any more", forgotten)
    return forgotten


def forget_in(reconciler: str, namespaces: Iterable[str]) -> int:
    """Drop the rows of ``reconciler``'s keys in ``namespaces`` unless running (``scopes``)."""
    forgotten = upkeep.forget_in(reconciler, namespaces)
    if forgotten:
        log.warning("forgot %d keys of %s in namespaces no longer watched", forgotten,
                    reconciler)
    return forgotten


def reap(backlog: Backlog | None = None, record: LostRecord | None = None) -> Reaped:
    """Recover what crashes and lost messages left behind, and send what is due. A run whose
    worker vanished is ended as every run is (``ledger.finish``), with its history row
    ``record(run, decision)`` in the same statement. ``backlog``: how long the broker's oldest
    waiting messages have waited, if the sender can tell (see ``reaper.reap``)."""
    conf = settings()
    found = reaper.reap(conf.redispatch_after, conf.backoff(), backlog, record)
    send(found.dispatches)
    if found.lost_runs:
        metrics.reaper_recoveries_total.labels("lost_run").inc(len(found.lost_runs))
    if found.dispatches:
        metrics.reaper_recoveries_total.labels("sent").inc(len(found.dispatches))
    return found


def gauges() -> list[tuple[str, str, list[str], list]]:
    """The ledger's figures for a scrape (``metrics.Computed``): depth (queued keys), keys by
    state, and the running keys' unfinished work and longest run."""
    rows = upkeep.stats()
    names = {r: 0 for r, *_ in rows}  # 0, not a missing series, once the queue drains
    queued = {**names, **{r: n for r, state, n, _, _ in rows if state == "queued"}}
    depth = [((r,), n) for r, n in queued.items()]
    busy = {r: (total, longest) for r, state, _, total, longest in rows if state == "running"}
    running = [(r, *busy.get(r, (0.0, 0.0))) for r in names]
    return [
        ("workqueue_depth", "Current depth of workqueue", ["name"], depth),
        ("operator_ledger_items", "Keys in the work ledger by state", ["name", "state"],
         [((r, state), n) for r, state, n, _, _ in rows]),
        ("workqueue_unfinished_work_seconds",
         "How many seconds of work has been done that is in progress and hasn't been "
         "observed by work_duration", ["name"], [((r,), total) for r, total, _ in running]),
        ("workqueue_longest_running_processor_seconds",
         "How many seconds has the longest running processor for workqueue been running",
         ["name"], [((r,), longest) for r, _, longest in running]),
    ]
