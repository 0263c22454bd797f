"""The watcher's health: its heartbeat in Redis and the check of it from inside its container
(``manage.py health watcher``), and ``Health``, what its own probes and scrape-time gauges
read, served beside its work by ``probes``.

The watcher writes hash ``operator:heartbeat:watcher`` field ``<hostname>:<pid>:<suffix>`` =
unix time every few seconds (``heartbeat``); the check reads this host's watcher's field
(``watcher_heartbeat``, beside its writer) and fails when it is missing or older than
``OPERATOR_HEALTH_WATCHER_MAX_AGE``. Which pid is "ours" is read from the processes' command
lines (``processes``): under host networking every container shares the host's name.
"""

from __future__ import annotations

import logging
import socket
import time
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import connection

from reconcilers._base import metrics, processes
from reconcilers._base.probes import (CheckResult, Endpoint, answers, check_database,
                                      check_redis, ms_since)
from reconcilers._kube.cache import get_redis
from reconcilers._queue import workqueue

if TYPE_CHECKING:
    from reconcilers._watch.streams import Stream

log = logging.getLogger(__name__)

WATCHER_HEARTBEAT_KEY = "operator:heartbeat:watcher"


# --- the heartbeat: written by the watcher, read by ``manage.py health watcher`` -------------


HEARTBEAT_KEPT = 600.0  # seconds a departed watcher's field stays in the heartbeat hash
# Beats this watcher wrote: counted by its supervising loop alone (``heartbeat``).
_beats = 0


def heartbeat(identity: str) -> None:
    """Write this watcher's beat; every minute or so, drop the fields of watchers gone for
    ``HEARTBEAT_KEPT`` (each start adds a field: the hash would grow with every restart)."""
    global _beats
    try:
        r = get_redis()
        now = time.time()
        r.hset(WATCHER_HEARTBEAT_KEY, identity, now)
        _beats += 1
        if _beats % 60 == 1:
            stale = [f for f, beat in r.hgetall(WATCHER_HEARTBEAT_KEY).items()
                     if now - float(beat) > HEARTBEAT_KEPT]
            if stale:
                r.hdel(WATCHER_HEARTBEAT_KEY, *stale)
    except Exception as exc:
        log.warning("heartbeat failed: %s", exc)


def local_watcher_pids() -> list[int]:
    """Pids of the ``manage.py watch`` processes running here."""
    return [pid for pid, argv in processes.command_lines()
            if processes.is_python(argv)
            and any(a.endswith("manage.py") and argv[i + 1:i + 2] == ["watch"]
                    for i, a in enumerate(argv))]


def watcher_field(pid: int) -> str:
    """The heartbeat field prefix of watcher ``pid`` on this host (the watcher appends a
    random suffix: containers sharing the host's name can run watchers with the same pid)."""
    return f"{socket.gethostname()}:{pid}"


def watcher_heartbeat(pid: int, max_age: float) -> CheckResult:
    """Fresh iff the watcher ``pid`` of this host wrote its heartbeat at most ``max_age`` ago."""
    start = time.monotonic()
    field = watcher_field(pid)
    beats = [float(v) for _, v in get_redis().hscan_iter(WATCHER_HEARTBEAT_KEY,
                                                         match=f"{field}:*")]
    raw = max(beats) if beats else None
    if raw is None:
        return CheckResult(False, ms_since(start), f"no heartbeat from {field}")
    age = time.time() - float(raw)
    if age > max_age:
        return CheckResult(False, ms_since(start),
                           f"heartbeat from {field} is {age:.0f}s old (max {max_age:.0f}s)")
    return CheckResult(True, ms_since(start))


# --- the watcher's own probes -----------------------------------------------------------------


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
                  "redis": answers(lambda t: check_redis(settings.REDIS_URL, t))}
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
