"""The reflector: list and watch one resource, keep the shared cache, report every change.

client-go's Reflector: a paginated LIST (``pager``), then a WATCH from the list's
resourceVersion with bookmarks and a server timeout; on ``410 Gone`` (as a watch event or as
the HTTP answer) a relist that reports what changed or vanished meanwhile; on any other error
a reconnect with capped exponential backoff (0.1 s -> 30 s, jittered). It never exits on a
transient error.

Unlike client-go's in-memory store, the cache outlives the process: a watcher restarted while
its predecessor's synced marker lives (``cache.SYNCED_TTL``), with the same cache scope,
resumes the watch from the resourceVersion the cache is at (written with every change, in the
same transaction) instead of listing everything again. If that version is too old, the
api-server answers 410 and it relists after all.

Each change goes to the shared cache *before* it is reported (``deliver(trigger, old, new,
change)``), so whoever runs the key reads this version or a newer one; in the same Redis
transaction it is journalled (``journal.record``), so a watcher that dies before the keys reach
the ledger loses nothing: the next leader replays the journal. What to do with a change is the
handlers' business (``handlers.py``), not the reflector's.

Index sets (``Index`` declarations of the reconcilers on this stream) are kept in the same
transaction as the objects they file (``indexer``). What the stream last saw of each object is
``known`` (a ``Known``, ``known.py``). Only the reflector's own thread changes ``known`` and
``resource_version``; other threads ask for a relist through ``request_relist`` (after Redis
lost the cache; after it went back in time, diffing against what the cache holds).

Every cache write carries the leader's term (``term``, a ``fence.Term``): Redis refuses the
writes of a term older than the newest leader's (``fence.StaleTerm``), so a paused ex-leader's
stream never writes an old object over its successor's. A refused stream stops, with every
stream of its term (they share ``stop``): its leader has been replaced.
"""

from __future__ import annotations

import hashlib
import logging
import random
import threading
import uuid
from typing import Callable, Mapping

from reconcilers._kube import cache, fence, journal, kube
from reconcilers._base import metrics
from reconcilers._base.conf import settings
from reconcilers._base.reconcile import Trigger
from reconcilers._base.vocab import GVR, CacheScope, Index, object_path, split_object_path
from reconcilers._watch import pager
from reconcilers._watch.indexer import Indexer
from reconcilers._watch.known import Known

log = logging.getLogger(__name__)

# wants(old, new): whether a watch event's change may concern any reconciler (its predicates
# pass); one that cannot is cached but not journalled, and delivered with ``change=None``.
Wants = Callable[["dict | None", "dict | None"], bool]

# deliver(trigger, old, new, change): ``change`` is the journal entry to clear once the
# change's keys are in the ledger.
Deliver = Callable[[str, "dict | None", "dict | None", "journal.Change"], None]


# Seconds before the first reconnect after a watch or list error.
FIRST_RETRY = 0.1


class Gone(Exception):
    """The resourceVersion is too old (410): relist."""


class Reflector:
    """List + watch of one resource, in one namespace or in all (``namespace=None``)."""

    def __init__(self, gvr: GVR, namespace: str | None, deliver: Deliver,
                 stop: threading.Event, status=None, indexes: Mapping[str, Index] | None = None,
                 scope: CacheScope = CacheScope(), wants: Wants | None = None,
                 term: fence.Term | None = None):
        self.gvr, self.namespace = gvr, namespace
        self.term = term  # the leader's term every cache write carries (None: unfenced)
        self.indexes = dict(indexes or {})
        self._indexer = Indexer(gvr, namespace, self.indexes)
        self.scope = scope
        self.deliver = deliver
        self.wants = wants
        self.stop_event = stop
        self.status = status  # a watch.StreamStatus, or None
        self.relist_requested = threading.Event()
        # Requests to diff the next relist against the shared cache, not ``known``: counted
        # with the request, under one lock, and forgotten only once a list has done so (a
        # failed list, or a request made while one is read, leaves them for the next).
        self._against_cache = 0
        self._asked = threading.Lock()
        # Owned by this reflector's thread: the last state seen of each object and the
        # resourceVersion to resume the watch from.
        self.known = Known(gvr, namespace, {})
        self.resource_version = ""
        self._resp = None
        self._run_id = uuid.uuid4().hex[:12]  # makes each journal token unique
        # What this stream caches: a successor resumes only a cache of the same scope.
        self._stream = hashlib.sha256(repr((gvr.id, self.scope.selector, self.scope.fields,
                                            self.scope.metadata_only)).encode()).hexdigest()[:16]
        self._changes = 0
        scope = (gvr.id, namespace or "")
        self._events = {t: metrics.watch_events_total.labels(*scope, t)
                        for t in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK")}
        self._relists = {r: metrics.relists_total.labels(*scope, r)
                         for r in ("initial", "expired", "requested")}
        self._errors = metrics.watch_errors_total.labels(*scope)

    def abort(self) -> None:
        """Stop now: set the stop flag and close the open watch connection."""
        self.stop_event.set()
        self._close_watch()

    def request_relist(self, against_cache: bool = False) -> None:
        """From any thread: relist now (the open watch is closed so the request is not left
        waiting for the next event of a quiet stream). ``against_cache``: report what differs
        from the shared cache rather than from this stream's memory - after Redis went back
        in time, runs may have read the older cache, and what it lacks must run again."""
        with self._asked:
            self._against_cache += against_cache
            self.relist_requested.set()
        self._close_watch()

    def _close_watch(self) -> None:
        resp = self._resp
        if resp is not None:
            try:
                resp.shutdown()
            except Exception:  # already closed
                pass

    # --- the loop --------------------------------------------------------------------------

    def run(self) -> None:
        api = kube.new_api_client()
        # A dropped connection is retried almost at once (kopf waits 0.1 s), then ever more
        # slowly while the api-server keeps refusing (doubling, jittered, up to 30 s).
        delay = FIRST_RETRY
        first = True
        while not self.stop_event.is_set():
            try:
                if first and self.resume():
                    first = False
                if first or not self.resource_version or self.relist_requested.is_set():
                    self._relists["initial" if first else "requested"
                                  if self.relist_requested.is_set() else "expired"].inc()
                    # Cleared before the list, not after: a request made while it is read
                    # (the cache lost mid-list) may postdate what it read, and lists again.
                    with self._asked:
                        self.relist_requested.clear()
                        against_cache = self._against_cache
                    self.list(api, initial=first or against_cache > 0)
                    with self._asked:
                        self._against_cache -= against_cache
                    first = False
                    if self.relist_requested.is_set():
                        continue  # asked for again while listing: list again, not watch

                self.watch(api)
                delay = FIRST_RETRY
            except fence.StaleTerm as exc:
                # A newer leader writes the cache: this process's leadership is over, whatever
                # its elector has not noticed yet. Every stream of the term stops.
                log.warning("%s: %s; stopping the streams of this term", self.gvr.id, exc)
                self._note("error", str(exc))
                self.stop_event.set()
                break
            except Gone:
                self._note("relist")
                self.resource_version = ""
                log.info("%s: resourceVersion expired, relisting", self.gvr.id)
            except Exception as exc:
                if self.stop_event.is_set():
                    break  # aborted: we closed the watch ourselves
                if self.relist_requested.is_set():
                    continue  # we closed the watch ourselves, to relist
                self._note("error", f"{type(exc).__name__}: {exc}")
                self._errors.inc()
                log.warning("%s: %s; reconnecting in %.1fs", self.gvr.id, exc, delay)
                self.stop_event.wait(delay * random.uniform(0.8, 1.2))
                delay = min(delay * 2, 30.0)
        self._note("stopped")
        api.close()

    def resume(self) -> bool:
        """Take over the cache where the previous watcher of this scope left it, if its marker
        still lives: what it knew is what the cache holds, and the watch goes on from its last
        change. False: list."""
        resource_version = cache.resume_point(self.gvr, self.namespace, self._stream)
        if not resource_version:
            return False
        if self.indexes:  # this watcher's index functions may differ from its predecessor's
            self.known = Known(self.gvr, self.namespace,
                               cache.objects(self.gvr, self.namespace))
            pipe = fence.Writes(self.term)
            self._indexer.rebuild(self.known.all(), pipe)
            pipe.execute()
        else:
            self.known = Known.reading_through(self.gvr, self.namespace)
        self.resource_version = resource_version
        log.info("%s: resuming the watch at resourceVersion %s (%d cached objects)",
                 self.gvr.id, resource_version, len(self.known))
        self._note("resumed")
        return True

    def list(self, api, initial: bool = False) -> None:
        """Paginated LIST; replace this scope of the cache and report every difference - from
        what the shared cache holds when ``initial`` (a first list, or Redis went back in
        time), else from ``known``."""
        seen, rv = pager.list_pages(
            api, self.gvr.path(self.namespace), self._selectors(),
            kube.METADATA_LIST if self.scope.metadata_only else kube.JSON,
            settings().list_page_size, self._kept)
        if initial:
            # After a restart nothing is in memory: the shared cache tells what existed - in
            # this stream's namespace only, and whole, so a child deleted while no watcher ran
            # still names its owner. After Redis went back in time, it is what runs read.
            previous = cache.objects(self.gvr, self.namespace)
        else:
            previous = self.known.all()
        vanished = set(previous) - set(seen)
        changes = [(Trigger.ADDED if previous.get(path) is None else Trigger.RELIST,
                    previous.get(path), obj, self._change(path, obj, False))
                   for path, obj in seen.items() if _rv(previous.get(path)) != _rv(obj)]
        changes += [(Trigger.DELETED, previous[path], None,
                     self._change(path, previous[path], True)) for path in vanished]
        pipe = fence.Writes(self.term)
        cache.put_many(self.gvr, seen.values(), pipe)
        for path in vanished:
            ns, name = split_object_path(path)
            cache.delete(self.gvr, ns or None, name, pipe)
        self._indexer.rebuild(seen, pipe)
        for *_, change in changes:
            journal.record(change, pipe)
        # The position in the same transaction as the objects: a watcher dying in between
        # would leave newer objects under an older position, for a successor to resume from
        # and replay older events over.
        cache.mark_synced(self.gvr, self.namespace, rv, self._stream, pipe)
        pipe.execute()
        self.known = Known(self.gvr, self.namespace, seen)
        # Synced (a resourceVersion) only once every change is reported: whoever reads this
        # scope as synced may take its keys as handed over (the start pass does).
        for trigger, old, new, change in changes:
            self.deliver(trigger, old, new, change)
        self.resource_version = rv
        self._note("listed")

    def watch(self, api) -> None:
        conf = settings()
        timeout = random.randint(conf.watch_timeout_min, conf.watch_timeout_max)
        query = {"watch": "true", "resourceVersion": self.resource_version,
                 "allowWatchBookmarks": "true", "timeoutSeconds": timeout, **self._selectors()}
        try:
            resp = kube.request(api, "GET", self.gvr.path(self.namespace), query=query,
                                timeout=(10, conf.watch_inactivity), stream=True,
                                accept=kube.METADATA if self.scope.metadata_only else kube.JSON)
        except kube.ApiError as exc:
            if exc.status == 410:
                raise Gone(exc.message) from None
            raise
        self._resp = resp
        # A relist or a stop asked for before there was a watch to close: the asker found
        # no ``_resp``, so this thread looks now (else a quiet watch would hold it).
        if self.relist_requested.is_set() or self.stop_event.is_set():
            self._resp = None
            resp.release_conn()
            resp.close()
            return
        self._note("connected")
        try:
            for event in kube.watch_events(resp, self.stop_event, self.relist_requested):
                self.handle(event)
        finally:
            self._resp = None
            resp.release_conn()
            resp.close()

    # --- events ----------------------------------------------------------------------------

    def handle(self, event: dict) -> None:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Gone(obj.get("message", ""))
            raise kube.ApiError.from_watch_error(obj)
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        counter = self._events.get(kind)
        if counter is not None:
            counter.inc()
        if kind == "BOOKMARK":
            self.resource_version = rv or self.resource_version
            pipe = fence.Writes(self.term)
            cache.advance(self.gvr, self.namespace, self.resource_version, self._stream, pipe)
            pipe.execute()
            self.known.complete_if_due()
            return
        self._typed(obj)
        meta = obj["metadata"]
        path = object_path(meta.get("namespace"), meta["name"])
        old = self.known.get(path)
        existed = old is not None
        # One transaction per event: the object (or its removal), its index entries, the
        # journalled change and the stream's position land together or not at all.
        pipe = fence.Writes(self.term)
        if kind == "DELETED":
            trigger, old, new = Trigger.DELETED, old or cache.sanitize(obj), None
            change = self._change(path, old, True) if self._wanted(old, None) else None
            cache.delete(self.gvr, meta.get("namespace"), meta["name"], pipe)
        else:
            trigger = Trigger.ADDED if kind == "ADDED" else Trigger.MODIFIED
            new = cache.sanitize(obj)
            change = self._change(path, new, False) if self._wanted(old, new) else None
            cache.put_many(self.gvr, [new], pipe)
        self._indexer.refile(path, old, new, pipe)
        if change is not None:
            journal.record(change, pipe)
        cache.advance(self.gvr, self.namespace, rv or self.resource_version, self._stream, pipe)
        pipe.execute()
        if new is None:
            self.known.remove(path, existed)
        else:
            self.known.put(path, new, existed)
        self.deliver(trigger, old, new, change)
        self.resource_version = rv or self.resource_version
        self._note("event")
        self.known.complete_if_due()

    def _wanted(self, old: dict | None, new: dict | None) -> bool:
        """Whether to journal this change: a change no reconciler's predicates let through
        (say, a status write when only generations count) has no keys to lose."""
        return self.wants is None or self.wants(old, new)

    def _selectors(self) -> dict:
        out = {}
        if self.scope.selector:
            out["labelSelector"] = self.scope.selector
        if self.scope.fields:
            out["fieldSelector"] = self.scope.fields
        return out

    def _kept(self, obj: dict) -> tuple[str, dict]:
        """A listed object as the cache and ``known`` hold it, and its path."""
        self._typed(obj)
        meta = obj["metadata"]
        return object_path(meta.get("namespace"), meta["name"]), cache.sanitize(obj)

    def _typed(self, obj: dict) -> None:
        """List items carry no apiVersion/kind, metadata-only ones say PartialObjectMetadata:
        the cache holds each as what it is."""
        if self.scope.metadata_only or "kind" not in obj:
            obj["apiVersion"], obj["kind"] = self.gvr.api_version, self.gvr.kind

    def _change(self, path: str, obj: dict, deleted: bool) -> journal.Change:
        self._changes += 1
        return journal.Change(self.gvr.id, path, obj, deleted, f"{self._run_id}:{self._changes}")

    def _note(self, what: str, error: str = "") -> None:
        if self.status is not None:
            self.status.note(what, self.resource_version, error)


def _rv(obj: dict | None) -> str | None:
    return ((obj or {}).get("metadata") or {}).get("resourceVersion")

