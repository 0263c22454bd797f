"""Kubernetes Events from reconcilers, aggregated like client-go's EventRecorder.

One Event object per (object, type, reason, message), its ``count`` raised on repeats. At most
one api-server write per such Event per ``WRITE_INTERVAL`` seconds: an error loop that emits
the same warning on every retry costs a Redis increment, not an API call. Failures to record
an Event are logged, never raised - an Event is never worth failing a reconcile for.
"""

from __future__ import annotations

import hashlib
import logging
import socket
from datetime import datetime, timezone
from typing import Mapping

from kubernetes.client.exceptions import ApiException

from . import kube
from .cache import get_redis

log = logging.getLogger(__name__)

WRITE_INTERVAL = 30
COMPONENT = "django-crd-operator"

NORMAL = "Normal"
WARNING = "Warning"


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def record(api, obj: Mapping, type_: str, reason: str, message: str) -> None:
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace") or "default"
    digest = hashlib.sha1(f"{meta.get('uid')}|{type_}|{reason}|{message}".encode()).hexdigest()
    name = f"{meta.get('name')}.{digest[:16]}"
    try:
        r = get_redis()
        count = int(r.incr(f"operator:event:{namespace}/{name}"))
        r.expire(f"operator:event:{namespace}/{name}", 3600)
        if not r.set(f"operator:event-write:{namespace}/{name}", 1, nx=True, ex=WRITE_INTERVAL):
            return
        now = _now()
        path = f"/api/v1/namespaces/{namespace}/events"
        if count > 1:
            try:
                kube.request(api, "PATCH", f"{path}/{name}",
                             {"count": count, "lastTimestamp": now, "message": message},
                             content_type=kube.MERGE_PATCH)
                return
            except ApiException as e:
                if e.status != 404:
                    raise
        kube.request(api, "POST", path, {
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": {
                "apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"),
                "name": meta.get("name"), "namespace": meta.get("namespace"),
                "uid": meta.get("uid"), "resourceVersion": meta.get("resourceVersion"),
            },
            "type": type_, "reason": reason, "message": message, "count": count,
            "firstTimestamp": now, "lastTimestamp": now,
            "source": {"component": COMPONENT, "host": socket.gethostname()},
            "reportingComponent": COMPONENT, "reportingInstance": socket.gethostname(),
        })
    except ApiException as e:
        if e.status == 409:
            return
        log.warning("could not record event %s/%s: %s", reason, meta.get("name"), e.reason)
    except Exception as e:  # Redis down, network: an event is best effort
        log.warning("could not record event %s/%s: %s", reason, meta.get("name"), e)
