"""The web role's health: its ``/healthz``, ``/readyz`` and ``/metrics`` views (``urls``
routes them), and ``manage.py health web``'s check of them from inside its container.

``/healthz`` answers while the process serves requests: a failing liveness probe means "restart
me", so it checks nothing outside the process. ``/readyz`` answers 200 only when PostgreSQL,
Redis and the api-server answer, and names every check in its JSON body, so whoever reads a 503
sees which dependency is down. The checks run concurrently, each bounded by
``OPERATOR_HEALTH_TIMEOUT``: a black-holed dependency cannot hang the probe. They ask over
connections each process keeps for them (``probes.check_database``, ``check_redis``; the
shared api-server client), never new ones per probe. Error details go to the log, not into
the unauthenticated response.
"""

from __future__ import annotations

import os
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import asdict
from typing import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache

from reconcilers._base import metrics
from reconcilers._base.conf import process_setting
from reconcilers._base.probes import CheckResult, check_database, check_redis, ms_since, timed
from reconcilers._kube import kube


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
    futures = {name: pool.submit(timed, check, timeout)
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


# --- the views ---------------------------------------------------------------------------------


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


# --- liveness from inside the web container (``manage.py health web``) ------------------------


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
            return CheckResult(True, ms_since(start))
    except OSError as exc:  # HTTPError (non-2xx) and URLError are both OSErrors
        return CheckResult(False, ms_since(start), str(exc))


def _allowed_host() -> str:
    """A Host header the web process accepts (else Django answers 400 DisallowedHost)."""
    for pattern in settings.ALLOWED_HOSTS:
        return "localhost" if pattern == "*" else pattern.lstrip(".")
    return "localhost"
