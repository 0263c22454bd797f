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

With ``RECONCILERS_METRICS_SECURE`` (``start``), ``/metrics`` leaves the probe port for a port
of its own (``OPERATOR_WATCHER_METRICS_PORT``, ``OPERATOR_WORKER_METRICS_PORT``), served over
HTTPS (``tls``) to callers a ``Guard`` allows - the api-server's reviews (``_kube.reviews``) -
as controller-runtime serves its metrics apart from its health probes. The probes stay plain
and open: the kubelet probes without a token.

A port already taken (or a serving pair that cannot be loaded) is logged and the process
carries on without that endpoint: metrics and probes must never stop the work they observe.

The checks every role's readiness shares live here too: PostgreSQL and Redis asked over
connections kept for them (``check_database``, ``check_redis``), and a check's outcome as the
``health`` command and the web's ``/readyz`` report it (``CheckResult``, ``timed``). What
each role checks is its wing's (``_web.health``, ``_watch.health``, ``_run.health``).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import socket
import ssl
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Protocol

from reconcilers._base import metrics, tls

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


METRICS = "/metrics"
PROBES = ("/healthz", "/readyz")
REQUEST_TIMEOUT = 10.0  # seconds a connection may take to hand over its request (and TLS hello)


class Verdict(Protocol):
    status: int  # 200 serves the scrape; any other status is the answer
    why: str


Guard = Callable[[str | None], Verdict]  # the request's ``Authorization`` header -> a verdict


@dataclass(frozen=True)
class Secure:
    """How ``/metrics`` is secured: who may read it, and the serving pair's directory
    (``tls.serving``; empty: self-signed)."""

    guard: Guard
    cert_dir: str = ""


def start(endpoint: Endpoint, port: int, metrics_port: int = 0, secure: Secure | None = None,
          host: str = "0.0.0.0") -> list[ThreadingHTTPServer]:
    """A process's endpoints on ``host`` (``OPERATOR_HTTP_HOST``): the probes on ``port``,
    plain; ``/metrics`` there too, or - when ``secure`` (``RECONCILERS_METRICS_SECURE``) -
    only over HTTPS on ``metrics_port`` to callers its guard allows. ``0`` turns a port off."""
    if secure is None:
        return [s for s in [serve(endpoint, port, host)] if s]
    servers = [serve(endpoint, port, host, paths=PROBES,
                     moved=f"/metrics is served over HTTPS on port {metrics_port}, to a "
                           f"bearer token allowed `get` on /metrics (RECONCILERS_METRICS_SECURE)"
                     if metrics_port else "/metrics is off (RECONCILERS_METRICS_SECURE, and "
                                          "no metrics port)")]
    if metrics_port:
        try:
            context = tls.serving(secure.cert_dir)
        except (OSError, ssl.SSLError, ValueError) as exc:
            log.error("%s: cannot serve /metrics over HTTPS: %s; carrying on without",
                      endpoint.role, exc)
        else:
            servers.append(serve(endpoint, metrics_port, host, paths=(METRICS,),
                                 context=context, guard=secure.guard))
    return [s for s in servers if s]


def serve(endpoint: Endpoint, port: int, host: str = "0.0.0.0",
          paths: tuple[str, ...] = (METRICS, *PROBES),
          context: Callable[[], ssl.SSLContext] | None = None, guard: Guard | None = None,
          moved: str = "") -> ThreadingHTTPServer | None:
    """Serve ``paths`` of ``endpoint`` on ``host:port`` in a daemon thread - over TLS with
    the context ``context`` gives at each connection, ``/metrics`` only to callers ``guard``
    allows; ``moved`` is what a request for ``/metrics`` here is told when it is served
    elsewhere. ``None`` when off or the port is taken."""
    if not port:
        return None

    class Handler(BaseHTTPRequestHandler):
        timeout = REQUEST_TIMEOUT

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            path = self.path.split("?", 1)[0]
            if path == METRICS and METRICS in paths:
                if guard is not None and not self._allowed():
                    return
                body, ctype = metrics.exposition(endpoint.collectors)
                self._answer(200, body, ctype)
                if endpoint.scraped is not None:
                    try:
                        endpoint.scraped(body)
                    except Exception as exc:  # bookkeeping must not fail a scrape
                        log.warning("%s: after a scrape: %s", endpoint.role, exc)
            elif path in PROBES and path in paths:
                checks = _run(endpoint.live if path == "/healthz" else endpoint.ready)
                ok = all(checks.values())
                body = json.dumps({"role": endpoint.role,
                                   "status": "ok" if ok else "failing",
                                   "checks": checks}).encode()
                self._answer(200 if ok else 503, body, "application/json")
            elif path == METRICS and moved:
                self._answer(404, f"{moved}\n".encode(), "text/plain")
            else:
                self._answer(404, b"not found\n", "text/plain")

        def _allowed(self) -> bool:
            """Asks the guard; answers the refusal itself (401 with a Bearer challenge)."""
            try:
                verdict = guard(self.headers.get("Authorization"))
            except Exception as exc:  # a guard that cannot decide refuses, and says why
                log.error("%s: cannot decide a scrape: %s", endpoint.role, exc)
                self._answer(500, b"cannot decide this request; see the operator's log\n",
                             "text/plain")
                return False
            if verdict.status == 200:
                return True
            # Each refusal, with whom: a scraper refused every 15 s is a misconfiguration to see.
            log.warning("%s: refused a scrape from %s (%s): %s", endpoint.role,
                        self.client_address[0], verdict.status, verdict.why)
            challenge = {"WWW-Authenticate": 'Bearer realm="metrics"'} \
                if verdict.status == 401 else {}
            self._answer(verdict.status, f"{verdict.why}\n".encode(), "text/plain", challenge)
            return False

        def _answer(self, status: int, body: bytes, ctype: str,
                    headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args) -> None:  # scrapes are not news
            pass

    try:
        server = (_TLSServer((host, port), Handler, context) if context is not None
                  else ThreadingHTTPServer((host, port), Handler))
    except OSError as exc:
        log.error("%s: cannot serve %s on port %s: %s; carrying on without",
                  endpoint.role, ", ".join(paths), port, exc)
        return None
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True,
                     name=f"probes:{port}").start()
    log.info("%s: %s on port %s%s", endpoint.role, ", ".join(paths), port,
             " (HTTPS, bearer token)" if guard is not None else
             " (HTTPS)" if context is not None else "")
    return server


class _TLSServer(ThreadingHTTPServer):
    """``ThreadingHTTPServer`` over TLS, the handshake made on the connection's own thread
    (bounded by ``REQUEST_TIMEOUT``): a client that connects and never says hello must not
    hold up the accepting thread, which a socket wrapped before ``accept`` would let it."""

    def __init__(self, address: tuple[str, int], handler: type,
                 context: Callable[[], ssl.SSLContext]):
        super().__init__(address, handler)
        self.context = context

    def finish_request(self, request: socket.socket, client_address) -> None:
        request.settimeout(REQUEST_TIMEOUT)
        try:
            secured = self.context().wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError) as exc:  # no TLS, a slow hello: not this server's news
            log.debug("metrics: TLS handshake with %s failed: %s", client_address, exc)
            return
        try:
            super().finish_request(secured, client_address)
        finally:
            secured.close()


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


# Each process's readiness connection, by pid: added by the first probe a process serves,
# removed by ``close_database``. Module level (not the server's) because the watcher's and the
# worker's probes share it; keyed by pid because a forked child inherits its parent's entry
# but none of its threads.
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


@dataclass(frozen=True)
class CheckResult:
    """One check of a role from outside its loop (``manage.py health``, the web's ``/readyz``):
    whether it passed, how long it took, and - when it failed - a short reason (the
    exception's class name where the check raised: details go to the log, not into an
    unauthenticated response)."""

    ok: bool
    ms: float
    error: str = ""


def timed(check: Callable[[float], object], timeout: float) -> CheckResult:
    """``check(timeout)`` as a ``CheckResult``: failed when it raises."""
    start = time.monotonic()
    try:
        check(timeout)
    except Exception as exc:
        log.warning("health check %s failed: %s", getattr(check, "__name__", check), exc)
        return CheckResult(False, ms_since(start), type(exc).__name__)
    return CheckResult(True, ms_since(start))


def ms_since(start: float) -> float:
    """Milliseconds since ``start`` (``time.monotonic()``), to a tenth."""
    return round((time.monotonic() - start) * 1000, 1)


def _run(checks: Checks) -> dict[str, bool]:
    try:
        return {name: bool(ok) for name, ok in checks().items()}
    except Exception as exc:  # a check that cannot even run is a failing check
        log.warning("probe failed: %s", exc)
        return {"probe": False}
