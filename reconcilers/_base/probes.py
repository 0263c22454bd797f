"""The HTTP endpoint every long-running process serves: ``/metrics``, ``/healthz``, ``/readyz``.

The watcher and the worker are not web servers, so each starts this small threaded server
beside its real work (``OPERATOR_WATCHER_HTTP_PORT``, ``OPERATOR_WORKER_HTTP_PORT``; ``0``
turns it off). The web role answers the same three paths through Django.

- ``/healthz``: the process's own loop is alive (a failing liveness probe means "restart me",
  so it checks nothing outside the process).
- ``/readyz``: the process can do its job now; the JSON body names each check, so whoever
  reads a 503 sees why.
- ``/metrics``: Prometheus text, every process of this one's tree (prefork children included)
  plus what this process computes at scrape time.

A port already taken is logged and the process carries on without the endpoint: metrics and
probes must never stop the work they observe.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

from reconcilers._base import metrics

log = logging.getLogger(__name__)

Checks = Callable[[], dict[str, bool]]


@dataclass
class Endpoint:
    """What one process answers. ``live`` and ``ready`` return named checks, all must pass."""

    role: str
    live: Checks
    ready: Checks
    collectors: list = field(default_factory=list)
    scraped: Callable[[bytes], None] | None = None  # told what each scrape was served


def serve(endpoint: Endpoint, port: int, host: str = "0.0.0.0") -> ThreadingHTTPServer | None:
    """Serve ``endpoint`` on ``host:port`` in a daemon thread; ``None`` when off or the port
    is taken."""
    if not port:
        return None

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                body, ctype = metrics.exposition(endpoint.collectors)
                self._answer(200, body, ctype)
                if endpoint.scraped is not None:
                    try:
                        endpoint.scraped(body)
                    except Exception as exc:  # bookkeeping must not fail a scrape
                        log.warning("%s: after a scrape: %s", endpoint.role, exc)
            elif path in ("/healthz", "/readyz"):
                checks = _run(endpoint.live if path == "/healthz" else endpoint.ready)
                ok = all(checks.values())
                body = json.dumps({"role": endpoint.role,
                                   "status": "ok" if ok else "failing",
                                   "checks": checks}).encode()
                self._answer(200 if ok else 503, body, "application/json")
            else:
                self._answer(404, b"not found\n", "text/plain")

        def _answer(self, status: int, body: bytes, ctype: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args) -> None:  # scrapes are not news
            pass

    try:
        server = ThreadingHTTPServer((host, port), Handler)
    except OSError as exc:
        log.error("%s: cannot serve /metrics and probes on port %s: %s; carrying on without",
                  endpoint.role, port, exc)
        return None
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True,
                     name=f"probes:{port}").start()
    log.info("%s: /metrics, /healthz and /readyz on port %s", endpoint.role, port)
    return server


# Readiness asks PostgreSQL and Redis over connections kept for it, never new ones per probe:
# a kubelet probing every few seconds, times every replica, must not load the database with
# connection set-ups (each a PostgreSQL backend process) nor fill its log with them.
_PROBE_APPLICATION = "operator readiness"  # PostgreSQL's application_name
_REDIS_NAME = "operator-readiness"  # Redis's CLIENT SETNAME (no spaces)


class _DatabaseProbe:
    """``SELECT 1`` on one connection kept by one thread of this process. Django's
    connections belong to the thread that opened them, and the probe server answers each
    request on a new thread: the checks are handed to a thread that lives as long as the
    process, whose connection stays open between probes and is dropped (to be opened again
    at the next probe) as soon as a check fails. A check still running when the next one
    comes (a database that does not answer) is shared, never queued behind."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="probe-database")
        self._lock = threading.Lock()
        self._running: Future | None = None

    def check(self, timeout: float) -> None:
        with self._lock:
            if self._running is None or self._running.done():
                self._running = self._pool.submit(self._select_one, timeout)
            running = self._running
        # libpq never times a connect out in under 2 s (see _select_one).
        running.result(timeout=max(2.0, timeout) + 0.5)

    @staticmethod
    def _select_one(timeout: float) -> None:
        from django.db import connections

        conn = connections["default"]
        if conn.connection is None:
            # Bounded like the other checks: a black-holed database must not hang the probe
            # (connect_timeout for a connection, tcp_user_timeout for an open one's answer).
            options = conn.settings_dict.get("OPTIONS", {})
            conn.settings_dict = {**conn.settings_dict, "OPTIONS": {
                **options, "connect_timeout": max(2, int(timeout)),
                "tcp_user_timeout": int(timeout * 1000),
                "application_name": _PROBE_APPLICATION}}
        try:
            with conn.cursor() as cursor:
                cursor.execute("SET statement_timeout = %s", [int(timeout * 1000)])
                cursor.execute("SELECT 1")
        except Exception:
            conn.close()
            raise

    def close(self) -> None:
        from django.db import connections

        self._pool.submit(lambda: connections["default"].close()).result(timeout=10)
        self._pool.shutdown(wait=False)


_database_probes: dict[int, _DatabaseProbe] = {}


def check_database(timeout: float) -> None:
    """``SELECT 1`` on this process's readiness connection to PostgreSQL (``_DatabaseProbe``)."""
    pid = os.getpid()  # a forked child has none of its parent's threads
    probe = _database_probes.get(pid)
    if probe is None:
        probe = _database_probes.setdefault(pid, _DatabaseProbe())
    probe.check(timeout)


def close_database() -> None:
    """Close this process's readiness connection (a test database cannot be dropped while
    one is open)."""
    probe = _database_probes.pop(os.getpid(), None)
    if probe is not None:
        probe.close()


@functools.lru_cache(maxsize=8)
def _redis_pool(url: str, timeout: float):
    """One connection pool per URL: redis-py keeps its connections between pings, and makes a
    forked child a pool of its own."""
    import redis

    return redis.ConnectionPool.from_url(url, socket_connect_timeout=timeout,
                                         socket_timeout=timeout, client_name=_REDIS_NAME)


def check_redis(url: str, timeout: float) -> None:
    import redis

    redis.Redis(connection_pool=_redis_pool(url, timeout)).ping()


def answers(check: Callable[[float], None], timeout: float = 2.0) -> bool:
    """True when ``check(timeout)`` returns without raising."""
    try:
        check(timeout)
        return True
    except Exception as exc:
        log.info("probe check %s failed: %s", getattr(check, "__name__", check), exc)
        return False


def _run(checks: Checks) -> dict[str, bool]:
    try:
        return {name: bool(ok) for name, ok in checks().items()}
    except Exception as exc:  # a check that cannot even run is a failing check
        log.warning("probe failed: %s", exc)
        return {"probe": False}
