"""The watch workers: client-go's Reflector + shared informer, feeding the work ledger.

One ``Stream`` per watched resource (shared by every reconciler that watches it): a paginated
LIST, then a WATCH from the list's resourceVersion with bookmarks and a server timeout; on
``410 Gone`` a relist that also emits what changed or vanished meanwhile; on any other error a
reconnect with capped exponential backoff (0.8 s -> 30 s, jittered). It never exits on a
transient error. Each event line is parsed once; the object is written to the shared cache
*before* its key is enqueued, so the worker that runs it reads this version or a newer one.

Keys go through one ``Enqueuer`` thread that drains everything waiting into a few batched
statements: a relist of 10,000 objects costs a handful of round trips, not 10,000.
"""

from __future__ import annotations

import json
import logging
import queue
import random
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Iterator

from django.db import close_old_connections
from django.utils import timezone
from kubernetes.client.exceptions import ApiException

from . import cache, conf, dispatch, kube
from .cache import get_redis
from .ledger import Key
from .models import Trigger, WatchStream
from .spec import GVR, Reconciler

log = logging.getLogger(__name__)

HEARTBEAT_KEY = "operator:heartbeat:watcher"


class Gone(Exception):
    """The resourceVersion is too old (410): relist."""


@dataclass(frozen=True)
class Handler:
    reconciler: type[Reconciler]
    role: str  # primary | owned

    def keys_for(self, old: dict | None, new: dict | None) -> list[Key]:
        name = self.reconciler.name()
        if self.role == "primary":
            meta = (new or old or {})["metadata"]
            return [Key(name, meta.get("namespace") or "", meta["name"])]
        primary = self.reconciler.primary()
        out = []
        for obj in (old, new):
            for ref in ((obj or {}).get("metadata") or {}).get("ownerReferences") or []:
                if (ref.get("controller") and ref.get("kind") == primary.kind
                        and ref.get("apiVersion", "").rpartition("/")[0] == primary.group):
                    ns = (obj["metadata"].get("namespace") or "") if primary.namespaced else ""
                    key = Key(name, ns, ref["name"])
                    if key not in out:
                        out.append(key)
        return out

    def passes(self, old: dict | None, new: dict | None) -> bool:
        if self.role != "primary":
            return True
        return all(p(old, new) for p in self.reconciler.predicates)


class Enqueuer(threading.Thread):
    """Drains (key, trigger) pairs into batched ledger statements, one per trigger."""

    def __init__(self, stop: threading.Event):
        super().__init__(daemon=True, name="enqueuer")
        self.queue: queue.Queue[tuple[Key, str]] = queue.Queue()
        self.stop_event = stop
        self.batches = 0

    def put(self, key: Key, trigger: str) -> None:
        self.queue.put((key, trigger))

    def run(self) -> None:
        while not self.stop_event.is_set() or not self.queue.empty():
            try:
                first = self.queue.get(timeout=0.2)
            except queue.Empty:
                continue
            pending: dict[str, list[Key]] = defaultdict(list)
            pending[first[1]].append(first[0])
            for _ in range(10_000):
                try:
                    key, trigger = self.queue.get_nowait()
                except queue.Empty:
                    break
                pending[trigger].append(key)
            self._flush(pending)

    def _flush(self, pending: dict[str, list[Key]]) -> None:
        """Enqueue, retrying while the database is down: the keys are already in the cache,
        so a relist would not find them changed - dropping them would lose work."""
        for trigger, keys in pending.items():
            attempt = 0
            while True:
                try:
                    close_old_connections()
                    dispatch.enqueue(keys, trigger)
                    self.batches += 1
                    break
                except Exception as exc:
                    attempt += 1
                    log.error("enqueue of %d keys failed (%s); retry %d", len(keys), exc, attempt)
                    if self.stop_event.wait(min(0.5 * 2 ** attempt, 10)) and attempt > 3:
                        log.error("stopping with %d keys not enqueued; the periodic resync "
                                  "will pick them up", len(keys))
                        return

    def drain(self, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while not self.queue.empty() and time.monotonic() < deadline:
            time.sleep(0.01)


@dataclass
class Stream:
    """List + watch of one resource (in one namespace, or all)."""

    gvr: GVR
    handlers: list[Handler]
    enqueuer: Enqueuer
    stop_event: threading.Event
    namespace: str | None = None
    holder: str = ""
    known: dict[str, dict] = field(default_factory=dict)
    resource_version: str = ""
    relists: int = 0
    events: int = 0
    skipped: int = 0
    errors: int = 0
    connected: bool = False
    _last_status_write: float = 0.0
    _resp: object = None

    def abort(self) -> None:
        """Stop now: set the stop flag and close the open watch connection."""
        self.stop_event.set()
        resp = self._resp
        if resp is not None:
            try:
                resp.shutdown()
            except Exception:
                pass

    # --- the loop --------------------------------------------------------------------------

    def run(self) -> None:
        api = kube.new_api_client()
        delay = 0.8
        first = True
        while not self.stop_event.is_set():
            try:
                if first or not self.resource_version:
                    self.list(api, initial=first)
                    first = False
                self.watch(api)
                delay = 0.8
            except Gone:
                self.relists += 1
                self.resource_version = ""
                log.info("%s: resourceVersion expired, relisting", self.gvr.id)
            except Exception as exc:
                self.errors += 1
                self.connected = False
                self._save_status(error=f"{type(exc).__name__}: {exc}", force=True)
                log.warning("%s: %s; reconnecting in %.1fs", self.gvr.id, exc, delay)
                self.stop_event.wait(delay * random.uniform(0.8, 1.2))
                delay = min(delay * 2, 30.0)
        self.connected = False
        self._save_status(force=True)
        api.close()

    def list(self, api, initial: bool = False) -> None:
        """Paginated LIST; replace the cache and enqueue every difference from what we knew."""
        seen: dict[str, dict] = {}
        token = ""
        page = int(conf.get("RECONCILERS_LIST_PAGE_SIZE"))
        while True:
            query = {"limit": page}
            if token:
                query["continue"] = token
            body = kube.request(api, "GET", self.gvr.path(self.namespace), query=query,
                                timeout=(10, 120))
            items = body.get("items") or []
            for obj in items:
                obj.setdefault("apiVersion", self.gvr.api_version)
                obj.setdefault("kind", self.gvr.kind)
                seen[cache.field(obj["metadata"].get("namespace"), obj["metadata"]["name"])] = obj
            token = (body.get("metadata") or {}).get("continue") or ""
            if not token:
                rv = body["metadata"]["resourceVersion"]
                break
        if initial:
            # After a restart we know nothing in memory: the shared cache tells what existed,
            # so objects deleted while no watcher ran still get their "deleted" reconcile.
            previous = {f: {"metadata": {"resourceVersion": v}}
                        for f, v in cache.versions(self.gvr).items()}
        else:
            previous = self.known
        pipe = get_redis().pipeline(transaction=False)
        cache.put_many(self.gvr, seen.values(), pipe)
        for f in set(previous) - set(seen):
            ns, _, name = f.partition("/")
            cache.delete(self.gvr, ns or None, name, pipe)
        pipe.execute()
        for f, obj in seen.items():
            old = previous.get(f)
            old_rv = (old or {}).get("metadata", {}).get("resourceVersion")
            if old_rv != obj["metadata"].get("resourceVersion"):
                old_full = self.known.get(f)
                self._enqueue(old_full, obj, Trigger.ADDED if old is None else Trigger.RELIST)
        for f in set(previous) - set(seen):
            gone = self.known.get(f) or _stub(f, self.gvr)
            self._enqueue(gone, None, Trigger.DELETED)
        self.known = seen
        self.resource_version = rv
        cache.mark_synced(self.gvr, rv)
        self._save_status(listed=True, force=True)

    def watch(self, api) -> None:
        timeout = random.randint(int(conf.get("RECONCILERS_WATCH_TIMEOUT_MIN")),
                                 int(conf.get("RECONCILERS_WATCH_TIMEOUT_MAX")))
        query = {"watch": "true", "resourceVersion": self.resource_version,
                 "allowWatchBookmarks": "true", "timeoutSeconds": timeout}
        inactivity = float(conf.get("RECONCILERS_WATCH_INACTIVITY"))
        resp = kube.request(api, "GET", self.gvr.path(self.namespace), query=query,
                            timeout=(10, inactivity), stream=True)
        self._resp = resp
        self.connected = True
        self._save_status(force=True)
        try:
            for line in _lines(resp, self.stop_event):
                self.handle(json.loads(line))
                self._save_status()
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
            raise ApiException(status=obj.get("code") or 500, reason=obj.get("message"))
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if kind == "BOOKMARK":
            self.resource_version = rv or self.resource_version
            return
        meta = obj["metadata"]
        f = cache.field(meta.get("namespace"), meta["name"])
        old = self.known.get(f)
        if kind == "DELETED":
            cache.delete(self.gvr, meta.get("namespace"), meta["name"])
            self.known.pop(f, None)
            self._enqueue(old or obj, None, Trigger.DELETED)
        else:
            cache.put_many(self.gvr, [obj])
            self.known[f] = obj
            self._enqueue(old, obj, Trigger.ADDED if kind == "ADDED" else Trigger.MODIFIED)
        self.resource_version = rv or self.resource_version
        self.events += 1

    def _enqueue(self, old: dict | None, new: dict | None, trigger: str) -> None:
        for handler in self.handlers:
            if handler.role == "owned":
                trig = Trigger.OWNED
            elif not handler.passes(old, new):
                self.skipped += 1
                continue
            else:
                trig = trigger
            for key in handler.keys_for(old, new):
                self.enqueuer.put(key, trig)

    # --- visibility --------------------------------------------------------------------------

    def _save_status(self, error: str = "", listed: bool = False, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_status_write < 5:
            return
        self._last_status_write = now
        values = {"connected": self.connected, "holder": self.holder,
                  "resource_version": self.resource_version, "events": self.events,
                  "skipped": self.skipped,
                  "relists": self.relists, "errors": self.errors}
        if self.events:
            values["last_event_at"] = timezone.now()
        if listed:
            values["last_list_at"] = timezone.now()
        if error:
            values["last_error"] = error[:2000]
        try:
            close_old_connections()
            for h in self.handlers:
                WatchStream.objects.update_or_create(
                    reconciler=h.reconciler.name(), resource=self.gvr.id,
                    defaults={**values, "role": h.role})
        except Exception as exc:  # visibility must never stop the stream
            log.warning("could not record stream status: %s", exc)


def _stub(f: str, gvr: GVR) -> dict:
    ns, _, name = f.partition("/")
    return {"apiVersion": gvr.api_version, "kind": gvr.kind,
            "metadata": {"namespace": ns or None, "name": name}}


def _lines(resp, stop: threading.Event) -> Iterator[bytes]:
    buf = b""
    for chunk in resp.stream(amt=None, decode_content=True):
        if stop.is_set():
            return
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if line.strip():
                yield line
    if buf.strip():
        yield buf


def build_streams(reconcilers: list[type[Reconciler]], enqueuer: Enqueuer,
                  stop: threading.Event, holder: str = "") -> list[Stream]:
    """One stream per watched resource and namespace, with every reconciler's handler on it."""
    by_gvr: dict[GVR, list[Handler]] = defaultdict(list)
    for cls in reconcilers:
        by_gvr[cls.primary()].append(Handler(cls, "primary"))
        for owned in cls.owns:
            by_gvr[owned.gvr()].append(Handler(cls, "owned"))
    namespaces = [n.strip() for n in str(conf.get("RECONCILERS_NAMESPACES")).split(",")
                  if n.strip()] or [None]
    return [Stream(gvr, handlers, enqueuer, stop, namespace=ns if gvr.namespaced else None,
                   holder=holder)
            for gvr, handlers in by_gvr.items()
            for ns in (namespaces if gvr.namespaced else [None])]


def heartbeat(identity: str) -> None:
    try:
        get_redis().hset(HEARTBEAT_KEY, identity, time.time())
    except Exception as exc:
        log.warning("heartbeat failed: %s", exc)


def run_streams(streams: list[Stream], until: Callable[[], bool], identity: str) -> None:
    """Run streams in threads until ``until()`` is true; heartbeat meanwhile."""
    threads = [threading.Thread(target=s.run, daemon=True, name=f"stream:{s.gvr.id}")
               for s in streams]
    for t in threads:
        t.start()
    while not until():
        heartbeat(identity)
        for s in streams:
            # Redis restarted empty: the synced marker vanished, so relist to refill.
            if s.resource_version and not _synced_safe(s.gvr):
                s.resource_version = ""
            s._save_status()  # flushes counters of a quiet stream (throttled to every 5 s)
        time.sleep(1)
    for s in streams:
        s.abort()
    for t in threads:
        t.join(15)


def _synced_safe(gvr: GVR) -> bool:
    try:
        return cache.is_synced(gvr)
    except Exception:
        return True
