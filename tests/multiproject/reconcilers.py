"""A user's own reconciler of the sample's kind, beside the sample's: where the sample's
``FooReconciler`` makes each Foo's Deployment, ``FooLabeller`` makes each Foo a ConfigMap
``<foo>-labels`` naming it, and cleans up after itself through a finalizer of its own.

A Foo annotated ``multiproject/fail: "true"`` makes every labeller run fail (retried with
backoff), so a test sees one reconciler of the kind failing while the other converges.
"""

from __future__ import annotations

from reconcilers.api import Owns, Reconciler, register
from reconcilers._kube.cache import get_redis

FAIL = "multiproject/fail"
FINALIZED = "multiproject:finalized"  # Redis list: <namespace>/<name> of each Foo cleaned up


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
