"""A Website as three dependent resources, in order (``reconcilers._authoring.dependents``):

    content (ConfigMap)  ->  server (Deployment, ready when available)  ->  service (Service)

The Deployment is applied once its ConfigMap exists; the Service only once the Deployment is
available, and only while ``spec.expose`` holds - set it false and the Service is deleted.
A change of any of them (the Deployment becoming available, say) reconciles the Website: the
workflow owns their kinds. Deleting a Website deletes them in reverse order (``finalize``):
the Service first, the Deployment once the Service is gone, the ConfigMap last - once the
Deployment and its Pods, which mount it, are gone (foreground deletion).
"""

from __future__ import annotations

import hashlib

from reconcilers.api import Dependent, Reconciler, Workflow, predicates, register

from .resources import Website


def content(site: Website) -> dict:
    return {"metadata": {"name": f"{site.metadata.name}-content"},
            "data": {"index.html": site.spec.content}}


def server(site: Website) -> dict:
    labels = {"app.kubernetes.io/name": "website", "app.kubernetes.io/instance":
              site.metadata.name}
    # A content change rolls the Pods: the template carries the content's hash.
    digest = hashlib.sha256(site.spec.content.encode()).hexdigest()[:16]
    pod = {"containers": [{
        "name": "nginx", "image": site.spec.image, "ports": [{"containerPort": 80}],
        "volumeMounts": [{"name": "content", "mountPath": "/usr/share/nginx/html"}]}],
        "volumes": [{"name": "content",
                     "configMap": {"name": f"{site.metadata.name}-content"}}]}
    selector = dict(site.raw["spec"].get("nodeSelector") or {})
    if selector:
        pod["nodeSelector"] = selector
    return {"metadata": {"name": site.metadata.name, "labels": labels},
            "spec": {"replicas": site.spec.replicas,
                     "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels,
                                               "annotations": {"content-sha256": digest}},
                                  "spec": pod}}}


def available(deployment: dict) -> bool:
    """The Deployment controller has seen this generation and every replica is available."""
    status, spec = deployment.get("status") or {}, deployment.get("spec") or {}
    return (status.get("observedGeneration", 0) >= deployment["metadata"].get("generation", 1)
            and status.get("updatedReplicas", 0) == spec.get("replicas", 1)
            and status.get("availableReplicas", 0) == spec.get("replicas", 1))


def service(site: Website) -> dict:
    labels = {"app.kubernetes.io/name": "website", "app.kubernetes.io/instance":
              site.metadata.name}
    return {"metadata": {"name": site.metadata.name},
            "spec": {"selector": labels, "ports": [{"port": 80, "targetPort": 80}]}}


@register
class WebsiteReconciler(Reconciler):
    resource = Website
    dependents = Workflow(
        Dependent("content", "v1", "ConfigMap", desired=content),
        # Foreground: its Pods, which mount the content, are gone before the content goes.
        Dependent("server", "apps/v1", "Deployment", desired=server, ready=available,
                  depends_on=["content"], propagation="Foreground"),
        Dependent("service", "v1", "Service", desired=service, depends_on=["server"],
                  when=lambda site: site.spec.expose),
    )
    # Its own status writes need no run; its children's changes arrive through owns.
    predicates = [predicates.generation_changed]
    capability_level = 1

    def reconcile(self, site: Website, ctx):
        progress = self.dependents.reconcile(site, ctx)
        deployment = progress.children.get("server") or {}
        site.status.available_replicas = (deployment.get("status") or {}).get(
            "availableReplicas", 0)
        site.status.url = (f"http://{site.metadata.name}.{site.metadata.namespace}.svc"
                           if progress.ready("service") else "")
        return progress.result

    def finalize(self, obj: dict, ctx):
        return self.dependents.cleanup(obj, ctx).result
