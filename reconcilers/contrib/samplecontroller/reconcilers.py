"""kubernetes/sample-controller's ``syncHandler``, as a reconciler.

A ``Foo`` names a Deployment; the reconciler creates it (owned by the Foo), keeps its replicas
equal to ``spec.replicas``, refuses to adopt a same-named Deployment it does not own (Warning
event ``ErrResourceExists``, error outcome, retried with backoff), and mirrors the Deployment's
``availableReplicas`` into the Foo's status.
"""

from __future__ import annotations

from reconcilers.api import NotOwnedError, Owns, Reconciler, events, register

from .resources import Foo

SUCCESS_SYNCED = "Synced"
ERR_RESOURCE_EXISTS = "ErrResourceExists"
MESSAGE_RESOURCE_SYNCED = "Foo synced successfully"


def new_deployment(foo: Foo) -> dict:
    """The Deployment a Foo wants; ``create_or_update`` sets the owner reference."""
    labels = {"app": "nginx", "controller": foo.metadata.name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": foo.spec.deployment_name, "namespace": foo.metadata.namespace},
        "spec": {
            "replicas": foo.spec.replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "nginx", "image": "nginx:latest"}]},
            },
        },
    }


@register
class FooReconciler(Reconciler):
    resource = Foo
    owns = [Owns("apps/v1", "Deployment")]
    capability_level = 1

    def reconcile(self, foo: Foo, ctx):
        try:
            deployment = ctx.create_or_update(new_deployment(foo))
        except NotOwnedError as exc:
            ctx.event(events.WARNING, ERR_RESOURCE_EXISTS, str(exc))
            raise
        foo.status.available_replicas = (deployment.get("status") or {}).get(
            "availableReplicas", 0)
        ctx.event(events.NORMAL, SUCCESS_SYNCED, MESSAGE_RESOURCE_SYNCED)
