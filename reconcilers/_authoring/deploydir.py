"""deploy/ as an OLM bundle takes it: the documents its kustomization lists, sorted.

The Deployments become the CSV's install strategy (the kustomization's image set, each Job's
containers run first as init containers, the Lease in the install namespace); the kinds OLM
installs from a bundle go in as they are; the ones the CSV replaces are left out with the
reason; any other kind is refused, naming its file.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from reconcilers._authoring import crds
from reconcilers._authoring.reconciler import Reconciler

# Kinds of deploy/ that go into manifests/ as they are (OLM applies them in the install
# namespace); the others are turned into the CSV's fields or left out, saying why.
PLAIN_KINDS = {"ConfigMap", "Service", "PodDisruptionBudget", "ServiceMonitor", "PrometheusRule"}
LEFT_OUT = {
    "Namespace": "OLM installs into the namespace of the OperatorGroup",
    "ServiceAccount": "OLM creates the CSV's ServiceAccounts",
    "ClusterRole": "the CSV's clusterPermissions replace it",
    "ClusterRoleBinding": "the CSV's clusterPermissions replace it",
    "Role": "the CSV's permissions replace it",
    "RoleBinding": "the CSV's permissions replace it",
    "NetworkPolicy": "not a kind every OLM release installs from a bundle; apply it yourself",
}


class BundleError(Exception):
    """The bundle cannot be made as asked; the message says why and what to do."""


@dataclass
class Deployed:
    """What the bundle takes from deploy/."""

    deployments: list[dict]  # the CSV's deployment specs
    plain: dict[str, dict] = field(default_factory=dict)  # manifests/ file name -> document
    left_out: list[str] = field(default_factory=list)  # "<file>: <kind> <name> (<why>)"
    bound: set[str] = field(default_factory=set)  # ServiceAccounts deploy/'s bindings name
    config_maps: list[tuple[str, dict]] = field(default_factory=list)


def read(deploy_dir: Path, image: str | None) -> Deployed:
    """The bundle's part of ``deploy_dir``, with ``image`` (or the kustomization's) set."""
    documents, images = _documents(deploy_dir)
    deployments, jobs, out = [], [], Deployed([])
    for source, doc in documents:
        kind = doc.get("kind")
        name = (doc.get("metadata") or {}).get("name", "")
        if kind == "Deployment":
            deployments.append(doc)
        elif kind == "Job":
            jobs.append(doc)
        elif kind in PLAIN_KINDS:
            plain = rename_images(copy.deepcopy(doc), images, image)
            plain.get("metadata", {}).pop("namespace", None)
            group_version = doc["apiVersion"].replace("/", "_")
            out.plain[f"{name}_{group_version}_{kind.lower()}.yaml"] = plain
        elif kind in LEFT_OUT:
            out.left_out.append(f"{source}: {kind} {name} ({LEFT_OUT[kind]})")
        else:
            raise BundleError(f"{source}: {kind} {name} cannot go in an OLM bundle; take it out of "
                              f"{deploy_dir / 'kustomization.yaml'} or apply it yourself")
        if kind in ("ClusterRoleBinding", "RoleBinding"):
            out.bound.update(s["name"] for s in doc.get("subjects") or []
                             if s.get("kind") == "ServiceAccount")
        if kind == "ConfigMap":
            out.config_maps.append((source, doc))
    if not deployments:
        raise BundleError(f"{deploy_dir / 'kustomization.yaml'} lists no Deployment: the CSV "
                          f"installs the operator's Deployments")
    out.deployments = _deployments(deployments, jobs, images, image)
    return out


def default_version(deploy_dir: Path) -> str:
    """deploy/'s image tag: the release's version (its kustomization keeps them equal)."""
    path = deploy_dir / "kustomization.yaml"
    if not path.is_file():
        raise BundleError(f"{path} does not exist: pass --deploy DIR (the kustomization whose "
                          f"Deployments the CSV installs)")
    images = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("images") or []
    tags = [str(i["newTag"]) for i in images if i.get("newTag")]
    if not tags:
        raise BundleError(f"{path} sets no image tag to take the version from: pass "
                          f"--bundle-version")
    return tags[0]


def _documents(deploy_dir: Path) -> tuple[list[tuple[str, dict]], dict[str, str]]:
    """Every document the kustomization lists, with its file, and its ``images`` as
    name -> the reference it sets."""
    kustomization = deploy_dir / "kustomization.yaml"
    if not kustomization.is_file():
        raise BundleError(f"{kustomization} does not exist: the bundle's Deployments and "
                          f"objects come from the manifests a kustomization lists (pass "
                          f"--deploy DIR)")
    spec = yaml.safe_load(kustomization.read_text(encoding="utf-8")) or {}
    images = {}
    for entry in spec.get("images") or []:
        ref = entry.get("newName") or entry["name"]
        if entry.get("digest"):
            ref += f"@{entry['digest']}"
        elif entry.get("newTag"):
            ref += f":{entry['newTag']}"
        images[entry["name"]] = ref
    documents = []
    for resource in spec.get("resources") or []:
        path = deploy_dir / resource
        if not path.is_file():
            raise BundleError(f"{kustomization} lists {resource}, which is not a file here "
                              f"(only files are read, not other kustomizations)")
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if doc:
                documents.append((str(path), doc))
    return documents, images


def rename_images(doc: Any, images: dict[str, str], image: str | None) -> Any:
    """Each container image the kustomization renames, set to ``image`` or its reference."""
    if isinstance(doc, dict):
        for key, value in doc.items():
            if key == "image" and isinstance(value, str) and value in images:
                doc[key] = image or images[value]
            else:
                rename_images(value, images, image)
    elif isinstance(doc, list):
        for item in doc:
            rename_images(item, images, image)
    return doc


def _deployments(deployments: list[dict], jobs: list[dict], images: dict[str, str],
                 image: str | None) -> list[dict]:
    """The CSV's deployment specs. The Lease's namespace is the pod's own (OLM's install
    namespace, whatever deploy/'s ConfigMap says), and each Job's containers run first, as
    init containers of the Deployment with the Job's ServiceAccount."""
    by_account = {}
    for job in jobs:
        pod = job["spec"]["template"]["spec"]
        by_account.setdefault(pod.get("serviceAccountName", "default"), []).extend(
            copy.deepcopy(pod.get("containers") or []))
    specs = []
    for doc in deployments:
        spec = rename_images(copy.deepcopy(doc["spec"]), images, image)
        pod = spec["template"]["spec"]
        account = pod.get("serviceAccountName", "default")
        if by_account.get(account):
            pod["initContainers"] = [*(pod.get("initContainers") or []),
                                     *rename_images(by_account.pop(account), images, image)]
        for container in pod.get("containers") or []:
            env = [e for e in container.get("env") or []
                   if e.get("name") != "RECONCILERS_LEASE_NAMESPACE"]
            env.append({"name": "RECONCILERS_LEASE_NAMESPACE",
                        "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}})
            container["env"] = env
        entry = {"name": doc["metadata"]["name"], "spec": spec}
        if (doc["metadata"].get("labels")):
            entry["label"] = dict(doc["metadata"]["labels"])
        specs.append(entry)
    if by_account:
        raise BundleError(f"a Job of deploy/ runs as {', '.join(sorted(by_account))}, which no "
                          f"Deployment uses: OLM installs no Job, so the bundle runs a Job's "
                          f"containers first in the Deployment that shares its ServiceAccount")
    return specs


def samples_off(classes: list[type[Reconciler]],
                config_maps: list[tuple[str, dict]]) -> list[str]:
    """A bundled sample's reconciler runs only where ``OPERATOR_SAMPLES`` is on, and the
    Deployments read it from deploy/'s ConfigMap."""
    samples = list(dict.fromkeys(cls.resource_name() for cls in classes if crds.is_sample(cls)))
    off = [source for source, doc in config_maps
           if str((doc.get("data") or {}).get("OPERATOR_SAMPLES", "0")).lower()
           in ("0", "false", "no", "off", "")]
    if not samples or not off:
        return []
    return [f"the CSV owns the CRDs of the samples ({', '.join(samples)}), but {off[0]} sets "
            f"OPERATOR_SAMPLES off: the installed operator would not reconcile them. Set it "
            f"to 1 there, or bundle your own apps"]
