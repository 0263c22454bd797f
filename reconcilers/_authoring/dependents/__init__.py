"""Dependent resources: children declared with their desired state, a readiness check and an
order, applied and garbage-collected by the framework - java-operator-sdk's dependent
resources and workflows, in a reconciler's own ``reconcile``.

    class WebsiteReconciler(Reconciler):
        resource = Website
        dependents = Workflow(
            Dependent("content", "v1", "ConfigMap", desired=content_config_map),
            Dependent("server", "apps/v1", "Deployment", desired=deployment,
                      ready=available, depends_on=["content"]),
            Dependent("service", "v1", "Service", desired=service,
                      depends_on=["server"], when=lambda site: site.spec.expose),
        )

        def reconcile(self, site, ctx):
            progress = self.dependents.reconcile(site, ctx)
            return progress.result

        def finalize(self, obj, ctx):              # optional: ordered deletion
            return self.dependents.cleanup(obj, ctx).result

The contract of ``Workflow.reconcile``, one run at a time (level-based: each run starts again
from the current state, whatever the last run did):

- A dependent is applied (``ctx.apply``: server-side apply, this object as controller owner,
  labelled with ``LABEL: <dependent name>``) only once every dependent it ``depends_on`` is
  ready; until then it is ``waiting`` and left as it is. Ready means applied and ``ready(child)``
  true (no ``ready``: applied is ready).
- A dependent whose ``when(obj)`` is false is not wanted, nor is anything that depends on it.
  Its children are deleted in reverse order: a dependent is deleted only once every unwanted
  dependent that depends on it is gone - as the api-server says: a run with something to
  delete lists those kinds there (one LIST per kind, by label), not from the cache, which
  may not show yet a child the last run made. A child labelled for a dependent the workflow
  no longer declares is deleted too, as is a child of a dependent whose desired name changed.
- What moves the workflow on is the watch: the workflow's kinds are added to the reconciler's
  ``owns`` at class definition, so a child becoming ready, or going away, reconciles its owner.
  While anything is pending the result also asks for a run after ``recheck`` seconds, a safety
  net for a readiness the watch does not show (say one read from elsewhere).
- Each dependent gets a status condition ``<Name>Ready`` and the workflow a ``DependentsReady``
  summary: on a typed resource into its status (written with the run's status patch),
  otherwise in one status patch of their own (none when nothing changed).

``cleanup`` (from ``finalize``) deletes every dependent in reverse order, each only once those
depending on it are gone; its ``result`` keeps the finalizer until the last is gone. Without a
``finalize`` the Kubernetes garbage collector deletes the children through their owner
references when the object goes - all at once, in no order.

The graph is checked when the class is defined: a dependent named twice, an unknown name in
``depends_on`` or a cycle raise ``ValueError`` there, naming the cycle.

``declaration`` holds what a dependent is and the graph's order (no I/O); ``workflow`` the
run.
"""

from reconcilers._authoring.dependents.declaration import LABEL, Dependent, order
from reconcilers._authoring.dependents.workflow import (ABSENT, DELETING, PENDING, READY,
                                                        SUMMARY_CONDITION, WAITING, Progress,
                                                        Workflow)

__all__ = ["ABSENT", "DELETING", "Dependent", "LABEL", "PENDING", "Progress", "READY",
           "SUMMARY_CONDITION", "WAITING", "Workflow", "order"]
