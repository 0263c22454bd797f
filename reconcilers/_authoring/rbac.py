"""The least-privilege RBAC for the registered reconcilers, derived from their code.

Exactly what the engine does on their behalf: list/watch/get and patch (finalizers) the primary
resource, patch its status subresource, update its ``finalizers`` subresource (the api-server's
``OwnerReferencesPermissionEnforcement`` asks for it before a child may point at its owner with
``blockOwnerDeletion``, as kubebuilder grants), create/get/list/watch/patch/delete the owned
resources (``create_or_update``), create/patch Events, and hold the watcher Lease. CRD rules
appear only when the watcher installs CRDs (``RECONCILERS_APPLY_CRDS``, or the samples), and
``create`` on TokenReviews and SubjectAccessReviews only while ``/metrics`` asks the api-server
who may read it (``RECONCILERS_METRICS_SECURE``, ``_kube.reviews``). No wildcards, and nothing
on Secrets unless a reconciler declares it in ``rbac_rules``.

Watching every namespace, all of it goes in one ClusterRole. Watching some
(``RECONCILERS_NAMESPACES``), ``manifests`` gives a Role per namespace - in each watched one
what the reconcilers do there, in the Lease's namespace the Lease - and a ClusterRole only for
what is cluster-scoped (CRDs, cluster-scoped kinds), none when nothing is: ``Owns(Deployment)``
then means deleting Deployments in the watched namespaces, not in every one.
"""

from __future__ import annotations

import copy
from typing import Iterable, Sequence

import yaml
from django.conf import settings as django_settings

from reconcilers._authoring import crds
from reconcilers._kube import kube
from reconcilers._base.conf import settings
from reconcilers._authoring.reconciler import Reconciler
from reconcilers._base.vocab import GVR

READ = ["get", "list", "watch"]
RBAC = "rbac.authorization.k8s.io/v1"

# Where a rule applies: every watched namespace, the cluster, or a namespace by name (no
# namespace name can start with "<").
EACH = "<each watched namespace>"
CLUSTER = "<cluster>"

# Built-in cluster-scoped resources: a ``rbac_rules`` entry on one of these (or on
# ``nonResourceURLs``) belongs in the ClusterRole, any other in each watched namespace's Role.
CLUSTER_SCOPED = frozenset({
    "apiservices", "certificatesigningrequests", "clusterrolebindings", "clusterroles",
    "componentstatuses", "csidrivers", "csinodes", "customresourcedefinitions", "flowschemas",
    "ingressclasses", "mutatingwebhookconfigurations", "namespaces", "nodes",
    "persistentvolumes", "priorityclasses", "prioritylevelconfigurations", "runtimeclasses",
    "selfsubjectaccessreviews", "selfsubjectreviews", "selfsubjectrulesreviews",
    "storageclasses", "subjectaccessreviews", "tokenreviews",
    "validatingadmissionpolicies", "validatingadmissionpolicybindings",
    "validatingwebhookconfigurations", "volumeattachments"})


def _rule(groups: Iterable[str], resources: Iterable[str], verbs: Iterable[str],
          names: Iterable[str] = ()) -> dict:
    rule = {"apiGroups": sorted(set(groups)), "resources": sorted(set(resources)),
            "verbs": sorted(set(verbs))}
    if names:
        rule["resourceNames"] = sorted(set(names))
    return rule


def _events() -> dict:
    """``events.record`` creates an Event, then patches its count on repeats."""
    return _rule([kube.EVENTS.group], [kube.EVENTS.plural], ["create", "patch"])


def _installs_crd(cls: type[Reconciler]) -> bool:
    return crds.manifest_for(cls) is not None and (
        settings().apply_crds
        or (getattr(django_settings, "OPERATOR_SAMPLES", False) and crds.is_sample(cls)))


def _webhook_service(cls: type[Reconciler]) -> dict | None:
    """The Service a CRD converts through (``crds.unserved`` lists its EndpointSlices before
    applying the CRD), or None: no conversion webhook, or one at a URL."""
    manifest = yaml.safe_load(crds.manifest_for(cls).read_text())
    webhook = crds.conversion_webhook(manifest, None)
    return None if webhook is None or "url" in webhook else webhook.get("service") or {}


def _split(rule: dict) -> list[tuple[str, dict]]:
    """A declared rule by where it applies: on cluster-scoped resources (or URLs) in the
    ClusterRole, on the others in each watched namespace."""
    if "nonResourceURLs" in rule:
        return [(CLUSTER, rule)]
    resources = rule.get("resources") or []
    cluster = [r for r in resources if r.split("/")[0] in CLUSTER_SCOPED]
    local = [r for r in resources if r not in cluster]
    return [(where, {**rule, "resources": part})
            for where, part in ((EACH, local), (CLUSTER, cluster)) if part]


def grants(classes: Iterable[type[Reconciler]],
           everywhere: bool = False) -> dict[str, list[dict]]:
    """Every rule the reconcilers need, by where it applies: ``EACH`` watched namespace,
    the ``CLUSTER``, or one namespace by name (the Lease's, the conversion webhook's, and
    ``default`` for the Events of cluster-scoped objects). ``everywhere``: all of them at
    cluster scope, merged, for one ClusterRole."""
    verbs: dict[tuple[str, str, str], set[str]] = {}

    def place(where: str) -> str:
        return CLUSTER if everywhere else where

    def allow(gvr: GVR, resource: str, *vs: str) -> None:
        where = place(EACH if gvr.namespaced else CLUSTER)
        verbs.setdefault((where, gvr.group, resource), set()).update(vs)

    found: list[tuple[str, dict]] = []
    extra: list[tuple[str, dict]] = []
    crd_names: list[str] = []
    for cls in classes:
        primary = cls.primary()
        allow(primary, primary.plural, *READ, "patch")
        allow(primary, f"{primary.plural}/status", "get", "patch")
        allow(primary, f"{primary.plural}/finalizers", "update")
        if not primary.namespaced:  # ``events.record`` files them in ``default``
            found.append((place("default"), _events()))
        for owned in cls.owns:
            gvr = owned.gvr()
            allow(gvr, gvr.plural, *READ, "create", "patch", "delete")
        for related in cls.watches:  # read only: watched, never written
            gvr = related.gvr()
            allow(gvr, gvr.plural, *READ)
        for declared in cls.rbac_rules:
            extra.extend([(CLUSTER, declared)] if everywhere else _split(declared))
        if _installs_crd(cls):
            crd_names.append(cls.resource_name())
            service = _webhook_service(cls)
            if service is not None:
                # A converting CRD is applied only while its webhook has an endpoint.
                found.append((place(service.get("namespace") or CLUSTER),
                              _rule(["discovery.k8s.io"], ["endpointslices"], ["list"])))

    by_group: dict[tuple[str, str, tuple[str, ...]], list[str]] = {}
    for (where, group, resource), vs in sorted(verbs.items()):
        by_group.setdefault((where, group, tuple(sorted(vs))), []).append(resource)
    rules = [(where, _rule([group], resources, vs))
             for (where, group, vs), resources in by_group.items()]
    rules.append((place(EACH), _events()))
    rules.extend(found)
    conf = settings()
    # watch: a standby sees the Lease released at once (``leader``).
    leases = kube.LEASES
    rules.append((place(conf.lease_namespace), _rule(
        [leases.group], [leases.plural], ["get", "update", "watch"], [conf.lease_name])))
    rules.append((place(conf.lease_namespace), _rule([leases.group], [leases.plural], ["create"])))
    if conf.metrics_secure:  # each scrape's token reviewed (``_kube.reviews``)
        rules.append((CLUSTER, _rule(["authentication.k8s.io"], ["tokenreviews"], ["create"])))
        rules.append((CLUSTER, _rule(["authorization.k8s.io"], ["subjectaccessreviews"],
                                     ["create"])))
    if crd_names:
        rules.append((place(CLUSTER), _rule(["apiextensions.k8s.io"],
                                            ["customresourcedefinitions"], ["get", "patch"],
                                            crd_names)))
        rules.append((place(CLUSTER), _rule(["apiextensions.k8s.io"],
                                            ["customresourcedefinitions"], ["create"])))
    out: dict[str, list[dict]] = {}
    for where, rule in rules + extra:
        if rule not in out.setdefault(where, []):
            out[where].append(rule)
    return out


def rules_for(classes: Iterable[type[Reconciler]]) -> list[dict]:
    """The rules of one ClusterRole, for an operator watching every namespace."""
    return grants(classes, everywhere=True).get(CLUSTER, [])


def webhook_rules(resources: Iterable) -> list[dict]:
    """The admission server's rights: read the hooked kinds (``request.lister``), nothing
    else - it answers the api-server and writes only to its own database."""
    by_group: dict[str, list[str]] = {}
    for resource in resources:
        meta = resource._meta
        by_group.setdefault(meta.group, []).append(meta.plural)
    return [_rule([group], plurals, ["get", "list"]) for group, plurals in sorted(by_group.items())]


def cluster_role(classes: Iterable[type[Reconciler]], name: str = "django-crd-operator",
                 rules: list[dict] | None = None) -> dict:
    return {"apiVersion": RBAC, "kind": "ClusterRole", "metadata": {"name": name},
            "rules": rules_for(classes) if rules is None else rules}


def cluster_role_binding(name: str, service_account: str, namespace: str) -> dict:
    return {"apiVersion": RBAC, "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": service_account,
                          "namespace": namespace}]}


def role(name: str, namespace: str, rules: list[dict]) -> dict:
    return {"apiVersion": RBAC, "kind": "Role",
            "metadata": {"name": name, "namespace": namespace}, "rules": rules}


def role_binding(name: str, namespace: str, service_account: str,
                 service_account_namespace: str) -> dict:
    return {"apiVersion": RBAC, "kind": "RoleBinding",
            "metadata": {"name": name, "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": service_account,
                          "namespace": service_account_namespace}]}


def manifests(classes: Iterable[type[Reconciler]], name: str = "django-crd-operator",
              service_account: str | None = None, namespace: str = "django-crd-operator",
              namespaces: Sequence[str] = ()) -> list[dict]:
    """What ``manage.py rbac`` prints: the roles, and their bindings to ``service_account``
    (in ``namespace``) when one is named. Without ``namespaces`` one ClusterRole; with them a
    Role per namespace and a ClusterRole only for what is cluster-scoped."""
    classes = list(classes)
    if not namespaces:
        docs = [cluster_role(classes, name)]
        if service_account:
            docs.append(cluster_role_binding(name, service_account, namespace))
        return docs
    needs = grants(classes)
    docs = []
    if needs.get(CLUSTER):
        docs.append(cluster_role(classes, name, needs[CLUSTER]))
        if service_account:
            docs.append(cluster_role_binding(name, service_account, namespace))
    fixed = {where for where in needs if where not in (EACH, CLUSTER)}
    for ns in sorted(set(namespaces) | fixed):
        rules = list(needs.get(EACH, [])) if ns in namespaces else []
        rules += [r for r in needs.get(ns, []) if r not in rules]
        docs.append(role(name, ns, copy.deepcopy(rules)))  # no rule shared between documents
        if service_account:
            docs.append(role_binding(name, ns, service_account, namespace))
    return docs
