"""Kubernetes Events from reconcilers, through ``events.k8s.io/v1`` as client-go's new
EventRecorder writes them (``kubectl get events`` and ``describe`` show them as before: core/v1
serves the same objects).

One Event object per (object, type, reason, message); repeats make it a series, its count
raised. At most one api-server write per such Event per ``WRITE_INTERVAL`` seconds: an error
loop that emits the same warning on every retry costs a Redis increment, not an API call. An
offline api (a test's fake cluster, a replay) has no Redis beside it: there every repeat is
written, its count read back from the Event.
Failures to record an Event are logged, never raised - an Event is never worth failing a
reconcile for.
"""

from __future__ import annotations

import hashlib
import logging
import socket
from typing import Mapping

from reconcilers._kube import kube
from reconcilers._kube.cache import get_redis
from reconcilers._base.vocab import rfc3339

log = logging.getLogger(__name__)

WRITE_INTERVAL = 30
COMPONENT = "django-crd-operator"

ACTION = "Reconcile"  # what the controller was doing (events.k8s.io/v1 requires one)

NORMAL = "Normal"
WARNING = "Warning"


def _instance() -> str:
    return f"{COMPONENT}-{socket.gethostname()}"[:128]


def record(api, obj: Mapping, type_: str, reason: str, message: str) -> None:
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace") or "default"
    digest = hashlib.sha1(f"{meta.get('uid')}|{type_}|{reason}|{message}".encode()).hexdigest()
    name = f"{meta.get('name')}.{digest[:16]}"
    try:
        count = _count_offline(api, namespace, name) if isinstance(api, kube.Offline) \
            else _count_in_redis(namespace, name)
        if count is None:
            return
        now = rfc3339(micros=True)
        if count > 1:
            try:
                kube.request(api, "PATCH", kube.EVENTS.path(namespace, name),
                             {"series": {"count": count, "lastObservedTime": now}},
                             content_type=kube.MERGE_PATCH)
                return
            except kube.ApiError as e:
                if not e.gone:
                    raise
        kube.request(api, "POST", kube.EVENTS.path(namespace), {
            "apiVersion": kube.EVENTS.api_version, "kind": kube.EVENTS.kind,
            "metadata": {"name": name, "namespace": namespace},
            "regarding": {
                "apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"),
                "name": meta.get("name"), "namespace": meta.get("namespace"),
                "uid": meta.get("uid"), "resourceVersion": meta.get("resourceVersion"),
            },
            "type": type_, "reason": reason[:128], "note": message[:1024], "action": ACTION,
            "eventTime": now,
            **({"series": {"count": count, "lastObservedTime": now}} if count > 1 else {}),
            "reportingController": COMPONENT, "reportingInstance": _instance(),
        })
    except kube.ApiError as e:
        if e.conflict:
            return
        log.warning("could not record event %s/%s: %s", reason, meta.get("name"), e)
    except Exception as e:  # Redis down, network: an event is best effort
        log.warning("could not record event %s/%s: %s", reason, meta.get("name"), e)


def _count_in_redis(namespace: str, name: str) -> int | None:
    """This Event's count so far, this one included; None when it was written less than
    ``WRITE_INTERVAL`` seconds ago (the count is written with the next one)."""
    r = get_redis()
    count = int(r.incr(f"operator:event:{namespace}/{name}"))
    r.expire(f"operator:event:{namespace}/{name}", 3600)
    if not r.set(f"operator:event-write:{namespace}/{name}", 1, nx=True, ex=WRITE_INTERVAL):
        return None
    return count


def _count_offline(api, namespace: str, name: str) -> int:
    """The count for an api with no Redis beside it (a test's fake cluster, a replay): the
    Event as the api-server holds it, plus this one; every repeat is written."""
    held = kube.get_or_none(api, kube.EVENTS.path(namespace, name))
    return ((held.get("series") or {}).get("count") or 1) + 1 if held else 1
