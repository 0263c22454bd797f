"""The one door to Kubernetes: the client, the calls, and what an API error means.

No other module of the app imports ``kubernetes``. Everything else asks this module for a
client (``api_client()``), makes calls through ``request`` / ``get_or_none``, and catches
``ApiError``, which carries its own meaning: 404 is ``gone``; 408, 409, 429 and 5xx are
``temporary`` (retry with backoff, honouring Retry-After); other 4xx are ``permanent`` (the
request can never succeed as it is). Paths come from ``GVR.path`` and the well-known
resources below, never from string building elsewhere.
"""

from __future__ import annotations

import json
import math
import os
from functools import partial
from typing import Any, Iterator

import urllib3

from . import kubeimport

kubeimport.defer_generated_classes()  # before the first ``import kubernetes``: see there

from kubernetes import client, config  # noqa: E402
from kubernetes.client.exceptions import ApiException  # noqa: E402

from . import transport  # noqa: E402
from .once import per_process  # noqa: E402
from .vocab import GVR  # noqa: E402

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
# Lists and watches of metadata only (PartialObjectMetadata), as client-go's metadata informers.
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
METADATA = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"

# Resources the framework itself reads and writes.
EVENTS = GVR("", "v1", "events", "Event")
LEASES = GVR("coordination.k8s.io", "v1", "leases", "Lease")
CRDS = GVR("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition",
           namespaced=False)

# A server may ask for any Retry-After; past this it is a misconfiguration, not advice.
MAX_RETRY_AFTER = 600.0

class ApiClient(client.ApiClient):
    """The official client, with this project's transport beside it (``transport.py``) for the
    calls that return one body; ``None`` where only the official path will do."""

    def __init__(self, configuration: client.Configuration | None = None):
        super().__init__(configuration)
        self.transport = transport.Transport.of(
            self.configuration, self.default_headers,
            partial(_credentials, self.configuration)) if _lean() else None

    def close(self) -> None:
        lean = getattr(self, "transport", None)  # absent if __init__ failed
        if lean is not None:
            lean.close()
        super().close()


def _lean() -> bool:
    """``RECONCILERS_LEAN_TRANSPORT``; on where no Django settings are configured (scripts)."""
    from django.conf import settings as django_settings

    if not django_settings.configured:
        return True
    from .conf import settings

    return settings().lean_transport


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
    def from_response(cls, response: transport.Response) -> "ApiError":
        return cls._of(response.status, response.reason, response.body, response.headers,
                       response.headers.get("retry-after"))

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
    def temporary(self) -> bool:
        return self.status in (0, 408, 409, 429) or self.status >= 500

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


def request(api: client.ApiClient, method: str, path: str, body: Any = None,
            query: dict | None = None, content_type: str = JSON,
            timeout: float | tuple[float, float] | None = 30, stream: bool = False,
            accept: str = JSON):
    """One HTTP call to the api-server with the client's auth; returns the parsed JSON body.

    Raises ``ApiError`` for a non-2xx answer, and one of status 0 (temporary) when there was
    no answer. The response is parsed once, by us: the generated client would deserialize it
    into model objects (and, for custom resources, parse it again). With ``stream=True`` the
    raw urllib3 response is returned for the caller to read line by line (watch).
    ``accept``: another representation, e.g. ``METADATA_LIST``.
    """
    lean = None if stream else getattr(api, "transport", None)
    if lean is None:
        return _official_request(api, method, path, body, query, content_type, timeout, stream,
                                 accept)
    try:
        response = lean.request(method, path, query=list(query.items()) if query else None,
                                headers={"Accept": accept, "Content-Type": content_type},
                                body=None if body is None else _encode(api, body),
                                timeout=timeout)
    except transport.ConnectionFailed as exc:
        raise ApiError(0, "ConnectionFailed", str(exc)) from exc
    if not 200 <= response.status < 300:
        raise ApiError.from_response(response)
    return json.loads(response.body) if response.body else {}


def _encode(api: client.ApiClient, body: Any) -> bytes:
    if isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode()
    # Model objects and datetimes as the official client serialises them.
    return json.dumps(body, separators=(",", ":"),
                      default=api.sanitize_for_serialization).encode()


def _official_request(api: client.ApiClient, method: str, path: str, body: Any,
                      query: dict | None, content_type: str,
                      timeout: float | tuple[float, float] | None, stream: bool, accept: str):
    headers = {"Accept": accept, "Content-Type": content_type}
    try:
        resp = api.call_api(
            path, method,
            query_params=list((query or {}).items()),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
            _preload_content=False,
            _return_http_data_only=True,
            _request_timeout=timeout,
        )
        if stream:
            return resp
        try:
            data = resp.data
        finally:
            resp.release_conn()
    except ApiError:
        raise
    except ApiException as exc:
        raise ApiError.from_exception(exc) from None
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise ApiError(0, "ConnectionFailed", f"{method} {path}: {exc}") from exc
    return json.loads(data) if data else {}


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
