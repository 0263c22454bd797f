"""``SoakItem``: keeps ``spec.children`` ConfigMaps holding ``spec.value``, and writes a side
channel the soak's checker reads independently of the operator's own history.

Faults it can be asked for: ``spec.blockUntil`` (a unix time) makes each run until then block
in C (``time.sleep``) past its deadline, where no interruption reaches it. It writes
``settings.SOAK_NOTE`` into ``status.note``: the soak's rolling upgrade changes that setting
and checks every object shows the new one (the start pass reconciles every object).

Side channel: one line per event appended to ``$SOAK_TRACE`` (``O_APPEND``: atomic for short
lines): ``start|write <key> <run id> <unix time>``, a ``write`` only when the cluster really
changed (a new resourceVersion, a deletion). The checker rebuilds each run's active span
(start to its last write) and asserts no two spans of one key intersect.
"""

from __future__ import annotations

import os
import time
import uuid

from django.conf import settings

from reconcilers.api import Owns, Reconciler, predicates, register

MAX_CHILDREN = 4


def _trace(kind: str, key: str, run: str) -> None:
    path = os.environ.get("SOAK_TRACE")
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{kind} {key} {run} {time.time():.6f}\n".encode())
        finally:
            os.close(fd)


def _rv(obj: dict | None) -> str | None:
    return ((obj or {}).get("metadata") or {}).get("resourceVersion")


@register
class SoakItemReconciler(Reconciler):
    group, version, kind = "soak.operator.local", "v1", "SoakItem"
    owns = [Owns("v1", "ConfigMap")]
    predicates = [predicates.generation_changed]
    resync_period = 0
    timeout = 4

    def reconcile(self, obj: dict, ctx):
        key, run = str(ctx.key), uuid.uuid4().hex[:10]
        _trace("start", key, run)
        spec = obj.get("spec") or {}
        value, children = int(spec.get("value", 0)), int(spec.get("children", 0))
        name = obj["metadata"]["name"]
        time.sleep(float(os.environ.get("SOAK_WORK_SECONDS", "0.05")))
        blocked_for = float(spec.get("blockUntil") or 0) - time.time()
        if blocked_for > 0:  # in C, for longer than any deadline: only abandonment ends it
            time.sleep(min(blocked_for, 4 * self.timeout))
        for i in range(MAX_CHILDREN):
            child = f"{name}-{i}"
            before = _rv(ctx.get("v1", "ConfigMap", child))
            if i < children:
                after = _rv(ctx.create_or_update({"apiVersion": "v1", "kind": "ConfigMap",
                                                  "metadata": {"name": child},
                                                  "data": {"value": str(value)}}))
                if after != before:
                    _trace("write", key, run)
            elif before is not None and ctx.delete("v1", "ConfigMap", child):
                _trace("write", key, run)
        before = _rv(ctx.obj)
        if _rv(ctx.patch_status({"value": value, "children": children,
                                         "note": settings.SOAK_NOTE})) != before:
            _trace("write", key, run)
