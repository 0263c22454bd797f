"""``Probe``: a reconciler scripted by its spec, to test the engine with real processes.

spec.value        copied to status.value with observedGeneration (the "converged" check)
spec.sleep        seconds each run takes (one time.sleep)
spec.spin         seconds each run takes, computing (Python instructions all the way)
spec.failTimes    the first N runs of this object raise RuntimeError
spec.permanent    every run raises PermanentError
spec.requeueAfter the first run returns Result.after(seconds)
spec.temporaryDelay  the first run raises TemporaryError(delay=seconds)
spec.finalize     the Probe carries a finalizer; cleanup is counted in Redis
spec.lingerWrites (``probes.deadline``) the first run ignores its deadline until the test wakes
                  it (``probe:wake:<name>`` in Redis), then tries one write of each kind

``probes.configured.operator.local`` reads its value from the ConfigMap ``<name>-config``
(a related object: ``Watches`` maps its changes to the Probe) and counts the ConfigMaps of the
same ``data.color`` through an index.

``probes.parent.operator.local`` makes a child, the Probe ``<name>-child`` of
``probes.test.operator.local`` (a kind with a status subresource), and notes the child's
generation each run saw (``probe:parent-saw:<uid>``); ``probes.statusblind.operator.local`` is
the same parent whose ``Owns`` filters out the child's status-only changes.
"""

from __future__ import annotations

import time

from django.conf import settings
from prometheus_client import Counter

from reconcilers.api import (
    Index,
    Owns,
    PermanentError,
    Reconciler,
    Result,
    TemporaryError,
    Watches,
    predicates,
    register,
    timer,
)
from reconcilers._kube.cache import get_redis


def _count(obj: dict, what: str) -> int:
    key = f"probe:{what}:{obj['metadata']['uid']}"
    return int(get_redis().incr(key))


# A metric of the operator's own (level 4's metrics evidence), as a user's app declares one.
PROBE_RUNS = Counter("probe_runs", "Runs of the test Probe's reconcile")


@register
class ProbeReconciler(Reconciler):
    group = "test.operator.local"
    version = "v1"
    kind = "Probe"
    resync_period = 0
    metrics = ["probe_runs"]
    # Its own status writes must not trigger runs: history stays one run per change.
    predicates = [predicates.generation_changed]

    def reconcile(self, obj: dict, ctx):
        PROBE_RUNS.inc()
        spec = obj.get("spec") or {}
        if spec.get("sleep"):
            time.sleep(float(spec["sleep"]))
        if spec.get("spin"):
            end = time.monotonic() + float(spec["spin"])
            while time.monotonic() < end:
                pass
        if spec.get("permanent"):
            raise PermanentError("this probe can never work")
        if spec.get("failTimes") and _count(obj, "fails") <= int(spec["failTimes"]):
            raise RuntimeError(f"scripted failure for {obj['metadata']['name']}")
        if spec.get("temporaryDelay") and _count(obj, "temporary") == 1:
            raise TemporaryError("come back later", delay=float(spec["temporaryDelay"]))
        if spec.get("requeueAfter") and _count(obj, "requeue") == 1:
            return Result.after(float(spec["requeueAfter"]))
        note = getattr(settings, "PROBE_NOTE", "")  # a setting of the user's app
        ctx.patch_status({"value": spec.get("value"), **({"note": note} if note else {})})
        return None


@register
class FinalizingProbeReconciler(ProbeReconciler):
    """The same probe kind under another group, with finalisation."""

    group = "finalizing.operator.local"

    def finalize(self, obj: dict, ctx):
        _count(obj, "finalized")
        get_redis().rpush("probe:finalized", obj["metadata"]["name"])


@register
class DeadlineProbeReconciler(ProbeReconciler):
    """The probe with a 2-second run deadline. ``spec.stubborn`` swallows the interruption at
    the deadline and keeps going, as user code with a bare ``except`` would."""

    group = "deadline.operator.local"
    timeout = 2

    def reconcile(self, obj: dict, ctx):
        get_redis().rpush(f"probe:started:{obj['metadata']['name']}", time.time())
        if (obj.get("spec") or {}).get("lingerWrites") and _count(obj, "lingered") == 1:
            return _linger_then_write(obj, ctx)
        if (obj.get("spec") or {}).get("stubborn"):
            end = time.monotonic() + 60
            while time.monotonic() < end:
                try:
                    time.sleep(0.1)
                except BaseException:  # noqa: BLE001 - the point: it ignores the deadline
                    pass
        return super().reconcile(obj, ctx)


def _linger_then_write(obj: dict, ctx) -> None:
    """Ignore the deadline (as ``stubborn``) until the test says ``probe:wake:<name>`` - once
    this run was abandoned and its retry started - then try one write of each kind ``ctx``
    makes, none conditional on what this run read. What each met goes to
    ``probe:lingered:<name>``; the first refusal is raised, as a run that stops there would."""
    name, ns = obj["metadata"]["name"], obj["metadata"]["namespace"]
    end = time.monotonic() + 60
    while time.monotonic() < end:
        try:
            if get_redis().get(f"probe:wake:{name}"):
                break
            time.sleep(0.02)
        except BaseException:  # noqa: BLE001 - the point: it ignores the deadline
            pass
    stale = {"apiVersion": "v1", "kind": "ConfigMap", "data": {"from": "the abandoned run"}}
    writes = [
        ("apply", lambda: ctx.apply({**stale, "metadata": {"name": f"{name}-applied"}})),
        ("create", lambda: ctx.create_or_update({**stale,
                                                 "metadata": {"name": f"{name}-created"}})),
        ("post", lambda: ctx.request("POST", f"/api/v1/namespaces/{ns}/configmaps",
                                     {**stale, "metadata": {"name": f"{name}-posted"}})),
        ("patch", lambda: ctx.patch("v1", "ConfigMap", f"{name}-kept", {"data": stale["data"]})),
        ("delete", lambda: ctx.delete("v1", "ConfigMap", f"{name}-kept")),
        ("event", lambda: ctx.event("Warning", "Stale", "written by an abandoned run")),
    ]
    refused = []
    for what, write in writes:
        try:
            write()
            get_redis().rpush(f"probe:lingered:{name}", f"{what} written")
        except Exception as exc:  # noqa: BLE001 - each kind of write is tried
            refused.append(exc)
            get_redis().rpush(f"probe:lingered:{name}", f"{what} {type(exc).__name__}: {exc}")
    if refused:
        raise refused[0]


@register
class RateLimitedProbeReconciler(ProbeReconciler):
    """The probe under Celery's token bucket: at most two runs a second per worker."""

    group = "ratelimited.operator.local"
    rate_limit = "2/s"


@register
class SharedRateProbeReconciler(ProbeReconciler):
    """The probe under one bucket for every worker: at most two runs a second in all."""

    group = "sharedrate.operator.local"
    shared_rate_limit = "2/s"


@register
class TimedProbeReconciler(ProbeReconciler):
    """The probe with a durable timer every second: ``status.beats`` counts its firings,
    ``spec.timerFails`` makes the first N fail."""

    group = "timed.operator.local"

    @timer(interval=1)
    def beat(self, obj: dict, ctx):
        beats = _count(obj, "beats")
        get_redis().rpush(f"probe:beats:{obj['metadata']['name']}", time.time())
        if beats <= int((obj.get("spec") or {}).get("timerFails") or 0):
            raise RuntimeError("scripted timer failure")
        ctx.patch_status({"beats": beats})


def _config_users(cm: dict) -> list[str]:
    name = cm["metadata"]["name"]
    return [name[: -len("-config")]] if name.endswith("-config") else []


@register
class ConfiguredProbeReconciler(Reconciler):
    group = "configured.operator.local"
    version = "v1"
    kind = "Probe"
    resync_period = 0
    predicates = [predicates.generation_changed]
    watches = [Watches("v1", "ConfigMap", map=_config_users)]
    indexes = [Index("v1", "ConfigMap", "color",
                     lambda cm: [(cm.get("data") or {}).get("color")])]

    def reconcile(self, obj: dict, ctx):
        config = ctx.get("v1", "ConfigMap", f"{obj['metadata']['name']}-config")
        if config is None:
            ctx.patch_status({"value": None, "sameColor": 0})
            return None
        data = config.get("data") or {}
        same = ctx.list("v1", "ConfigMap", index=("color", data.get("color", "")))
        ctx.patch_status({"value": data.get("value"), "sameColor": len(same)})
        return None


CHILD = "test.operator.local/v1"


@register
class ParentProbeReconciler(Reconciler):
    group = "parent.operator.local"
    version = "v1"
    kind = "Probe"
    resync_period = 0
    predicates = [predicates.generation_changed]
    owns = [Owns(CHILD, "Probe")]  # every change of the child, its status writes included

    def reconcile(self, obj: dict, ctx):
        child = ctx.create_or_update({
            "apiVersion": CHILD, "kind": "Probe",
            "metadata": {"name": f"{obj['metadata']['name']}-child"},
            "spec": {"value": (obj.get("spec") or {}).get("value")}})
        get_redis().rpush(f"probe:parent-saw:{obj['metadata']['uid']}",
                          child["metadata"]["generation"])
        return None


@register
class StatusBlindParentProbeReconciler(ParentProbeReconciler):
    """The parent that does not read its child's status: only the child's spec changes (a
    new generation), creation and deletion reconcile it."""

    group = "statusblind.operator.local"
    owns = [Owns(CHILD, "Probe", predicates=[predicates.generation_changed])]
