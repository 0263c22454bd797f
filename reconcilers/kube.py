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
from typing import Any

from . import kubeimport

kubeimport.defer_generated_classes()  # before the first ``import kubernetes``: see there

from kubernetes import client, config  # noqa: E402
from kubernetes.client.exceptions import ApiException  # noqa: E402

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

ApiClient = client.ApiClient


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
        reason, message = exc.reason or "", ""
        body: Any = exc.body
        if isinstance(body, (bytes, str)) and body:
            try:
                status_obj = json.loads(body)
                reason = status_obj.get("reason", reason) or reason
                message = status_obj.get("message", "") or ""
            except (ValueError, AttributeError):
                message = body if isinstance(body, str) else body.decode(errors="replace")
        headers = exc.headers or {}
        return cls(status=exc.status or 0, reason=reason, message=message or str(reason),
                   retry_after=_retry_after(headers.get("Retry-After")), headers=headers)

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


def api_client() -> client.ApiClient:
    """A client per process (and per thread pool it creates), from KUBECONFIG or in-cluster."""
    return _shared_client(os.environ.get("KUBECONFIG") or None, os.getpid())


@per_process
def _shared_client(kubeconfig: str | None, pid: int) -> client.ApiClient:
    # Keyed by pid: a prefork Celery child must not reuse its parent's connection pool.
    return client.ApiClient(_configuration(kubeconfig))


def new_api_client() -> client.ApiClient:
    """A private client, for threads that hold long-lived connections (watch streams)."""
    return client.ApiClient(_configuration(os.environ.get("KUBECONFIG") or None))


def request(api: client.ApiClient, method: str, path: str, body: Any = None,
            query: dict | None = None, content_type: str = JSON,
            timeout: float | tuple[float, float] | None = 30, stream: bool = False,
            accept: str = JSON):
    """One HTTP call to the api-server with the client's auth; returns the parsed JSON body.

    Raises ``ApiError`` for a non-2xx answer. The response is parsed once, by us: the generated
    client would deserialize it into model objects (and, for custom resources, parse it again).
    With ``stream=True`` the raw urllib3 response is returned for the caller to read line by
    line (watch). ``accept``: another representation, e.g. ``METADATA_LIST``.
    """
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
    except ApiError:
        raise
    except ApiException as exc:
        raise ApiError.from_exception(exc) from None
    if stream:
        return resp
    try:
        data = resp.data
    finally:
        resp.release_conn()
    return json.loads(data) if data else {}


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
