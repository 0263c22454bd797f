"""The webhook server: ``routes.respond`` on gunicorn's threaded worker, over TLS.

Why gunicorn's ``gthread`` worker (docs/writing/webhooks.md says it at length): it is already what the
project's web role runs, its master restarts a worker that dies, and it offers each thing the
api-server's calls need as a setting or a documented hook:

- **bounded connections**: ``worker_connections`` per worker process; past it the worker stops
  accepting and further connections wait in the listen backlog (then the kernel refuses them) -
  nothing is allocated per waiting connection, nothing crashes;
- **idle connections**: ``keepalive`` closes a kept-alive connection idle that long, and a fresh
  connection that sends nothing waits on the worker's poller, not in a thread;
- **certificate reload**: the ``ssl_context`` hook is asked for a context at every TLS
  handshake; ``CertificatePair`` answers with one rebuilt when the files changed (cert-manager
  renews by swapping the Secret volume's ``..data`` symlink), so new connections get the new
  pair without a restart, and a half-written pair keeps the old one;
- **a deadline per request**: gthread has none for a connection that trickles its TLS
  handshake, headers or body (a byte a second holds a thread for ever). ``Worker`` adds one:
  from being picked up, a request must be read, answered and written within
  ``request_timeout`` (default 32 s, controller-runtime's ``ReadHeaderTimeout``, above the
  api-server's 30 s ceiling for ``timeoutSeconds``); past it the socket is shut down.

``serve()`` runs the gunicorn master in this process: ``ready`` (registration) runs once the
socket listens, before the workers fork; SIGTERM stops it gracefully and returns.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import resource
import socket
import ssl
import sys
import threading
import time
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Callable

from gunicorn.app.base import BaseApplication
from gunicorn.arbiter import Arbiter
from gunicorn.workers import gthread

from reconcilers._base import metrics
from reconcilers._base.tls import CertificatePair
from reconcilers._webhooks import routes

log = logging.getLogger(__name__)

# Files a worker keeps open besides its connections: listeners, logs, database, api-server.
FILES_OF_OUR_OWN = 64
# gthread's "no data yet, wait on the poller" answer of handle(); its deadline carries over.
_DEFER = getattr(gthread, "_DEFER", object())


@dataclass(frozen=True)
class Options:
    """How the server holds up; ``manage.py webhook serve`` has a flag for each."""

    workers: int = 1  # processes; each runs its own threads
    threads: int = 16  # requests served at once per worker
    max_connections: int = 1000  # open connections per worker (gunicorn's default); more wait
    backlog: int = 128  # connections the kernel queues past the bound before refusing
    request_timeout: float = 32.0  # handshake + request + answer, from being picked up
    keepalive: int = 90  # idle seconds before a kept-alive connection is closed
    graceful_timeout: int = 10  # seconds a stopping worker finishes what it serves


# --- the serving pair, following its files (``tls.CertificatePair``) -------------------------


# What serve() settles before the workers fork, and they inherit.
_pair: CertificatePair | None = None
_request_timeout: float = Options.request_timeout


def readiness() -> tuple[bool, str]:
    """``/readyz``: the serving pair loaded and unexpired."""
    if _pair is None:
        return False, "no certificate loaded"
    return _pair.ready()


# --- the WSGI application ---------------------------------------------------------------------


def application(environ, start_response):
    """``routes.respond`` as a WSGI application, plus ``GET /readyz`` (the serving pair
    loaded and unexpired) and ``GET /metrics`` (this server's figures); the hook paths are
    counted as controller-runtime counts its webhooks, by path."""
    method, path = environ.get("REQUEST_METHOD", ""), environ.get("PATH_INFO", "")
    if method == "GET" and path == "/metrics":
        data, content_type = metrics.exposition()
        start_response("200 OK", [("Content-Type", content_type),
                                  ("Content-Length", str(len(data)))])
        return [data]
    if method == "GET" and path == "/readyz":
        ready, message = readiness()
        return _answer(start_response, 200 if ready else 503,
                       {"status": "ok" if ready else "not ready", "message": message}, None)
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    if path not in routes.HOOK_PATHS:
        return _answer(start_response, *routes.respond(method, path, b""))
    started = time.perf_counter()
    in_flight = metrics.webhook_requests_in_flight.labels(path)
    in_flight.inc()
    try:
        body = environ["wsgi.input"].read(length) if 0 < length <= routes.MAX_BODY else b""
        status, payload, then = routes.respond(method, path, body)
    except Exception:
        metrics.webhook_requests_total.labels(path, "500").inc()
        raise
    finally:
        in_flight.dec()
        metrics.webhook_latency_seconds.labels(path).observe(time.perf_counter() - started)
    metrics.webhook_requests_total.labels(path, str(status)).inc()
    return _answer(start_response, status, payload, then)


def _answer(start_response, status: int, payload: dict, then: Callable | None):
    data = json.dumps(payload).encode()
    start_response(f"{status} {HTTPStatus(status).phrase}",
                   [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
    return _AfterResponse([data], then)


class _AfterResponse:
    """A WSGI body whose ``close`` - called once the response is sent - runs ``then``."""

    def __init__(self, body: list[bytes], then: Callable | None):
        self.body, self.then = body, then

    def __iter__(self):
        return iter(self.body)

    def close(self) -> None:
        if self.then is not None:
            self.then()


def count_from_zero() -> None:
    """Each hook path's series at 0 before its first call, as controller-runtime starts
    them (``code`` 200 and 500), so dashboards and alerts see them on a fresh server."""
    for path in routes.HOOK_PATHS:
        metrics.webhook_requests_total.labels(path, "200")
        metrics.webhook_requests_total.labels(path, "500")
        metrics.webhook_requests_in_flight.labels(path)
        metrics.webhook_latency_seconds.labels(path)


# --- the worker: gthread plus a deadline per request ----------------------------------------


class Worker(gthread.ThreadWorker):
    """gunicorn's gthread worker with a deadline on every request.

    A new connection is armed when accepted (its first byte is due within the timeout; until
    then it waits on the poller, not in a thread), and every request again when a thread
    picks it up; it is disarmed when the thread is done with it. The worker's loop, which runs
    at least once a second, shuts down the socket of any request past its deadline: the
    blocked read (TLS handshake, headers, body) or write returns at once and gunicorn closes
    the connection. A hook still running then finishes, and its answer goes nowhere - the
    api-server stopped waiting long before."""

    def init_process(self) -> None:
        self._deadlines: dict[int, tuple[float, int, gthread.TConn]] = {}
        self._deadlines_lock = threading.Lock()
        self._request_timeout = _request_timeout  # set by serve() before the fork
        self._said_full = 0.0  # when running out of files was last logged
        self._fit_connections_to_open_files()
        count_from_zero()
        super().init_process()

    def _fit_connections_to_open_files(self) -> None:
        """A bound above the open-file limit would turn into failed accepts: lower it to what
        the limit leaves besides the process's own files."""
        limit, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        room = limit - FILES_OF_OUR_OWN
        if limit != resource.RLIM_INFINITY and self.worker_connections > room:
            log.warning("webhook server: %d connections asked, the open-file limit (%d) "
                        "leaves room for %d", self.worker_connections, limit, max(room, 1))
            self.worker_connections = max(room, 1)
            self.max_keepalived = self.worker_connections - self.cfg.threads

    def accept(self, listener) -> None:
        try:
            super().accept(listener)
        except OSError as exc:  # the connection waits in the backlog, the worker lives
            if exc.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                raise
            if time.monotonic() - self._said_full > 10:
                self._said_full = time.monotonic()
                log.warning("webhook server cannot accept now: %s", exc)
            time.sleep(0.1)

    def enqueue_req(self, conn) -> None:
        if not conn.initialized:  # a new connection: its first byte is due in time too
            self._arm(conn, keep=True)
        super().enqueue_req(conn)

    def handle(self, conn):
        # A new connection with nothing to read yet waits on the poller at once, not in
        # this thread (gthread would hold the thread 5 s per idle connection).
        if not conn.initialized and not conn.data_ready and not conn.wait_for_data(0):
            return _DEFER
        self._arm(conn)  # from now: time spent queued for a thread does not count
        result = False
        try:
            result = super().handle(conn)
            return result
        finally:
            if result is not _DEFER:
                with self._deadlines_lock:
                    self._deadlines.pop(id(conn), None)

    def _arm(self, conn, keep: bool = False) -> None:
        with self._deadlines_lock:
            if keep and id(conn) in self._deadlines:
                return
            # The fd number, not the socket object: during the TLS handshake the plain
            # socket is already detached and the SSL one not yet assigned.
            fd = conn.sock.fileno()
            self._deadlines[id(conn)] = (time.monotonic() + self._request_timeout, fd, conn)

    def murder_keepalived(self, force: bool = False) -> None:
        super().murder_keepalived(force)
        self._expire()

    def _expire(self) -> None:
        now = time.monotonic()
        with self._deadlines_lock:
            late = [(key, fd, conn) for key, (deadline, fd, conn) in self._deadlines.items()
                    if deadline <= now]
            for key, fd, conn in late:
                del self._deadlines[key]
                if not conn.initialized and conn.sock.fileno() == -1:
                    continue  # closed while it waited on the poller: the fd is not its own
                try:
                    peer = socket.socket(fileno=os.dup(fd))
                except OSError:
                    continue
                try:
                    peer.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                finally:
                    peer.close()
                log.info("webhook connection from %s cut: no complete request and answer "
                         "within %.0f s", _peer(conn), self._request_timeout)


def _peer(conn) -> str:
    client = getattr(conn, "client", None)
    return f"{client[0]}:{client[1]}" if isinstance(client, tuple) else str(client)


# --- the gunicorn master, in this process ----------------------------------------------------


class _Application(BaseApplication):
    def __init__(self, settings: dict, app: Callable):
        self._settings, self._app = settings, app
        super().__init__()

    def load_config(self) -> None:
        for name, value in self._settings.items():
            self.cfg.set(name, value)

    def load(self) -> Callable:
        return self._app


def _ssl_context(config, default_factory) -> ssl.SSLContext:
    """gunicorn's hook, asked at every handshake: the current pair's context."""
    return _pair.context()


def _worker_gone(server, worker) -> None:
    metrics.process_exited(worker.pid)


def serve(host: str, port: int, cert: Path, key: Path, *, options: Options = Options(),
          ready: Callable[[], None] | None = None) -> None:
    """HTTPS until SIGTERM or SIGINT (then gracefully: what is being served is answered).
    ``ready`` runs once the socket listens - registering before that sends the api-server's
    first calls nowhere - and before the workers start; its exception stops the server."""
    global _pair, _request_timeout
    _pair = CertificatePair(cert, key, name="webhook")
    _request_timeout = options.request_timeout
    settings = {
        "bind": [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"],
        "worker_class": f"{__name__}.Worker",
        "workers": options.workers,
        "threads": options.threads,
        "worker_connections": options.max_connections,
        "backlog": options.backlog,
        "keepalive": options.keepalive,
        "graceful_timeout": options.graceful_timeout,
        "timeout": 30,  # the master's heartbeat check of a worker's loop, not of requests
        "certfile": str(cert), "keyfile": str(key), "ssl_context": _ssl_context,
        "http_protocols": "h1",  # the api-server speaks HTTP/1.1 to webhooks; deadlines are per request
        "when_ready": lambda server: ready() if ready is not None else None,
        "child_exit": _worker_gone,
        "accesslog": None, "errorlog": "-", "loglevel": "info",
        "proc_name": "webhook",
        "control_socket_disable": True,  # no shared socket in $HOME; signals suffice
        "limit_request_line": 8190, "limit_request_fields": 100,
    }
    master = os.getpid()
    try:
        Arbiter(_Application(settings, application)).run()
    except SystemExit as exc:
        if os.getpid() != master:  # a worker leaving: what is below it belongs to the master
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(exc.code if isinstance(exc.code, int) else 1)
        if exc.code not in (None, 0):
            raise
