"""Level-triggered safety net: re-enqueue known objects, periodically (beat) or by hand.

Known objects are the cached ones (what exists now) plus, when the cache is not synced, the
ledger's keys. A resync never bypasses the ledger: a key already queued or running is merged,
never run twice at once.
"""

from __future__ import annotations

import time

from reconcilers._kube import cache
from reconcilers._queue import workqueue
from reconcilers._base.conf import settings
from reconcilers.models import RegisteredReconciler, WorkItem
from reconcilers._base.reconcile import Key, Trigger
from reconcilers._authoring.registry import registry
from reconcilers._base.vocab import split_object_path


def known_keys(reconciler: str, namespace: str | None = None) -> list[Key]:
    gvr = registry.get_class(reconciler).primary()
    names: set[tuple[str, str]] = set()
    names.update(split_object_path(f) for f in cache.fields(gvr))
    if not cache.is_synced(gvr, namespace):
        names.update(WorkItem.objects.filter(reconciler=reconciler)
                     .exclude(last_outcome="gone").values_list("namespace", "name"))
    return [Key(reconciler, ns, n) for ns, n in sorted(names)
            if namespace is None or ns == namespace]


def resync(reconciler: str, namespace: str | None = None, name: str | None = None,
           trigger: str = Trigger.MANUAL, audit_id: int | None = None) -> int:
    """Enqueue one object or every known object of a reconciler; returns keys enqueued."""
    if name:
        keys = [Key(reconciler, namespace or "", name)]
    else:
        keys = known_keys(reconciler, namespace)
    workqueue.add(keys, trigger, audit_id)
    return len(keys)


def period_of(reconciler: str) -> float:
    """The admin's override (``RegisteredReconciler.resync_period``), else the code's value."""
    override = (RegisteredReconciler.objects.filter(name=reconciler)
                .values_list("resync_period", flat=True).first())
    if override is not None:
        return float(override)
    declared = registry.get_class(reconciler).resync_period
    return float(settings().resync_period if declared is None else declared)


def resync_due() -> int:
    """Resync each reconciler whose period has passed since its last resync.

    The period is a Redis key with that expiry: whoever sets it first (one beat, even with
    several running) does the resync; nobody else can until it expires.
    """
    r = cache.get_redis()
    total = 0
    for cls in registry:
        name = cls.name()
        period = period_of(name)
        marker = f"operator:resync:{name}"
        if period > 0 and r.set(marker, time.time(), nx=True, ex=max(1, int(period))):
            try:
                total += resync(name, trigger=Trigger.RESYNC)
            except Exception:
                r.delete(marker)  # not done: the next beat tries again, not a period later
                raise
    return total
