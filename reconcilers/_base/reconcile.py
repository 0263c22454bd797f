"""The run's vocabulary: one small module of the types every step of a key's way shares.

A key travels event -> ledger -> message -> claim -> reconcile -> decision -> record; the
watcher, the ledger, the runner, the ORM and the admin all speak of it in these words, and
each word is defined here once with its contract (controller-runtime's ``pkg/reconcile``):

- ``Key`` - what queues carry: reconciler, namespace, name (never the object).
- ``Trigger`` - why a key was enqueued; ``State`` - where the ledger holds it;
  ``Outcome`` - how its run ended. Their values are what the database stores.
- ``Result`` and ``TemporaryError`` / ``PermanentError`` - what a reconcile returns or raises.
- ``Decision`` - how a run ended and what follows it (made by ``decision.decide``).
- ``Dispatch`` - a message the ledger asks to be sent for a key; ``Claim`` - a run's hold on
  its key; ``LeaseLost`` - raised once that hold may have passed.

Nothing here does I/O or imports the app beyond ``vocab``; the enumerations are Django's
``TextChoices`` so the models can offer them as field choices.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import NamedTuple

from django.db.models import TextChoices

from reconcilers._base.vocab import object_path, split_object_path


class Key(NamedTuple):
    """An object key: which reconciler, which object. What queues carry, never the object.

    Its text form ``<reconciler>:<namespace>/<name>`` (``<reconciler>:<name>`` when
    cluster-scoped) is the one key format of logs, task ids and the admin."""

    reconciler: str
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.reconciler}:{object_path(self.namespace, self.name)}"

    @classmethod
    def parse(cls, text: str) -> "Key":
        """The inverse of ``str(key)``; ``<reconciler>:<name>`` is accepted for cluster scope."""
        reconciler, sep, obj = text.partition(":")
        if not sep or not reconciler or not obj:
            raise ValueError(f"malformed key {text!r}; expected <reconciler>:<namespace>/<name>")
        namespace, name = split_object_path(obj)
        if not name:
            raise ValueError(f"malformed key {text!r}: no object name")
        return cls(reconciler, namespace, name)


class Trigger(TextChoices):
    """Why a key was enqueued. A run absorbs every trigger that arrived while it waited."""

    ADDED = "added"
    MODIFIED = "modified"
    DELETED = "deleted"
    OWNED = "owned-child"
    WATCHED = "watched"  # a related object (``Watches``) changed
    RESYNC = "resync"
    MANUAL = "manual"
    RETRY = "retry"
    REQUEUE = "requeue"
    RELIST = "relist"
    START = "start"  # a new leader's pass: the code or settings changed (``onstart``)


class State(TextChoices):
    """Ledger states. ``queued`` has a message on its way; ``backoff`` waits for ``due_at``."""

    IDLE = "idle"
    QUEUED = "queued"
    RUNNING = "running"
    BACKOFF = "backoff"


class Outcome(TextChoices):
    """How a run ended: database, logs, metrics and admin all use these words."""

    SUCCESS = "success"
    REQUEUE = "requeue"
    REQUEUE_AFTER = "requeue_after"
    ERROR = "error"
    PERMANENT = "permanent"
    GONE = "gone"
    SKIPPED = "skipped"


@dataclass(frozen=True)
class Result:
    """What ``reconcile()`` returns: ``None``/``Result.done()`` (converged), ``Result.again()``
    (run again soon, with backoff) or ``Result.after(seconds)`` (poll later; resets the
    backoff). What each leads to is decided in one place: ``decision.decide``."""

    requeue: bool = False
    requeue_after: float | None = None

    @classmethod
    def done(cls) -> "Result":
        return cls()

    @classmethod
    def again(cls) -> "Result":
        """Run again with the key's backoff (client-go's ``Result{Requeue: true}``)."""
        return cls(requeue=True)

    @classmethod
    def after(cls, seconds: float) -> "Result":
        """Run again after ``seconds``; the way to poll (client-go's ``RequeueAfter``)."""
        if seconds < 0:
            raise ValueError("requeue_after must be >= 0")
        return cls(requeue_after=float(seconds))


class ReconcileError(Exception):
    """Base of the control-word exceptions a reconcile raises; any other exception is retried
    with the key's backoff."""


class TemporaryError(ReconcileError):
    """Retry later: after ``delay`` seconds if given, else after the key's backoff."""

    def __init__(self, message: str = "", delay: float | None = None):
        super().__init__(message)
        self.delay = delay


class PermanentError(ReconcileError):
    """The spec can never work as it is: record it and stop retrying until the object changes."""


@dataclass(frozen=True)
class Decision:
    """How a run ended and what follows it: handed to history (what happened) and to the work
    queue (what happens next), so the two never disagree."""

    outcome: str
    attempts: int = 0  # consecutive failures after this run; 0 = forgotten (client-go Forget)
    delay: float | None = None  # seconds until the next run; None = no follow-up of its own
    trigger: str = ""  # why the follow-up runs: retry | requeue
    error_class: str = ""
    error_message: str = ""
    traceback: str = ""

    @property
    def ok(self) -> bool:
        return self.outcome in (Outcome.SUCCESS, Outcome.REQUEUE_AFTER)


class Dispatch(NamedTuple):
    """A message to send for ``key`` once the ledger's transaction commits: the one whose
    ``token`` may claim the key. Sending it twice is harmless - only one claim wins."""

    key: Key
    token: int
    countdown: float | None = None
    # When the ledger dispatched it, by the database's clock (epoch seconds): the message's
    # send time, which the reaper compares with ``dispatched_at`` - one clock on both sides.
    at: float | None = None


class LeaseLost(Exception):
    """This run's hold on its key has run out: it must not act on the cluster any more.

    ``next_claim``: the run the statement that found this also claimed, if it claimed one."""

    def __init__(self, message: str, next_claim: Claim | None = None) -> None:
        super().__init__(message)
        self.next_claim = next_claim


@dataclass(frozen=True)
class Claim:
    """A run's hold on its key: valid while ``token`` is current and the lease holds."""

    id: int
    key: Key
    token: int
    attempts: int
    triggers: list[str]
    audit_ids: list[int]
    waited: float = 0.0  # seconds from ready (enqueued, or due after a backoff) to claimed
    # Local monotonic time (it keeps counting while the process is stopped) a second before
    # the lease ends in the database: past it the reaper may already have given the key to
    # another run, so this one must stop writing.
    held_until: float = math.inf
    # Set when the run is abandoned past its hard limit (``runner``): its record is written
    # and its key released for a retry, so whatever the stuck thread does next must not write.
    released: threading.Event = field(default_factory=threading.Event, compare=False,
                                      repr=False)

    def check_held(self) -> None:
        """Raise ``LeaseLost`` once the lease may have passed (a fence before every write)."""
        if self.released.is_set():
            raise LeaseLost(f"{self.key}: the run was abandoned past its deadline and its key "
                            "released, so it stops here")
        if time.monotonic() >= self.held_until:
            raise LeaseLost(f"{self.key}: the run outlived its lease; its key may be running "
                            "elsewhere, so it stops here")
