"""Liveness and readiness, for the web role's probes and ``manage.py health``.

``/healthz`` answers while the process serves requests: a failing liveness probe means "restart
me", so it checks nothing outside the process. ``/readyz`` answers 200 only when PostgreSQL,
Redis and the api-server answer, and names every check in its JSON body, so whoever reads a 503
sees which dependency is down. The checks run concurrently, each bounded by
``OPERATOR_HEALTH_TIMEOUT``: a black-holed dependency cannot hang the probe. They ask over
connections each process keeps for them (``probes.check_database``, ``check_redis``; the
shared api-server client), never new ones per probe. Error details go to the log, not into
the unauthenticated response.

The worker and watcher checks run inside their own containers (compose healthchecks):

- worker: a Celery control ping addressed to *this* container's worker node. The reply comes from
  the worker's consumer loop, so it proves the worker is connected to the broker and consuming.
- watcher: the watcher writes hash ``operator:heartbeat:watcher`` field ``<hostname>:<pid>`` =
  unix time every few seconds (``heartbeat``, below, beside its reader); the check reads this
  host's watcher's field and fails when it is missing or older than
  ``OPERATOR_HEALTH_WATCHER_MAX_AGE``.

Which worker node or watcher pid is "ours" is read from the processes' own command lines in
``/proc``: under host networking every container shares the host's name, so the name alone
cannot tell scaled replicas apart.

The watcher's own ``/healthz``, ``/readyz`` and scrape-time gauges are ``Health``'s, served
beside its work by ``probes``.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache

from reconcilers._kube import kube
from reconcilers._base import metrics
from reconcilers._base.conf import process_setting
from reconcilers._base.probes import Endpoint, answers, check_database, check_redis
from reconcilers._kube.cache import get_redis
from reconcilers._queue import workqueue

if TYPE_CHECKING:
    from reconcilers._watch.streams import Stream

log = logging.getLogger(__name__)

WATCHER_HEARTBEAT_KEY = "operator:heartbeat:watcher"


@dataclass(frozen=True)
class CheckResult:
    ok: bool
    ms: float
    error: str = ""


def _timed(check: Callable[[float], object], timeout: float) -> CheckResult:
    start = time.monotonic()
    try:
        check(timeout)
    except Exception as exc:
        log.warning("health check %s failed: %s", getattr(check, "__name__", check), exc)
        return CheckResult(False, _ms_since(start), type(exc).__name__)
    return CheckResult(True, _ms_since(start))


def _ms_since(start: float) -> float:
    return round((time.monotonic() - start) * 1000, 1)


# --- readiness: the web role's dependencies ---------------------------------------------------


def check_apiserver(timeout: float) -> None:
    kube.version(kube.api_client(), timeout=timeout)


READINESS_CHECKS: dict[str, Callable[[float], None]] = {
    "database": check_database,
    "redis": lambda timeout: check_redis(settings.REDIS_URL, timeout),
    "apiserver": check_apiserver,
}


def readiness(timeout: float | None = None) -> dict[str, CheckResult]:
    """Run every readiness check concurrently; one that overruns ``timeout`` counts as failed."""
    timeout = process_setting("OPERATOR_HEALTH_TIMEOUT", 3.0) if timeout is None else timeout
    pool = ThreadPoolExecutor(max_workers=len(READINESS_CHECKS), thread_name_prefix="readyz")
    futures = {name: pool.submit(_timed, check, timeout)
               for name, check in READINESS_CHECKS.items()}
    # libpq (and psycopg) never time a connect out in under 2 s: a budget below that would
    # abandon the database check just before it fails by itself.
    budget = max(timeout, 2.0) + 1
    wait(futures.values(), timeout=budget)
    # Never wait for a hung check: its thread finishes (or not) after the response is sent.
    pool.shutdown(wait=False, cancel_futures=True)
    return {
        name: f.result() if f.done() else CheckResult(False, budget * 1000, "Timeout")
        for name, f in futures.items()
    }


@never_cache
def healthz(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok\n", content_type="text/plain")


@never_cache
def readyz(request: HttpRequest) -> JsonResponse:
    results = readiness()
    ok = all(r.ok for r in results.values())
    body = {"status": "ready" if ok else "unready",
            "checks": {name: asdict(r) for name, r in results.items()}}
    return JsonResponse(body, status=200 if ok else 503)


@never_cache
def metrics_view(request: HttpRequest) -> HttpResponse:
    """Prometheus text of this web process (adds and messages from admin actions, ...).
    Several gunicorn workers share one ``PROMETHEUS_MULTIPROC_DIR`` (the image sets it)."""
    body, content_type = metrics.exposition()
    return HttpResponse(body, content_type=content_type)


# --- processes in this container: the worker's node, the watcher's pid -----------------------


def _command_lines() -> Iterator[tuple[int, list[str]]]:
    for entry in sorted(Path("/proc").glob("[0-9]*"), key=lambda p: int(p.name)):
        try:
            raw = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if raw:
            yield int(entry.name), raw.decode(errors="replace").rstrip("\0").split("\0")


def worker_node(argv: list[str]) -> str | None:
    """The node name a ``celery ... worker`` command line gives its worker, ``%h`` expanded."""
    from celery.utils.nodenames import default_nodename, host_format

    is_celery = _is_python(argv) and any(a.endswith("celery") for a in argv)
    if not is_celery or "worker" not in argv:
        return None
    name = None
    for i, arg in enumerate(argv):
        if arg in ("-n", "--hostname") and i + 1 < len(argv):
            name = argv[i + 1]
        elif arg.startswith("--hostname="):
            name = arg.partition("=")[2]
    return host_format(default_nodename(name))


def local_worker_nodes() -> list[str]:
    """Node names of the Celery workers running here (pool children share their parent's)."""
    nodes = (worker_node(argv) for _, argv in _command_lines())
    return sorted({n for n in nodes if n})


def local_watcher_pids() -> list[int]:
    return [pid for pid, argv in _command_lines()
            if _is_python(argv) and any(a.endswith("manage.py") and argv[i + 1:i + 2] == ["watch"]
                                        for i, a in enumerate(argv))]


def _is_python(argv: list[str]) -> bool:
    """The interpreter itself, not a wrapper that names it (docker-init, sh -c, timeout)."""
    return Path(argv[0]).name.startswith("python")


# --- liveness of each role, from inside its container ----------------------------------------


def probe_web(timeout: float) -> CheckResult:
    """GET /healthz of the gunicorn in this container (``WEB_BIND``, as the image starts it)."""
    host, _, port = os.environ.get("WEB_BIND", "127.0.0.1:8000").rpartition(":")
    if host in ("", "0.0.0.0", "[::]"):
        host = "127.0.0.1"
    request = urllib.request.Request(f"http://{host}:{port}/healthz",
                                     headers={"Host": _allowed_host()})
    start = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout):
            return CheckResult(True, _ms_since(start))
    except OSError as exc:  # HTTPError (non-2xx) and URLError are both OSErrors
        return CheckResult(False, _ms_since(start), str(exc))


def _allowed_host() -> str:
    """A Host header the web process accepts (else Django answers 400 DisallowedHost)."""
    for pattern in settings.ALLOWED_HOSTS:
        return "localhost" if pattern == "*" else pattern.lstrip(".")
    return "localhost"


def ping_worker(node: str, timeout: float) -> CheckResult:
    """A control ping to ``node`` alone; only that worker's reply counts."""
    from celery import current_app

    start = time.monotonic()
    replies = current_app.control.ping(destination=[node], timeout=timeout)
    if any(node in reply for reply in replies):
        return CheckResult(True, _ms_since(start))
    return CheckResult(False, _ms_since(start), f"no reply from {node} within {timeout}s")


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
        return CheckResult(False, _ms_since(start), f"no heartbeat from {field}")
    age = time.time() - float(raw)
    if age > max_age:
        return CheckResult(False, _ms_since(start),
                           f"heartbeat from {field} is {age:.0f}s old (max {max_age:.0f}s)")
    return CheckResult(True, _ms_since(start))


# --- the watcher's own: its heartbeat and its probes ------------------------------------------


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
