"""The one door to Kubernetes: the client, the calls, and what an API error means.

No other module of the app imports ``kubernetes``. Everything else asks this module for a
client (``api_client()``), makes calls through ``request`` / ``get_or_none``, and catches
``ApiError``, which carries its own meaning: 404 is ``gone``; 408, 409, 429 and 5xx are
``temporary`` (retry with backoff, honouring Retry-After); other 4xx are ``permanent`` (the
request can never succeed as it is). Paths come from ``GVR.path`` and the well-known
resources below, never from string building elsewhere.

Calls go over urllib3, through the pool manager the official client builds from its
configuration (CA, client certificate, hostname checks, proxy, pool size): the client's TLS
settings and kept-alive connections, without ``ApiClient.call_api``'s generic layers (parameter
sanitising, model (de)serialisation) that a JSON body does not need. Credentials are asked of
the configuration per request, where its refresh hook runs (docs/contributing/architecture.md, "What the
plumbing costs").
"""

from __future__ import annotations

import json
import math
import os
import time
from contextlib import contextmanager
from contextvars import ContextVar
from importlib import metadata
from typing import Any, Iterator
from urllib.parse import urlencode

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from reconcilers._base import metrics
from reconcilers._base.once import per_process
from reconcilers._base.vocab import GVR

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
# Lists and watches of metadata only (PartialObjectMetadata), as client-go's metadata informers.
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
METADATA = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"

# Resources the framework itself reads and writes.
EVENTS = GVR("events.k8s.io", "v1", "events", "Event")  # core/v1 shows the same objects
LEASES = GVR("coordination.k8s.io", "v1", "leases", "Lease")
CRDS = GVR("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition",
           namespaced=False)

# A server may ask for any Retry-After; past this it is a misconfiguration, not advice.
MAX_RETRY_AFTER = 600.0


class _Retry(urllib3.Retry):
    """urllib3's ``Retry``, except that a read that timed out is not tried again: a caller's
    timeout bounds its whole call (a leader's renewal must end inside its renew deadline)."""

    def increment(self, method: str | None = None, url: str | None = None,
                  response: Any = None, error: Exception | None = None, _pool: Any = None,
                  _stacktrace: Any = None) -> urllib3.Retry:
        if isinstance(error, urllib3.exceptions.ReadTimeoutError):
            raise error
        return super().increment(method, url, response, error, _pool, _stacktrace)


# A kept-alive connection may be closed by the server (or a load balancer) just as a request
# goes out. urllib3 replaces one found closed while idle; a call that fails in that instant
# (its connection broken, its answer cut off) is made once more on a new connection if its
# method is idempotent (urllib3's default set). Any other call is never made twice - the
# server may have received it: it fails as a temporary error and the run retries its key. A
# refused connection, a timeout and an HTTP status are not retried here: backoff, deadlines
# and Retry-After are the caller's (urllib3 would otherwise answer a 429 or 503 carrying
# Retry-After itself, and report it as no answer at all).
RETRY = _Retry(total=1, connect=0, read=1, other=1, status=0, redirect=False,
               respect_retry_after_header=False, raise_on_status=False)

ApiClient = client.ApiClient  # the official client: what ``api_client()`` returns

try:
    USER_AGENT = f"django-crd-operator/{metadata.version('django-crd-operator')}"
except metadata.PackageNotFoundError:  # a checkout on sys.path, not installed
    USER_AGENT = "django-crd-operator"

# The run this thread is acting for, sent in every call's User-Agent: the api-server's audit
# log then names the run behind each write, so an outside checker (the soak's) can tell
# whether two runs of one key ever wrote at once without trusting the operator's own tables.
_run_identity: ContextVar[str | None] = ContextVar("run_identity", default=None)


@contextmanager
def acting_for_run(identity: str) -> Iterator[None]:
    """Calls made inside carry ``(run <identity>)`` in their User-Agent."""
    reset = _run_identity.set(identity)
    try:
        yield
    finally:
        _run_identity.reset(reset)


def user_agent() -> str:
    run = _run_identity.get()
    return f"{USER_AGENT} (run {run})" if run else USER_AGENT


def _credentials(configuration: client.Configuration) -> dict[str, str]:
    """The headers ``ApiClient.update_params_for_auth`` would set, asked for per request: the
    configuration's refresh hook (in-cluster token files, exec plugins) runs there."""
    return {s["key"]: s["value"] for s in configuration.auth_settings().values()
            if s["in"] == "header" and s["value"]}


class ApiError(ApiException):
    """A refused api-server call, classified. A subclass of the client's ``ApiException``, so
    code written against the official client keeps catching it."""

    def __init__(self, status: int, reason: str = "", message: str = "",
                 retry_after: float | None = None, headers: Any = None):
        super().__init__(status=status, reason=reason)
        self.message = message or reason
        self.retry_after = retry_after
        self.headers = headers

    @classmethod
    def from_exception(cls, exc: ApiException) -> "ApiError":
        headers = exc.headers or {}
        return cls._of(exc.status or 0, exc.reason or "", exc.body, headers,
                       headers.get("Retry-After"))

    @classmethod
    def from_response(cls, response: urllib3.BaseHTTPResponse) -> "ApiError":
        return cls._of(response.status, response.reason or "", response.data, response.headers,
                       response.headers.get("Retry-After"))

    @classmethod
    def _of(cls, status: int, reason: str, body: Any, headers: Any,
            retry_after: str | None) -> "ApiError":
        """The api-server's ``Status`` object, when the body is one, names the reason and
        says what went wrong."""
        message = ""
        text = body.decode(errors="replace") if isinstance(body, bytes) else body
        if isinstance(text, str) and text:
            try:
                status_obj = json.loads(text)
                reason = status_obj.get("reason", reason) or reason
                message = status_obj.get("message", "") or ""
            except (ValueError, AttributeError):
                message = text
        error = cls(status=status, reason=reason, message=message or str(reason),
                    retry_after=_retry_after(retry_after), headers=headers)
        error.body = text
        return error

    @classmethod
    def from_watch_error(cls, status: dict) -> "ApiError":
        """An ``ERROR`` event's object (a ``Status``) in a watch stream."""
        return cls(status=status.get("code") or 500, reason=status.get("reason", ""),
                   message=status.get("message", ""))

    @property
    def gone(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def changed_since_read(self) -> bool:
        """A write's precondition failed: the object's resourceVersion (or uid) is no longer
        the one the write was conditional on. Not an apply's conflict with another field
        manager, nor a create's "already exists" - both 409 too."""
        if self.status != 409 or self.reason != "Conflict":
            return False
        try:
            causes = (json.loads(self.body or "{}").get("details") or {}).get("causes") or []
        except (ValueError, AttributeError):
            causes = []
        return not any(c.get("reason") == "FieldManagerConflict" for c in causes)

    @property
    def temporary(self) -> bool:
        """Worth retrying with backoff: no answer, a timeout, a conflict, throttling, a server
        error - and 401/403, which a restarted api-server answers for a moment before its
        authentication and authorization caches fill, and which a Role granted later cures
        without the object changing."""
        return self.status in (0, 401, 403, 408, 409, 429) or self.status >= 500

    @property
    def permanent(self) -> bool:
        return not self.gone and not self.temporary

    def __str__(self) -> str:
        return f"{self.status} {self.reason}: {self.message}"


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None  # an HTTP date: rare from the api-server; backoff decides instead
    if not math.isfinite(seconds) or seconds < 0:
        return None
    return min(seconds, MAX_RETRY_AFTER)


@per_process
def _configuration(kubeconfig: str | None) -> client.Configuration:
    cfg = client.Configuration()
    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    else:
        config.load_incluster_config(client_configuration=cfg)
    return cfg


def api_client() -> ApiClient:
    """A client per process (and per thread pool it creates), from KUBECONFIG or in-cluster."""
    return _shared_client(os.environ.get("KUBECONFIG") or None, os.getpid())


@per_process
def _shared_client(kubeconfig: str | None, pid: int) -> ApiClient:
    # Keyed by pid: a prefork Celery child must not reuse its parent's connection pool.
    return ApiClient(_configuration(kubeconfig))


def new_api_client() -> ApiClient:
    """A private client, for threads that hold long-lived connections (watch streams)."""
    return ApiClient(_configuration(os.environ.get("KUBECONFIG") or None))


class Offline:
    """Stands in for an ``ApiClient`` where nothing may reach the api-server (``replay``):
    ``request`` hands every call to ``answer(method, path, body, query, content_type)``."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer


def request(api: client.ApiClient, method: str, path: str, body: Any = None,
            query: dict | None = None, content_type: str = JSON,
            timeout: float | tuple[float, float] | None = 30, stream: bool = False,
            accept: str = JSON) -> Any:
    """One HTTP call to the api-server with the client's auth; returns the parsed JSON body.

    Raises ``ApiError`` for a non-2xx answer, and one of status 0 (temporary) when there was
    no answer. The response is parsed once, by us: the generated client would deserialize it
    into model objects (and, for custom resources, parse it again). With ``stream=True`` the
    urllib3 response is returned unread, for the caller to read line by line (watch) and then
    ``release_conn()``. ``timeout``: seconds for connecting and for each read, or a
    ``(connect, read)`` pair. ``accept``: another representation, e.g. ``METADATA_LIST``.
    """
    if isinstance(api, Offline):
        return api.answer(method, path, body, query, content_type)
    configuration = api.configuration
    # Credentials first: the kubeconfig loader's refresh hook also sets the host back.
    headers = {**api.default_headers, "Accept": accept, "Content-Type": content_type,
               "User-Agent": user_agent(), **_credentials(configuration)}
    url = configuration.host + path
    if query:
        url += "?" + urlencode(list(query.items()))
    start = time.perf_counter()
    try:
        response = api.rest_client.pool_manager.urlopen(
            method, url, body=None if body is None else _encode(api, body), headers=headers,
            retries=RETRY if method in RETRY.allowed_methods else False, redirect=False,
            preload_content=not stream, timeout=_timeout(timeout))
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        metrics.observe_request(method, configuration.host, "<error>",
                                time.perf_counter() - start)
        raise ApiError(0, "ConnectionFailed", f"{method} {path}: {_cause(exc)}") from exc
    metrics.observe_request(method, configuration.host, response.status,
                            time.perf_counter() - start)
    if not 200 <= response.status < 300:
        error = ApiError.from_response(response)
        response.release_conn()
        raise error
    if stream:
        return response
    return json.loads(response.data) if response.data else {}


def _timeout(timeout: float | tuple[float, float] | None) -> urllib3.Timeout | float | None:
    if isinstance(timeout, tuple):
        return urllib3.Timeout(connect=timeout[0], read=timeout[1])
    return timeout


def _cause(exc: Exception) -> Exception:
    """What went wrong, without urllib3's retry wrapper around it."""
    return exc.reason if isinstance(exc, urllib3.exceptions.MaxRetryError) and exc.reason \
        else exc


def _encode(api: client.ApiClient, body: Any) -> bytes:
    if isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode()
    # Model objects and datetimes as the official client serialises them.
    return json.dumps(body, separators=(",", ":"),
                      default=api.sanitize_for_serialization).encode()


def watch_events(resp, *until) -> Iterator[dict]:
    """A watch response's events (``request(..., stream=True)``), one per line, until the
    server ends it or one of ``until`` (events) is set."""
    buf = b""
    for chunk in resp.stream(amt=None, decode_content=True):
        if any(e.is_set() for e in until):
            return
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if line.strip():
                yield json.loads(line)
    if buf.strip():
        yield json.loads(buf)


def get_or_none(api: client.ApiClient, path: str, **kwargs) -> dict | None:
    """GET ``path``; ``None`` when the object does not exist (404)."""
    try:
        return request(api, "GET", path, **kwargs)
    except ApiError as exc:
        if exc.gone:
            return None
        raise


def version(api: client.ApiClient, timeout: float = 5) -> dict:
    """The api-server's ``/version``: the cheapest call that proves it answers."""
    return request(api, "GET", "/version", timeout=timeout)
