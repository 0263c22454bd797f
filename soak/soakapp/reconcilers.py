"""``SoakItem``: keeps ``spec.children`` ConfigMaps holding ``spec.value``, and writes what the
soak's checker needs to judge it from outside the operator.

Every run writes its object at least twice, each write named by an identity the run makes for
itself (fresh per attempt; the audit log knows the run by the one the operator puts in the
User-Agent of its calls, and needs none of the object's):

- **begin**, first of all: a JSON patch of the object that *tests* ``metadata.generation``
  against the copy the run read and records the run in the annotation ``RUN_ANNOTATION``.
  It succeeds only while the object still has the generation the run read, so a begin the
  audit log shows as answered 2xx proves that run saw every spec change made before it.
  A failed test (a stale copy) is a temporary error: the run ends and is retried.
- **end**, last of all: the status (``status.run`` names the run, ``observedGeneration``
  the generation it saw), conditional on the object's resourceVersion after the begin.

So each run spans from its begin to its end in the audit log, and two runs of one object
that overlapped interleave there (``soak/audit.py``). The objects are created by
``kubectl apply``, whose annotation makes ``metadata.annotations`` exist for the patch's
``add``.

Faults it can be asked for: ``spec.blockUntil`` (a unix time) makes each run until then block
in C (``time.sleep``) past its deadline, where no interruption reaches it. It writes
``settings.SOAK_NOTE`` into ``status.note``: the soak's rolling upgrade changes that setting
and checks every object shows the new one (the start pass reconciles every object).

Side channel: one line per event appended to ``$SOAK_TRACE`` (``O_APPEND``: atomic for short
lines): ``start|write|block <key> <run id> <unix time>``, a ``write`` only when the cluster
really changed (a new resourceVersion, a deletion), stamped with the time it was *sent* (a
write cannot take effect before; a process stopped after the answer and before its line
would otherwise stamp it late), a ``block`` when a run starts blocking in C. The checker rebuilds each run's active span (start to its last write) and asserts no two
spans of one key intersect; the blocks are the evidence that the blocking fault took effect.
"""

from __future__ import annotations

import os
import time
import uuid

from django.conf import settings

from reconcilers.api import ApiError, Owns, Reconciler, TemporaryError, predicates, register

MAX_CHILDREN = 4
RUN_ANNOTATION = "soak.operator.local/run"
JSON_PATCH = "application/json-patch+json"


def _trace(kind: str, key: str, run: str, at: float | None = None) -> None:
    path = os.environ.get("SOAK_TRACE")
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{kind} {key} {run} {at or time.time():.6f}\n".encode())
        finally:
            os.close(fd)


def _rv(obj: dict | None) -> str | None:
    return ((obj or {}).get("metadata") or {}).get("resourceVersion")


def run_identity() -> str:
    """A name for this attempt, unique across processes: each call of ``reconcile`` is one."""
    return uuid.uuid4().hex[:12]


def begin(ctx, run: str) -> dict:
    """The run's first write: its identity on the object, accepted only while the object has
    the generation this run read. Returns the object as written."""
    generation = ctx.obj["metadata"]["generation"]
    annotation = "/metadata/annotations/" + RUN_ANNOTATION.replace("~", "~0").replace("/", "~1")
    try:
        return ctx.request(
            "PATCH", ctx.primary.path(ctx.key.namespace, ctx.key.name),
            [{"op": "test", "path": "/metadata/generation", "value": generation},
             {"op": "add", "path": annotation, "value": f"{run} generation {generation}"}],
            content_type=JSON_PATCH)
    except ApiError as exc:
        if exc.status == 422:  # the test failed: the object changed since this copy
            raise TemporaryError(f"stale copy (generation {generation}): {exc.message}") \
                from exc
        raise


@register
class SoakItemReconciler(Reconciler):
    group, version, kind = "soak.operator.local", "v1", "SoakItem"
    owns = [Owns("v1", "ConfigMap")]
    predicates = [predicates.generation_changed]
    resync_period = 0
    timeout = 4

    def reconcile(self, obj: dict, ctx):
        key, run = str(ctx.key), run_identity()
        _trace("start", key, run)
        sent = time.time()
        ctx.obj = begin(ctx, run)
        _trace("write", key, run, sent)
        spec = obj.get("spec") or {}
        value, children = int(spec.get("value", 0)), int(spec.get("children", 0))
        name = obj["metadata"]["name"]
        time.sleep(float(os.environ.get("SOAK_WORK_SECONDS", "0.05")))
        blocked_for = float(spec.get("blockUntil") or 0) - time.time()
        if blocked_for > 0:  # in C, for longer than any deadline: only abandonment ends it
            _trace("block", key, run)
            time.sleep(min(blocked_for, 4 * self.timeout))
        for i in range(MAX_CHILDREN):
            child = f"{name}-{i}"
            before, sent = _rv(ctx.get("v1", "ConfigMap", child)), time.time()
            if i < children:
                after = _rv(ctx.create_or_update({"apiVersion": "v1", "kind": "ConfigMap",
                                                  "metadata": {"name": child},
                                                  "data": {"value": str(value)}}))
                if after != before:
                    _trace("write", key, run, sent)
            elif before is not None and ctx.delete("v1", "ConfigMap", child):
                _trace("write", key, run, sent)
        # The end: status.run is new on every run, so this write is never skipped.
        sent = time.time()
        ctx.patch_status({"value": value, "children": children, "note": settings.SOAK_NOTE,
                          "run": run})
        _trace("write", key, run, sent)
