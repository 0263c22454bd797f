"""The resources the fake cluster (``fake``) serves, and the api-server's rules for each:
whether it is namespaced, has a status subresource, keeps ``metadata.generation``, or is a
custom resource (served from a CustomResourceDefinition, whose versions it reads here).

Pure data. The built-in kinds are the ones operators commonly read and write; a kind not
listed is served once its CRD is given, and otherwise named in a ``NotModelled`` error.
"""

from __future__ import annotations

from dataclasses import dataclass

from reconcilers._base.vocab import GVR

@dataclass(frozen=True)
class Kind:
    """A resource the fake serves, and the api-server's rules for it."""

    gvr: GVR
    status: bool = False  # has a status subresource
    generation: bool = False  # keeps metadata.generation
    custom: bool = False  # served from a CustomResourceDefinition

    @property
    def qualified(self) -> str:
        """How the api-server's messages name it: ``foos.samplecontroller.k8s.io``."""
        return f"{self.gvr.plural}.{self.gvr.group}" if self.gvr.group else self.gvr.plural


def _builtin(api_version: str, kind: str, plural: str | None = None, namespaced: bool = True,
             status: bool = False, generation: bool = False) -> Kind:
    return Kind(GVR.of(api_version, kind, plural, namespaced), status, generation)


BUILTINS = [
    _builtin("v1", "Namespace", namespaced=False, status=True),
    _builtin("v1", "ConfigMap"), _builtin("v1", "Secret"), _builtin("v1", "ServiceAccount"),
    _builtin("v1", "Service", status=True), _builtin("v1", "Pod", status=True),
    _builtin("v1", "PersistentVolumeClaim", status=True), _builtin("v1", "Event"),
    _builtin("v1", "Endpoints", "endpoints"),
    _builtin("apps/v1", "Deployment", status=True, generation=True),
    _builtin("apps/v1", "StatefulSet", status=True, generation=True),
    _builtin("apps/v1", "ReplicaSet", status=True, generation=True),
    _builtin("apps/v1", "DaemonSet", status=True, generation=True),
    _builtin("batch/v1", "Job", status=True, generation=True),
    _builtin("batch/v1", "CronJob", status=True, generation=True),
    _builtin("networking.k8s.io/v1", "Ingress", status=True, generation=True),
    _builtin("policy/v1", "PodDisruptionBudget", status=True, generation=True),
    _builtin("events.k8s.io/v1", "Event"),
    _builtin("coordination.k8s.io/v1", "Lease"),
    _builtin("rbac.authorization.k8s.io/v1", "Role"),
    _builtin("rbac.authorization.k8s.io/v1", "RoleBinding"),
    _builtin("rbac.authorization.k8s.io/v1", "ClusterRole", namespaced=False),
    _builtin("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", namespaced=False),
    _builtin("apiextensions.k8s.io/v1", "CustomResourceDefinition", namespaced=False,
             status=True, generation=True),
]
NAMESPACES = BUILTINS[0]
CRDS = BUILTINS[-1]
# A delete answers with the object for these (and custom resources); a Status for the rest.
RETURNS_OBJECT = {"pods", "customresourcedefinitions"}


def kind_of_crd(crd: dict) -> list[Kind]:
    """The resources a CustomResourceDefinition serves, one per served version."""
    spec = crd["spec"]
    return [Kind(GVR(spec["group"], v["name"], spec["names"]["plural"], spec["names"]["kind"],
                     spec.get("scope", "Namespaced") == "Namespaced"),
                 status="status" in (v.get("subresources") or {}), generation=True,
                 custom=True)
            for v in spec.get("versions") or [] if v.get("served", True)]
