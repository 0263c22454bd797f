"""The watcher's streams: shared informers, wired from the reconcilers' declarations.

One ``Stream`` per watched resource and namespace, shared by every reconciler that watches it,
is three parts with one job each:

- a ``Reflector`` (``reflector.py``) lists and watches, keeps the shared cache, reports changes;
- a ``Router`` (``handlers.py``) maps each change to the keys it concerns, for the
  ``Enqueuer`` (``enqueuer.py``);
- a ``StreamStatus`` records what the admin's "watch streams" page shows.

``build_streams`` wires them from the reconcilers (their handlers, cache scopes and indexes);
``replay_journal`` routes again, through them, what a previous leader journalled but never
enqueued.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from typing import Any, Callable

from django.db import close_old_connections, connection
from django.utils import timezone

from reconcilers._authoring.reconciler import Reconciler
from reconcilers._base.conf import settings
from reconcilers._base.vocab import GVR, CacheScope, Index, split_object_path
from reconcilers._kube import cache, journal
from reconcilers._kube.fence import Term
from reconcilers._watch.enqueuer import Enqueuer
from reconcilers._watch.handlers import OWNED, PRIMARY, WATCHED, Handler, Router
from reconcilers._watch.reflector import Reflector
from reconcilers.models import WatchStream
from reconcilers._base.reconcile import Trigger

log = logging.getLogger(__name__)


class StreamStatus:
    """Counters and health of one stream, written to ``WatchStream`` rows (at most every 5 s
    unless something important happened, then at the next tick). Fed by the reflector's thread
    in memory only; the supervising thread (``run_streams``) writes them, so a stream never
    waits for PostgreSQL (a new connection of its own thread) before reading its first
    event."""

    def __init__(self, gvr: GVR, handlers: list[Handler], holder: str,
                 skipped: Callable[[str], int]):
        self.gvr, self.handlers, self.holder = gvr, handlers, holder
        self._skipped = skipped
        self.resource_version = ""
        self.events = self.relists = self.errors = 0
        self.connected = False
        self.last_error = ""
        self._listed = False
        self._due = False  # something important happened: write at the next save()
        self._last_write = 0.0
        self._lock = threading.Lock()

    def note(self, what: str, resource_version: str, error: str = "") -> None:
        self.resource_version = resource_version
        force = True
        if what == "event":
            self.events += 1
            force = False
        elif what == "relist":
            self.relists += 1
        elif what == "error":
            self.errors += 1
            self.connected = False
            self.last_error = error
        elif what == "connected":
            self.connected = True
        elif what == "listed":
            self._listed = True
        elif what == "stopped":
            self.connected = False
        if force:
            self._due = True

    def save(self, force: bool = False) -> None:
        now = time.monotonic()
        with self._lock:
            if not (force or self._due) and now - self._last_write < 5:
                return
            self._due = False
            self._last_write = now
            values = {"connected": self.connected, "holder": self.holder,
                      "resource_version": self.resource_version, "events": self.events,
                      "relists": self.relists,
                      "errors": self.errors}
            if self.events:
                values["last_event_at"] = timezone.now()
            if self._listed:
                values["last_list_at"] = timezone.now()
                self._listed = False
            if self.last_error:
                values["last_error"] = self.last_error[:2000]
                self.last_error = ""
            try:
                close_old_connections()
                for h in self.handlers:
                    name = h.reconciler.name()
                    WatchStream.record(name, self.gvr.id, **values, role=h.role,
                                       skipped=self._skipped(name))
            except Exception as exc:  # visibility must never stop the stream
                log.warning("could not record stream status: %s", exc)


class Stream:
    """One resource in one namespace (or all): reflector -> router -> enqueuer, with status."""

    def __init__(self, gvr: GVR, handlers: list[Handler], enqueuer: Enqueuer,
                 stop: threading.Event, namespace: str | None = None, holder: str = "",
                 indexes: dict[str, Index] | None = None, scope: CacheScope = CacheScope(),
                 term: Term | None = None):
        self.gvr, self.namespace = gvr, namespace
        self.router = Router(handlers, enqueuer.put, enqueuer.done)
        self.status = StreamStatus(gvr, handlers, holder, self.router.skipped_for)
        self.reflector = Reflector(gvr, namespace, self.router, stop, self.status,
                                   indexes=indexes, scope=scope, wants=self.router.wants,
                                   term=term)

    def run(self) -> None:
        try:
            self.reflector.run()
        finally:
            connection.close()  # one a Watches map function may have opened in this thread

    def abort(self) -> None:
        self.reflector.abort()

    @property
    def synced(self) -> bool:
        """Listed, and not waiting for a relist: its part of the cache is complete."""
        return bool(self.reflector.resource_version)


def build_streams(reconcilers: list[type[Reconciler]], enqueuer: Enqueuer,
                  stop: threading.Event, holder: str = "",
                  term: Term | None = None) -> list[Stream]:
    """One stream per watched resource and namespace, with every reconciler's handler on it
    and every index declared over that resource; ``term``: the leader's, carried by every
    cache write (``fence.FencedBatch``)."""
    by_gvr: dict[GVR, list[Handler]] = defaultdict(list)
    for cls in reconcilers:
        by_gvr[cls.primary()].append(Handler(cls, PRIMARY))
        for owned in cls.owns:
            by_gvr[owned.gvr()].append(Handler(cls, OWNED, owned))
        for related in cls.watches:
            by_gvr[related.gvr()].append(Handler(cls, WATCHED, related))
    indexes = stream_indexes(reconcilers, by_gvr)
    scopes = stream_scopes(reconcilers)
    namespaces: list[str | None] = list(settings().namespace_list) or [None]
    return [Stream(gvr, handlers, enqueuer, stop, namespace=ns, holder=holder,
                   indexes=indexes.get(gvr),
                   scope=scopes.get((gvr.api_version, gvr.kind), CacheScope()), term=term)
            for gvr, handlers in by_gvr.items()
            for ns in (namespaces if gvr.namespaced else [None])]


def stream_scopes(reconcilers: list[type[Reconciler]]) -> dict[tuple[str, str], CacheScope]:
    """What is cached of each resource. One cache per resource serves every reconciler, so
    they must agree (as controller-runtime's cache takes one selector per type); a primary
    resource is cached whole."""
    out: dict[tuple[str, str], CacheScope] = {}
    whose: dict[tuple[str, str], str] = {}
    for cls in reconcilers:
        for kind, scope in cls.cache_scopes().items():
            if kind in out and out[kind] != scope:
                raise ValueError(
                    f"{cls.__name__} and {whose[kind]} cache {kind[1]} differently "
                    f"({scope} vs {out[kind]}): one cache per resource serves both - "
                    f"declare the same selector and metadata_only on each")
            out[kind], whose[kind] = scope, cls.__name__
    return out


def stream_indexes(reconcilers: list[type[Reconciler]],
                   streams: dict[GVR, Any]) -> dict[GVR, dict[str, Index]]:
    """Every reconciler's ``Index`` declarations, by the stream that keeps them. An index over
    a resource nobody watches, or two different functions under one name, is a mistake that
    must stop the watcher at start, not surface as empty lists later."""
    by_kind = {(g.api_version, g.kind): g for g in streams}
    out: dict[GVR, dict[str, Index]] = defaultdict(dict)
    for cls in reconcilers:
        for index in cls.indexes:
            gvr = by_kind.get((index.api_version, index.kind))
            if gvr is None:
                raise ValueError(
                    f"{cls.__name__}: Index {index.name!r} is over {index.api_version} "
                    f"{index.kind}, which no reconciler watches (add it to owns or watches)")
            known = out[gvr].get(index.name)
            if known is not None and known.func is not index.func:
                raise ValueError(f"two different functions are declared as index "
                                 f"{index.name!r} of {index.kind}")
            out[gvr][index.name] = index
    return dict(out)


def replay_journal(streams: list[Stream]) -> int:
    """Route again every change a previous watcher journalled but did not get into the ledger
    (it died in between); returns how many. Run by a new leader before its streams start."""
    by_resource: dict[str, list[Stream]] = defaultdict(list)
    for s in streams:
        by_resource[s.gvr.id].append(s)
    replayed, unwatched = 0, []
    for change in journal.pending():
        namespace, _ = split_object_path(change.path)
        targets = [s for s in by_resource.get(change.resource, [])
                   if s.namespace in (None, namespace)]
        for s in targets:
            if change.deleted:
                s.router(Trigger.DELETED, change.obj, None, change)
                continue
            obj = cache.get(s.gvr, *_scope(change.path))
            if obj is None:  # deleted meanwhile: that deletion has its own entry
                unwatched.append(change)
            else:
                s.router(Trigger.RELIST, None, obj, change)
        replayed += bool(targets)
        if not targets:
            unwatched.append(change)  # nobody watches it any more: nothing to enqueue
    if unwatched:
        journal.clear(unwatched)
    return replayed


def _scope(path: str) -> tuple[str | None, str]:
    namespace, name = split_object_path(path)
    return namespace or None, name
