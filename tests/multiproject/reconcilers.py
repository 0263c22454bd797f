"""A user's own reconciler of the sample's kind, beside the sample's: where the sample's
``FooReconciler`` makes each Foo's Deployment, ``FooLabeller`` makes each Foo a ConfigMap
``<foo>-labels`` naming it, and cleans up after itself through a finalizer of its own.

A Foo annotated ``multiproject/fail: "true"`` makes every labeller run fail (retried with
backoff), so a test sees one reconciler of the kind failing while the other converges.

``ProbeJanitor`` is a second reconciler of the test app's finalizing Probe kind: its cleanup
waits (polling) until a test lets it finish (``MAY_FINISH`` + ``<namespace>/<name>`` in
Redis), so a test sees the object held by it alone once the kind's own cleanup is done.
"""

from __future__ import annotations

from reconcilers.api import Owns, Reconciler, Result, register
from reconcilers._kube.cache import get_redis
from tests.multiproject.markers import FAIL, FINALIZED, MAY_FINISH


@register
class FooLabeller(Reconciler):
    name = "foo-labeller"
    group, version, kind = "samplecontroller.k8s.io", "v1alpha1", "Foo"
    owns = [Owns("v1", "ConfigMap")]

    def reconcile(self, obj: dict, ctx):
        meta = obj["metadata"]
        if (meta.get("annotations") or {}).get(FAIL) == "true":
            raise RuntimeError(f"the labeller is told to fail {meta['name']}")
        ctx.create_or_update({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": f"{meta['name']}-labels", "namespace": meta["namespace"]},
            "data": {"foo": meta["name"],
                     "deployment": (obj.get("spec") or {}).get("deploymentName", "")},
        })

    def finalize(self, obj: dict, ctx):
        meta = obj["metadata"]
        get_redis().rpush(FINALIZED, f"{meta['namespace']}/{meta['name']}")


@register
class ProbeJanitor(Reconciler):
    name = "probe-janitor"
    group, version, kind = "finalizing.operator.local", "v1", "Probe"

    def reconcile(self, obj: dict, ctx):
        return None

    def finalize(self, obj: dict, ctx):
        meta = obj["metadata"]
        path = f"{meta['namespace']}/{meta['name']}"
        if not get_redis().exists(MAY_FINISH + path):
            return Result.after(0.2)  # still cleaning up: the object stays held
        get_redis().rpush(FINALIZED, f"janitor:{path}")
        return None
