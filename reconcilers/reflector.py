"""The reflector: list and watch one resource, keep the shared cache, report every change.

client-go's Reflector: a paginated LIST, then a WATCH from the list's resourceVersion with
bookmarks and a server timeout; on ``410 Gone`` (as a watch event or as the HTTP answer) a
relist that reports what changed or vanished meanwhile; on any other error a reconnect with
capped exponential backoff (0.8 s -> 30 s, jittered). It never exits on a transient error.

Each change goes to the shared cache *before* it is reported (``deliver(trigger, old, new)``),
so whoever runs the key reads this version or a newer one. What to do with a change is the
handlers' business (``handlers.py``), not the reflector's.

Only the reflector's own thread touches ``known`` and ``resource_version``; other threads ask
for a relist through ``relist_requested`` (e.g. after Redis lost the cache).
"""

from __future__ import annotations

import json
import logging
import random
import threading
from typing import Callable, Iterator

from . import cache, kube
from .conf import settings
from .models import Trigger
from .vocab import GVR, object_path, split_object_path

log = logging.getLogger(__name__)

Deliver = Callable[[str, "dict | None", "dict | None"], None]


class Gone(Exception):
    """The resourceVersion is too old (410): relist."""


class Reflector:
    """List + watch of one resource, in one namespace or in all (``namespace=None``)."""

    def __init__(self, gvr: GVR, namespace: str | None, deliver: Deliver,
                 stop: threading.Event, status=None):
        self.gvr, self.namespace = gvr, namespace
        self.deliver = deliver
        self.stop_event = stop
        self.status = status  # a watch.StreamStatus, or None
        self.relist_requested = threading.Event()
        # Owned by this reflector's thread: the last state seen of every object (sanitised,
        # like the cache) and the resourceVersion to resume the watch from.
        self.known: dict[str, dict] = {}
        self.resource_version = ""
        self._resp = None

    def abort(self) -> None:
        """Stop now: set the stop flag and close the open watch connection."""
        self.stop_event.set()
        self._close_watch()

    def request_relist(self) -> None:
        """From any thread: relist now (the open watch is closed so the request is not left
        waiting for the next event of a quiet stream)."""
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
        delay = 0.8
        first = True
        while not self.stop_event.is_set():
            try:
                if first or not self.resource_version or self.relist_requested.is_set():
                    self.list(api, initial=first)
                    # Cleared once the cache is refilled: until then, asking again is moot.
                    self.relist_requested.clear()
                    first = False
                self.watch(api)
                delay = 0.8
            except Gone:
                self._note("relist")
                self.resource_version = ""
                log.info("%s: resourceVersion expired, relisting", self.gvr.id)
            except Exception as exc:
                if self.relist_requested.is_set() and not self.stop_event.is_set():
                    continue  # we closed the watch ourselves
                self._note("error", f"{type(exc).__name__}: {exc}")
                log.warning("%s: %s; reconnecting in %.1fs", self.gvr.id, exc, delay)
                self.stop_event.wait(delay * random.uniform(0.8, 1.2))
                delay = min(delay * 2, 30.0)
        self._note("stopped")
        api.close()

    def list(self, api, initial: bool = False) -> None:
        """Paginated LIST; replace this scope of the cache and report every difference."""
        seen: dict[str, dict] = {}
        token = ""
        page = settings().list_page_size
        while True:
            query = {"limit": page}
            if token:
                query["continue"] = token
            body = kube.request(api, "GET", self.gvr.path(self.namespace), query=query,
                                timeout=(10, 120))
            for obj in body.get("items") or []:
                obj.setdefault("apiVersion", self.gvr.api_version)
                obj.setdefault("kind", self.gvr.kind)
                meta = obj["metadata"]
                seen[object_path(meta.get("namespace"), meta["name"])] = cache.sanitize(obj)
            token = (body.get("metadata") or {}).get("continue") or ""
            if not token:
                rv = body["metadata"]["resourceVersion"]
                break
        if initial:
            # After a restart nothing is in memory: the shared cache tells what existed - in
            # this stream's namespace only, and whole, so a child deleted while no watcher ran
            # still names its owner.
            previous = cache.objects(self.gvr, self.namespace)
        else:
            previous = self.known
        vanished = set(previous) - set(seen)
        pipe = cache.get_redis().pipeline(transaction=False)
        cache.put_many(self.gvr, seen.values(), pipe)
        for path in vanished:
            ns, name = split_object_path(path)
            cache.delete(self.gvr, ns or None, name, pipe)
        pipe.execute()
        for path, obj in seen.items():
            old = previous.get(path)
            if _rv(old) != _rv(obj):
                self.deliver(Trigger.ADDED if old is None else Trigger.RELIST, old, obj)
        for path in vanished:
            self.deliver(Trigger.DELETED, previous[path], None)
        self.known = seen
        self.resource_version = rv
        cache.mark_synced(self.gvr, self.namespace, rv)
        self._note("listed")

    def watch(self, api) -> None:
        conf = settings()
        timeout = random.randint(conf.watch_timeout_min, conf.watch_timeout_max)
        query = {"watch": "true", "resourceVersion": self.resource_version,
                 "allowWatchBookmarks": "true", "timeoutSeconds": timeout}
        try:
            resp = kube.request(api, "GET", self.gvr.path(self.namespace), query=query,
                                timeout=(10, conf.watch_inactivity), stream=True)
        except kube.ApiError as exc:
            if exc.status == 410:
                raise Gone(exc.message) from None
            raise
        self._resp = resp
        self._note("connected")
        try:
            for line in _lines(resp, self.stop_event, self.relist_requested):
                self.handle(json.loads(line))
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
            raise kube.ApiError(status=obj.get("code") or 500, reason=obj.get("reason", ""),
                                message=obj.get("message", ""))
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if kind == "BOOKMARK":
            self.resource_version = rv or self.resource_version
            return
        meta = obj["metadata"]
        path = object_path(meta.get("namespace"), meta["name"])
        old = self.known.get(path)
        if kind == "DELETED":
            cache.delete(self.gvr, meta.get("namespace"), meta["name"])
            self.known.pop(path, None)
            self.deliver(Trigger.DELETED, old or cache.sanitize(obj), None)
        else:
            new = cache.sanitize(obj)
            cache.put_many(self.gvr, [new])
            self.known[path] = new
            self.deliver(Trigger.ADDED if kind == "ADDED" else Trigger.MODIFIED, old, new)
        self.resource_version = rv or self.resource_version
        self._note("event")

    def _note(self, what: str, error: str = "") -> None:
        if self.status is not None:
            self.status.note(what, self.resource_version, error)


def _rv(obj: dict | None) -> str | None:
    return ((obj or {}).get("metadata") or {}).get("resourceVersion")


def _lines(resp, stop: threading.Event, relist: threading.Event) -> Iterator[bytes]:
    """The watch body, line by line, until the server ends it or we are told to stop."""
    buf = b""
    for chunk in resp.stream(amt=None, decode_content=True):
        if stop.is_set() or relist.is_set():
            return
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if line.strip():
                yield line
    if buf.strip():
        yield buf
