"""The ReplicaSet controller of the first talk, as a reconciler.

Each run counts the Pods that match the PodSet's selector from the shared cache
(``ctx.list``), adopts the ones nobody controls, creates or deletes the difference and writes
``replicas``, ``readyReplicas`` and a ``Ready`` condition. Changes of its Pods reconcile it
(``Owns``); an orphan Pod reconciles the PodSets that select it (``Watches`` with a map
function that lists them). Expectations keep a run from acting on a count the cache has not
caught up with - its own creations still in flight - so a burst never over-creates.
"""

from __future__ import annotations

import secrets

from reconcilers.api import (
    Owns,
    Reconciler,
    Result,
    Watches,
    controller_of,
    events,
    predicates,
    register,
)

from .resources import PodSet

API_VERSION = f"{PodSet.group}/{PodSet.version}"


def is_ready(pod: dict) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def selects(selector: dict, pod: dict) -> bool:
    labels = pod["metadata"].get("labels") or {}
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def podsets_selecting(pod: dict, lister) -> list[str]:
    """An orphan Pod reconciles every PodSet of its namespace that selects it (a controlled
    Pod reconciles its owner through ``Owns``)."""
    if controller_of(pod) is not None or pod["metadata"].get("deletionTimestamp"):
        return []
    return [ps["metadata"]["name"]
            for ps in lister.list(API_VERSION, "PodSet", pod["metadata"].get("namespace"))
            if selects((ps.get("spec") or {}).get("selector") or {}, pod)]


def deletion_order(pod: dict) -> tuple:
    """Which Pods go first when scaling down, as the ReplicaSet controller picks: unscheduled
    before scheduled, not Ready before Ready, newer before older."""
    created = pod["metadata"].get("creationTimestamp") or ""
    return (bool(pod.get("spec", {}).get("nodeName")), is_ready(pod),
            "".join(chr(0x10FFFF - ord(c)) for c in created))


@register
class PodSetReconciler(Reconciler):
    resource = PodSet
    owns = [Owns("v1", "Pod")]
    watches = [Watches("v1", "Pod", map=podsets_selecting)]
    # Its own status writes need no run; Pod changes arrive through owns/watches.
    predicates = [predicates.generation_changed]
    capability_level = 1

    def reconcile(self, podset: PodSet, ctx):
        spec = podset.raw["spec"]
        selector, wanted = dict(spec["selector"]), int(spec.get("replicas", 1))
        if not selects(selector, {"metadata": {"labels": spec["template"]["labels"]}}):
            ctx.set_condition("Ready", False, "InvalidTemplate",
                              "the template's labels do not match the selector")
            ctx.patch_status({"replicas": 0, "readyReplicas": 0})
            return None
        pods = [p for p in ctx.list("v1", "Pod", labels=selector)
                if not p["metadata"].get("deletionTimestamp")]
        expectations = ctx.expectations("pods")
        if not expectations.met(p["metadata"]["name"] for p in pods):
            return Result.after(0.5)  # the cache has not seen the last run's writes yet

        uid = podset.metadata.uid
        mine = [p for p in pods if (controller_of(p) or {}).get("uid") == uid]
        for orphan in (p for p in pods if controller_of(p) is None):
            mine.append(ctx.adopt(orphan))
            ctx.event(events.NORMAL, "Adopted", f"adopted Pod {orphan['metadata']['name']}")

        diff = wanted - len(mine)
        if diff > 0:
            created = [self._create_pod(podset, ctx) for _ in range(diff)]
            expectations.expect(created=created)
            ctx.event(events.NORMAL, "SuccessfulCreate", f"created {diff} Pod(s)")
        elif diff < 0:
            victims = sorted(mine, key=deletion_order)[:-diff]
            for pod in victims:
                ctx.delete("v1", "Pod", pod["metadata"]["name"])
            expectations.expect(deleted=[p["metadata"]["name"] for p in victims])
            mine = [p for p in mine if p not in victims]
            ctx.event(events.NORMAL, "SuccessfulDelete", f"deleted {-diff} Pod(s)")

        ready = sum(is_ready(p) for p in mine)
        current = len(mine) + max(diff, 0)
        ctx.set_condition("Ready", ready == wanted == current,
                          "AllReady" if ready == wanted == current else "Scaling",
                          f"{ready} of {wanted} Pods ready")
        ctx.patch_status({"replicas": current, "readyReplicas": ready})
        return None

    @staticmethod
    def _create_pod(podset: PodSet, ctx) -> str:
        template = podset.raw["spec"]["template"]
        name = f"{podset.metadata.name}-{secrets.token_hex(3)}"
        ctx.create_or_update({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": dict(template["labels"])},
            "spec": {"containers": list(template["containers"])},
        })
        return name
