"""The least-privilege ClusterRole for the registered reconcilers, derived from their code.

Exactly what the engine does on their behalf: list/watch/get and patch (finalizers) the primary
resource, patch its status subresource, create/get/list/watch/patch the owned resources
(``create_or_update``), create/patch Events, and hold the watcher Lease. CRD rules appear only
when the watcher installs CRDs (``RECONCILERS_APPLY_CRDS``, or the samples). No wildcards, and
nothing on Secrets unless a reconciler declares it in ``rbac_rules``.
"""

from __future__ import annotations

from typing import Iterable

from django.conf import settings as django_settings

from . import crds
from .conf import settings
from .spec import Reconciler
from .vocab import GVR

READ = ["get", "list", "watch"]


def _rule(groups: Iterable[str], resources: Iterable[str], verbs: Iterable[str],
          names: Iterable[str] = ()) -> dict:
    rule = {"apiGroups": sorted(set(groups)), "resources": sorted(set(resources)),
            "verbs": sorted(set(verbs))}
    if names:
        rule["resourceNames"] = sorted(set(names))
    return rule


def rules_for(classes: Iterable[type[Reconciler]]) -> list[dict]:
    """Merge per-resource verbs across reconcilers, then emit one rule per (group, verbs)."""
    verbs: dict[tuple[str, str], set[str]] = {}

    def allow(gvr: GVR, resource: str, *vs: str) -> None:
        verbs.setdefault((gvr.group, resource), set()).update(vs)

    crd_names: list[str] = []
    converting = False
    extra: list[dict] = []
    for cls in classes:
        primary = cls.primary()
        allow(primary, primary.plural, *READ, "patch")
        allow(primary, f"{primary.plural}/status", "get", "patch")
        for owned in cls.owns:
            gvr = owned.gvr()
            allow(gvr, gvr.plural, *READ, "create", "patch", "delete")
        for related in cls.watches:  # read only: watched, never written
            gvr = related.gvr()
            allow(gvr, gvr.plural, *READ)
        extra.extend(cls.rbac_rules)
        if crds.manifest_for(cls) is not None and (
                settings().apply_crds
                or (getattr(django_settings, "OPERATOR_SAMPLES", False)
                    and crds.is_sample(cls))):
            crd_names.append(cls.name())
            converting = converting or crds.converts(crds.manifest_for(cls))

    by_group: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for (group, resource), vs in sorted(verbs.items()):
        by_group.setdefault((group, tuple(sorted(vs))), []).append(resource)
    rules = [_rule([group], resources, vs) for (group, vs), resources in by_group.items()]
    rules.append(_rule([""], ["events"], ["create", "patch"]))
    lease = settings().lease_name
    # watch: a standby sees the Lease released at once (``leader``).
    rules.append(_rule(["coordination.k8s.io"], ["leases"], ["get", "update", "watch"],
                       [lease]))
    rules.append(_rule(["coordination.k8s.io"], ["leases"], ["create"]))
    if crd_names:
        rules.append(_rule(["apiextensions.k8s.io"], ["customresourcedefinitions"],
                           ["get", "patch"], crd_names))
        rules.append(_rule(["apiextensions.k8s.io"], ["customresourcedefinitions"],
                           ["create"]))
    if converting:  # a converting CRD is applied only while its webhook has an endpoint
        rules.append(_rule(["discovery.k8s.io"], ["endpointslices"], ["list"]))
    return rules + list(extra)


def webhook_rules(resources: Iterable) -> list[dict]:
    """The admission server's rights: read the hooked kinds (``request.lister``), nothing
    else - it answers the api-server and writes only to its own database."""
    by_group: dict[str, list[str]] = {}
    for resource in resources:
        meta = resource._meta
        by_group.setdefault(meta.group, []).append(meta.plural)
    return [_rule([group], plurals, ["get", "list"]) for group, plurals in sorted(by_group.items())]


def cluster_role(classes: Iterable[type[Reconciler]], name: str = "django-crd-operator") -> dict:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": name}, "rules": rules_for(classes)}


def cluster_role_binding(name: str, service_account: str, namespace: str) -> dict:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": service_account,
                          "namespace": namespace}]}
