"""The one module that talks to Kubernetes: builds the client and classifies API errors.

Everything else asks this module for a client (``api_client()``) and for the meaning of an
error (``classify``): 404 means the object is gone; 409, 429 and 5xx are temporary (retry with
backoff, honouring Retry-After); other 4xx are permanent (the request can never succeed as is).
"""

from __future__ import annotations

import functools
import os
import threading
from dataclasses import dataclass
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

_lock = threading.Lock()


@functools.lru_cache(maxsize=None)
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


@functools.lru_cache(maxsize=None)
def _shared_client(kubeconfig: str | None, pid: int) -> client.ApiClient:
    # Keyed by pid: a prefork Celery child must not reuse its parent's connection pool.
    with _lock:
        return client.ApiClient(_configuration(kubeconfig))


def new_api_client() -> client.ApiClient:
    """A private client, for threads that hold long-lived connections (watch streams)."""
    return client.ApiClient(_configuration(os.environ.get("KUBECONFIG") or None))


@dataclass(frozen=True)
class ApiError:
    """What an ``ApiException`` means for a reconcile."""

    status: int
    reason: str
    message: str
    retry_after: float | None = None

    @property
    def gone(self) -> bool:
        return self.status == 404

    @property
    def temporary(self) -> bool:
        return self.status in (0, 408, 409, 429) or self.status >= 500

    @property
    def permanent(self) -> bool:
        return not self.gone and not self.temporary


def classify(exc: ApiException) -> ApiError:
    import json

    reason, message = exc.reason or "", ""
    body: Any = exc.body
    if isinstance(body, (bytes, str)) and body:
        try:
            status_obj = json.loads(body)
            reason = status_obj.get("reason", reason) or reason
            message = status_obj.get("message", "") or ""
        except ValueError:
            message = body if isinstance(body, str) else body.decode(errors="replace")
    retry_after = None
    headers = exc.headers or {}
    if headers.get("Retry-After"):
        try:
            retry_after = float(headers["Retry-After"])
        except ValueError:
            retry_after = None
    return ApiError(status=exc.status or 0, reason=reason, message=message or str(exc),
                    retry_after=retry_after)


JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"


def request(api: client.ApiClient, method: str, path: str, body: Any = None,
            query: dict | None = None, content_type: str = JSON,
            timeout: float | tuple[float, float] | None = 30, stream: bool = False):
    """One HTTP call to the api-server with the client's auth; returns the parsed JSON body.

    The response is parsed once, by us: the generated client would deserialize it into model
    objects (and, for custom resources, parse it again). With ``stream=True`` the raw urllib3
    response is returned for the caller to read line by line (watch).
    """
    import json

    headers = {"Accept": "application/json", "Content-Type": content_type}
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
    return json.loads(data) if data else {}
