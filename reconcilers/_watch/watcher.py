"""The watch workers: shared informers feeding the work queue.

One ``Stream`` per watched resource and namespace, shared by every reconciler that watches it,
is three parts with one job each:

- a ``Reflector`` (``reflector.py``) lists and watches, keeps the shared cache, reports changes;
- a ``Router`` (``handlers.py``) maps each change to the keys it concerns;
- a ``StreamStatus`` records what the admin's "watch streams" page shows.

Keys go through one ``Enqueuer`` thread that drains everything waiting into a few batched
statements: a relist of 10,000 objects costs a handful of round trips, not 10,000. When keys
arrive faster than it enqueues them (some came in while the last batch was being written), it
gathers for ``RECONCILERS_ENQUEUE_WINDOW`` first, so a stream batches too; a key that finds the
enqueuer idle goes at once, so a steady trickle pays no window.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import defaultdict
from typing import Any, Callable

from django.conf import settings as django_settings
from django.db import close_old_connections, connection
from django.utils import timezone

from reconcilers._kube import cache
from reconcilers._base import metrics
from reconcilers._queue import workqueue
from reconcilers._base.conf import settings
from reconcilers._watch.handlers import OWNED, PRIMARY, WATCHED, Handler, Router
from reconcilers.models import Trigger, WatchStream
from reconcilers._base.probes import Endpoint, answers, check_database, check_redis
from reconcilers._watch.reflector import Reflector
from reconcilers._authoring.reconciler import Reconciler
from reconcilers._base.vocab import GVR, CacheScope, Index, Key, split_object_path

log = logging.getLogger(__name__)

HEARTBEAT_KEY = "operator:heartbeat:watcher"

_WAKE = object()  # put on the enqueuer's queue to make it look at its stop flag


class Enqueuer(threading.Thread):
    """Drains keys into batched work-queue adds (one per trigger), then clears the journal
    entries of the changes those keys came from (``cache.journal``).

    Its line is bounded (``BACKLOG``): while PostgreSQL is down the streams wait at ``put``
    rather than pile up changes without end - the api-server keeps the events meanwhile (or
    a relist finds them). Stopping drops what still waits: the journal holds those changes
    for the next leader."""

    BACKLOG = 20_000

    def __init__(self, stop: threading.Event, backlog: int = BACKLOG):
        super().__init__(daemon=True, name="enqueuer")
        # (key, trigger), (None, change): a change all of whose keys were put before it, or
        # _WAKE.
        self.queue: queue.Queue = queue.Queue(maxsize=backlog)
        self.stop_event = stop
        self.batches = 0
        self.puts = 0  # keys put so far: tells whether more came in while a batch was written

    def put(self, key: Key, trigger: str) -> None:
        self.puts += 1
        self._put((key, trigger))

    def stop(self) -> None:
        """Finish what is queued, then end (now, not at the next poll)."""
        self.stop_event.set()
        try:
            self.queue.put_nowait(_WAKE)
        except queue.Full:  # it is busy, and will look at its stop flag
            pass

    def done(self, change: cache.Change) -> None:
        self._put((None, change))

    def _put(self, item: tuple) -> None:
        """Wait for room while the line is full, until stopped."""
        while True:
            try:
                self.queue.put(item, timeout=0.5)
                return
            except queue.Full:
                if self.stop_event.is_set():
                    return  # the journal keeps the change for the next leader

    def run(self) -> None:
        try:
            try:
                workqueue.connect()
            except Exception as exc:  # the first add retries until they answer
                log.warning("could not connect ahead of the first keys: %s", exc)
            self._drain_until_stopped()
        finally:
            connection.close()  # this thread's own database connection

    def _drain_until_stopped(self) -> None:
        window, outrun = settings().enqueue_window, False
        while not self.stop_event.is_set() or not self.queue.empty():
            try:
                first = self.queue.get(timeout=0.05)
            except queue.Empty:
                continue
            if first is _WAKE:
                continue
            # Keys came in while the last batch was written: they arrive faster than one
            # statement per batch keeps up with, so gather a moment and let them share
            # statements and messages. Otherwise the enqueuer was idle: go at once.
            if outrun:
                self.stop_event.wait(window)
            pending: dict[str, list[Key]] = defaultdict(list)
            changes: list[cache.Change] = []
            item = first
            for _ in range(10_000):
                if item is not _WAKE:
                    key, value = item
                    if key is None:
                        changes.append(value)
                    else:
                        pending[value].append(key)
                try:
                    item = self.queue.get_nowait()
                except queue.Empty:
                    break
            before = self.puts
            if self._flush(pending) and changes:
                self._clear(changes)
            outrun = window > 0 and self.puts > before

    def _flush(self, pending: dict[str, list[Key]]) -> bool:
        """Enqueue, retrying while the database is down: the keys are already in the cache,
        so a relist would not find them changed. Gives up only when stopping (the journal
        still holds the changes, for the next leader)."""
        for trigger, keys in pending.items():
            attempt = 0
            while True:
                try:
                    close_old_connections()
                    workqueue.add(keys, trigger)
                    self.batches += 1
                    break
                except Exception as exc:
                    attempt += 1
                    log.error("enqueue of %d keys failed (%s); retry %d", len(keys), exc, attempt)
                    if self.stop_event.wait(min(0.5 * 2 ** attempt, 10)) and attempt > 3:
                        log.error("stopping with %d keys not enqueued; the journal keeps their "
                                  "changes for the next leader", len(keys))
                        return False
        return True

    def _clear(self, changes: list[cache.Change]) -> None:
        try:
            cache.clear_journal(changes)
        except Exception as exc:  # kept entries are replayed later: a duplicate, not a loss
            log.warning("could not clear %d journal entries: %s", len(changes), exc)

    def drain(self, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while not self.queue.empty() and time.monotonic() < deadline:
            time.sleep(0.01)


class StreamStatus:
    """Counters and health of one stream, written to ``WatchStream`` rows (at most every 5 s
    unless something important happened, then at the next tick). Fed by the reflector's thread
    in memory only; the supervising thread (``run_streams``) writes them, so a stream never
    waits for PostgreSQL (a new connection of its own thread) before reading its first
    event."""

    def __init__(self, gvr: GVR, handlers: list[Handler], holder: str,
                 skipped: Callable[[], int]):
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
                      "skipped": self._skipped(), "relists": self.relists,
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
                    WatchStream.record(h.reconciler.name(), self.gvr.id, **values,
                                       role=h.role)
            except Exception as exc:  # visibility must never stop the stream
                log.warning("could not record stream status: %s", exc)


class Stream:
    """One resource in one namespace (or all): reflector -> router -> enqueuer, with status."""

    def __init__(self, gvr: GVR, handlers: list[Handler], enqueuer: Enqueuer,
                 stop: threading.Event, namespace: str | None = None, holder: str = "",
                 indexes: dict[str, Index] | None = None, scope: CacheScope = CacheScope(),
                 term: cache.Term | None = None):
        self.gvr, self.namespace = gvr, namespace
        self.router = Router(handlers, enqueuer.put, enqueuer.done)
        self.status = StreamStatus(gvr, handlers, holder, lambda: self.router.skipped)
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


class Health:
    """What a watcher's probes and scrape-time metrics read: when its loop last turned, its
    leadership, its streams. Written by the watcher's main thread, read by the probe server."""

    LOOP_MAX_AGE = 60.0

    def __init__(self, elector=None) -> None:
        self.elector = elector
        self.streams: list[Stream] = []
        self._tick = time.monotonic()

    def tick(self) -> None:
        self._tick = time.monotonic()

    @property
    def leading(self) -> bool:
        return self.elector is None or self.elector.is_leader.is_set()

    def live(self) -> dict[str, bool]:
        return {"loop": time.monotonic() - self._tick < self.LOOP_MAX_AGE}

    def ready(self) -> dict[str, bool]:
        """Leading with every stream's cache synced, or a standby the api-server answers;
        either way with PostgreSQL (the ledger) and Redis (the cache) answering."""
        checks = {"database": answers(check_database),
                  "redis": answers(lambda t: check_redis(django_settings.REDIS_URL, t))}
        if not self.leading:
            return {**checks, "standby": self.elector.campaigning()}
        streams = list(self.streams)
        return {**checks, "leading": True,
                "caches synced": bool(streams) and all(s.synced for s in streams)}

    def gauges(self) -> list[tuple[str, str, list[str], list]]:
        streams = list(self.streams) if self.leading else []
        families = [
            ("operator_leader", "1 while this watcher leads (runs the streams)", [],
             [((), 1.0 if self.leading else 0.0)]),
            ("operator_cache_objects", "Objects this watcher's streams hold in the cache",
             ["resource", "namespace"],
             [((s.gvr.id, s.namespace or ""), len(s.reflector.known)) for s in streams]),
            ("operator_stream_synced", "1 when the stream's part of the cache is complete",
             ["resource", "namespace"],
             [((s.gvr.id, s.namespace or ""), float(s.synced)) for s in streams]),
        ]
        if self.leading:  # one source for the ledger's figures: the leader
            try:
                families += workqueue.gauges()
            finally:
                connection.close()  # each scrape has its own thread, and so its own connection
        return families

    def endpoint(self) -> Endpoint:
        return Endpoint("watcher", self.live, self.ready, [metrics.Computed(self.gauges)])


def build_streams(reconcilers: list[type[Reconciler]], enqueuer: Enqueuer,
                  stop: threading.Event, holder: str = "",
                  term: cache.Term | None = None) -> list[Stream]:
    """One stream per watched resource and namespace, with every reconciler's handler on it
    and every index declared over that resource; ``term``: the leader's, carried by every
    cache write (``cache.FencedBatch``)."""
    by_gvr: dict[GVR, list[Handler]] = defaultdict(list)
    for cls in reconcilers:
        by_gvr[cls.primary()].append(Handler(cls, PRIMARY))
        for owned in cls.owns:
            by_gvr[owned.gvr()].append(Handler(cls, OWNED))
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
    for change in cache.journalled():
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
        cache.clear_journal(unwatched)
    return replayed


def _scope(path: str) -> tuple[str | None, str]:
    namespace, name = split_object_path(path)
    return namespace or None, name


HEARTBEAT_KEPT = 600.0  # seconds a departed watcher's field stays in the heartbeat hash
_beats = 0


def heartbeat(identity: str) -> None:
    """Write this watcher's beat; every minute or so, drop the fields of watchers gone for
    ``HEARTBEAT_KEPT`` (each start adds a field: the hash would grow with every restart)."""
    global _beats
    try:
        r = cache.get_redis()
        now = time.time()
        r.hset(HEARTBEAT_KEY, identity, now)
        _beats += 1
        if _beats % 60 == 1:
            stale = [f for f, beat in r.hgetall(HEARTBEAT_KEY).items()
                     if now - float(beat) > HEARTBEAT_KEPT]
            if stale:
                r.hdel(HEARTBEAT_KEY, *stale)
    except Exception as exc:
        log.warning("heartbeat failed: %s", exc)


def run_streams(streams: list[Stream], until: Callable[[], bool], identity: str,
                health: Health | None = None, wake: threading.Event | None = None,
                tick: Callable[[list[Stream]], None] | None = None) -> None:
    """Run streams in threads until ``until()`` is true; heartbeat meanwhile, and call
    ``tick(streams)`` (the start pass) each second. Setting ``wake`` (the process's stop event)
    makes it look at once rather than at its next tick."""
    health = health or Health()
    health.streams = streams
    threads = [threading.Thread(target=s.run, daemon=True, name=f"stream:{s.gvr.id}")
               for s in streams]
    for t in threads:
        t.start()
    while not until():
        heartbeat(identity)
        health.tick()
        for s in streams:
            # Keep the synced marker alive; if Redis restarted empty it is gone: relist.
            if (s.status.resource_version and not s.reflector.relist_requested.is_set()
                    and not _keep_synced(s.gvr, s.namespace)):
                s.reflector.request_relist()
            s.status.save()  # flushes counters of a quiet stream (throttled to every 5 s)
        if tick is not None:
            tick(streams)
        # Heartbeat each second, but notice a stop at once: a restarted watcher's successor
        # waits for this one to let go.
        for _ in range(20):
            if until():
                break
            if wake is not None:
                wake.wait(0.05)
            else:
                time.sleep(0.05)
    for s in streams:
        s.abort()
    for t in threads:
        t.join(15)
    for s in streams:
        s.status.save()  # how each stream ended
    health.streams = []
    connection.close()


def _keep_synced(gvr: GVR, namespace: str | None) -> bool:
    try:
        return cache.keep_synced(gvr, namespace)
    except Exception:  # Redis unreachable: nothing to refill yet
        return True
