"""The enqueuer: one thread between the watcher's streams and the work queue.

Keys go through one ``Enqueuer`` thread that drains everything waiting into a few batched
statements: a relist of 10,000 objects costs a handful of round trips, not 10,000. When keys
arrive faster than it enqueues them (some came in while the last batch was being written), it
gathers for ``RECONCILERS_ENQUEUE_WINDOW`` first, so a stream batches too; a key that finds the
enqueuer idle goes at once, so a steady trickle pays no window. Once a change's keys are in the
ledger, its journal entry is cleared (``journal``).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import defaultdict

from django.db import connection

from reconcilers._base import connections
from reconcilers._base.conf import settings
from reconcilers._base.reconcile import Key
from reconcilers._kube import journal
from reconcilers._queue import workqueue

log = logging.getLogger(__name__)

_WAKE = object()  # put on the enqueuer's queue to make it look at its stop flag


class Enqueuer(threading.Thread):
    """Drains keys into batched work-queue adds (one per trigger), then clears the journal
    entries of the changes those keys came from (``journal``).

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
        # Every key put this term, until ``forget``: the start pass leaves these out, whether
        # or not they have reached the ledger yet. Written by the streams' threads, read by
        # the start pass's, under the lock.
        self._put_keys: set[Key] | None = set()
        self._put_keys_lock = threading.Lock()

    def put(self, key: Key, trigger: str) -> None:
        self.puts += 1
        if self._put_keys is not None:
            with self._put_keys_lock:
                if self._put_keys is not None:
                    self._put_keys.add(key)
        self._put((key, trigger))

    def put_so_far(self) -> frozenset[Key]:
        """The keys put since this enqueuer started (empty once ``forget`` was called)."""
        with self._put_keys_lock:
            return frozenset(self._put_keys or ())

    def forget(self) -> None:
        """Stop remembering the keys put: nobody will ask again this term."""
        with self._put_keys_lock:
            self._put_keys = None

    def stop(self) -> None:
        """Finish what is queued, then end (now, not at the next poll)."""
        self.stop_event.set()
        try:
            self.queue.put_nowait(_WAKE)
        except queue.Full:  # it is busy, and will look at its stop flag
            pass

    def done(self, change: journal.Change) -> None:
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
            changes: list[journal.Change] = []
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
                    connections.once_more_on_new(lambda: workqueue.add(keys, trigger),
                                                 len(keys), "enqueue of keys")
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

    def _clear(self, changes: list[journal.Change]) -> None:
        try:
            journal.clear(changes)
        except Exception as exc:  # kept entries are replayed later: a duplicate, not a loss
            log.warning("could not clear %d journal entries: %s", len(changes), exc)

    def drain(self, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while not self.queue.empty() and time.monotonic() < deadline:
            time.sleep(0.01)
