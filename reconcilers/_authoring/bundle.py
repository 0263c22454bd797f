"""An OLM bundle of the registered reconcilers: the logic behind ``manage.py bundle``.

A bundle is what the Operator Lifecycle Manager installs and OperatorHub shows: ``manifests/``
(one ClusterServiceVersion, the CRDs, a few plain objects) and ``metadata/annotations.yaml``
(the package and its channels). Everything in it is derived, never hand-written:

- the CSV's install strategy is ``deploy/``'s Deployments, as its kustomization lists them, with
  the kustomization's image (or the one asked for); the rules are ``rbac``'s, granted to the
  ServiceAccounts ``deploy/``'s ClusterRoleBindings name, less the rights to install CRDs
  (OLM installs the bundle's);
- OLM installs no Job, so a Job of ``deploy/`` (the migrate Job) runs as an init container of
  the Deployment that shares its ServiceAccount (the admin's, which then waits for migrations);
- the CRDs are the reconcilers' resources' (``makecrds``'s), each owned by the CSV, with the
  examples in the app's ``examples/`` as ``alm-examples``;
- ``capabilities`` is the level the caller passes, which ``manage.py bundle`` takes from the
  evidence of real runs (``_run.evidence``); the evidenced level is kept beside it in an
  annotation, and a level claimed beyond the evidence carries the reason it is not evidenced.

The bundle offers the ``AllNamespaces`` install mode only: the operator watches what
``RECONCILERS_NAMESPACES`` says, not OLM's OperatorGroup, so a project watching some namespaces
is refused rather than bundled into something that watches others.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import yaml
from django.apps import apps

from reconcilers._authoring import crds, deploydir, rbac
from reconcilers._authoring.deploydir import BundleError
from reconcilers._authoring.reconciler import Reconciler
from reconcilers._base.capability_levels import LEVELS
from reconcilers.resources.base import Resource
from reconcilers.resources.crd import crd as crd_of

CSV_API = "operators.coreos.com/v1alpha1"
LEVEL_NAMES = {level: name for level, name, _summary, _criteria in LEVELS}
# Annotations of this project's own on the CSV: what the runs evidence, and why a claim
# beyond it is not evidenced (written only when the claim was forced).
EVIDENCED_ANNOTATION = "django-crd-operator.io/evidenced-level"
UNEVIDENCED_ANNOTATION = "django-crd-operator.io/unevidenced-claim"

SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
                    r"(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True)
class LevelClaim:
    """The capability level the CSV claims, what the runs evidence, and - when the claim goes
    beyond the evidence - why (the admin's reasons)."""

    level: int
    evidenced: int
    unevidenced: tuple[str, ...] = ()


@dataclass(frozen=True)
class Options:
    package: str
    version: str
    channels: tuple[str, ...]
    default_channel: str
    claim: LevelClaim
    image: str | None = None
    display_name: str | None = None
    description: str | None = None
    provider: str | None = None


@dataclass
class Bundle:
    """What is written: ``manifests/<file>`` documents, the annotations, what was left out
    of ``deploy/`` with the reason, and what would keep the installed operator from running
    the reconcilers the CSV names."""

    manifests: dict[str, dict] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    left_out: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def of_apps(classes: Iterable[type[Reconciler]],
            app_labels: Iterable[str]) -> list[type[Reconciler]]:
    """The reconcilers declared in these apps (all of ``classes`` when none is named)."""
    classes, labels = list(classes), list(app_labels)
    if not labels:
        return classes
    try:
        paths = [apps.get_app_config(label).name for label in labels]
    except LookupError as exc:
        raise BundleError(str(exc)) from exc
    chosen = [c for c in classes
              if any(c.__module__ == p or c.__module__.startswith(p + ".") for p in paths)]
    if not chosen:
        raise BundleError(f"no reconcilers are registered in {', '.join(labels)}")
    return chosen


def check_options(options: Options) -> None:
    """Refuse what OLM would refuse later, with the reason now."""
    if not DNS_LABEL.match(options.package) or len(options.package) > 63:
        raise BundleError(f"package {options.package!r} is not a DNS label (lower-case letters, "
                          f"digits and '-', at most 63 characters)")
    if not SEMVER.match(options.version):
        raise BundleError(f"version {options.version!r} is not a semantic version (like 1.2.3)")
    if not options.channels or any(not c or "," in c for c in options.channels):
        raise BundleError(f"channels {list(options.channels)!r}: give one or more non-empty "
                          f"names, without commas")
    if options.default_channel not in options.channels:
        raise BundleError(f"the default channel {options.default_channel!r} is not one of the "
                          f"channels {list(options.channels)}")
    if options.claim.level not in LEVEL_NAMES:
        raise BundleError(f"capability level {options.claim.level} is not one of 1-5 "
                          f"({', '.join(f'{n} {v}' for n, v in LEVEL_NAMES.items())})")


def build(classes: Iterable[type[Reconciler]], deploy_dir: Path, options: Options,
          watched_namespaces: Iterable[str] = ()) -> Bundle:
    """The bundle's documents for ``classes``, from the manifests in ``deploy_dir``."""
    classes = list(classes)
    if not classes:
        raise BundleError("no reconcilers are registered: a bundle installs an operator, and "
                          "this project has none. Add your app to INSTALLED_APPS (or "
                          "OPERATOR_APPS) and run this again")
    watched = list(watched_namespaces)
    if watched:
        raise BundleError(f"RECONCILERS_NAMESPACES is {','.join(watched)!r}: the bundle offers "
                          f"OLM's AllNamespaces install mode only (the operator watches what "
                          f"its settings say, not the OperatorGroup). Run this with the "
                          f"setting empty, for an operator watching every namespace")
    check_options(options)
    out = Bundle()
    crd_docs = [_crd(cls) for cls in classes]
    for doc in crd_docs:
        if doc is not None:
            spec = doc["spec"]
            out.manifests[f"{spec['group']}_{spec['names']['plural']}.yaml"] = doc
    found = deploydir.read(deploy_dir, options.image)
    for name, doc in found.plain.items():
        out.manifests[name] = doc
    out.left_out.extend(found.left_out)
    out.warnings.extend(deploydir.samples_off(classes, found.config_maps))
    specs = found.deployments
    accounts = sorted({d["spec"]["template"]["spec"].get("serviceAccountName", "default")
                       for d in specs})
    bound = found.bound
    if not bound & set(accounts):
        raise BundleError(f"no ClusterRoleBinding in {deploy_dir} binds a ServiceAccount of its "
                          f"Deployments ({', '.join(accounts)}): the bundle grants the "
                          f"operator's rules to the ServiceAccounts deploy/ binds them to")
    rules = [r for r in rbac.rules_for(classes) if not _installs_crds(r)]
    csv = _csv(options, classes, crd_docs, specs, rules,
               [a for a in accounts if a in bound], [a for a in accounts if a not in bound],
               _examples(classes, crd_docs), _image_of(specs))
    out.manifests[f"{options.package}.clusterserviceversion.yaml"] = csv
    out.annotations = annotations(options)
    return out


def annotations(options: Options) -> dict[str, str]:
    """``metadata/annotations.yaml``'s annotations (registry+v1, the package, its channels)."""
    return {
        "operators.operatorframework.io.bundle.mediatype.v1": "registry+v1",
        "operators.operatorframework.io.bundle.manifests.v1": "manifests/",
        "operators.operatorframework.io.bundle.metadata.v1": "metadata/",
        "operators.operatorframework.io.bundle.package.v1": options.package,
        "operators.operatorframework.io.bundle.channels.v1": ",".join(options.channels),
        "operators.operatorframework.io.bundle.channel.default.v1": options.default_channel,
    }


def write(bundle: Bundle, output: Path) -> list[Path]:
    """Write ``output/manifests`` and ``output/metadata``, replacing what they held: the two
    directories are the command's, and a file left from an earlier bundle (a CRD since
    removed) would be installed with this one."""
    if output.exists() and not output.is_dir():
        raise BundleError(f"{output} exists and is not a directory")
    written = []
    for sub, files in (("manifests", {n: d for n, d in bundle.manifests.items()}),
                       ("metadata", {"annotations.yaml": {"annotations": bundle.annotations}})):
        directory = output / sub
        directory.mkdir(parents=True, exist_ok=True)
        for stale in directory.iterdir():
            if stale.is_file() and stale.name not in files:
                stale.unlink()
        for name, doc in sorted(files.items()):
            path = directory / name
            path.write_text(yaml.safe_dump(doc, sort_keys=False, default_flow_style=False),
                            encoding="utf-8")
            written.append(path)
    return written


# --- the parts -----------------------------------------------------------------------------

def _crd(cls: type[Reconciler]) -> dict | None:
    """The CRD of ``cls``'s primary kind: from its resource class when it has one (the source
    ``makecrds`` writes from), else its app's ``crds/`` file; None for a kind with neither
    (a built-in kind, which no bundle owns)."""
    resource = cls.resource
    if isinstance(resource, type) and issubclass(resource, Resource):
        doc = crd_of(resource)
    else:
        path = crds.manifest_for(cls)
        if path is None:
            return None
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    if ((doc.get("spec") or {}).get("conversion") or {}).get("strategy") == "Webhook":
        raise BundleError(f"the CRD {doc['metadata']['name']} converts through a webhook: OLM "
                          f"serves conversion webhooks through the CSV's webhookdefinitions, "
                          f"which this bundle does not write. Install that CRD and its webhook "
                          f"server as deploy/webhook does")
    return doc


def _installs_crds(rule: dict) -> bool:
    """A rule ``rbac`` grants a watcher that installs CRDs itself: OLM installs the bundle's,
    so the operator is not given the right to."""
    return (rule.get("apiGroups") == ["apiextensions.k8s.io"]
            and rule.get("resources") == ["customresourcedefinitions"])


def _image_of(specs: list[dict]) -> str:
    return specs[0]["spec"]["template"]["spec"]["containers"][0]["image"]


def _examples(classes: list[type[Reconciler]], crd_docs: list[dict | None]) -> list[dict]:
    """The objects in each reconciler's app's ``examples/`` of a kind the bundle owns."""
    owned = {(f"{d['spec']['group']}/{v['name']}", d["spec"]["names"]["kind"])
             for d in crd_docs if d is not None for v in d["spec"]["versions"]}
    out, seen = [], set()
    for cls in classes:
        app = apps.get_containing_app_config(cls.__module__)
        directory = Path(app.path) / "examples" if app is not None else None
        if directory is None or not directory.is_dir() or directory in seen:
            continue
        seen.add(directory)
        for path in sorted(directory.glob("*.y*ml")):
            for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
                if doc and (doc.get("apiVersion"), doc.get("kind")) in owned:
                    out.append(doc)
    return out


def _owned(crd_docs: list[dict | None], classes: list[type[Reconciler]]) -> list[dict]:
    """The CSV's owned CRDs: each once, however many reconcilers share its kind."""
    owned, seen = [], set()
    for doc, cls in zip(crd_docs, classes):
        if doc is None or doc["metadata"]["name"] in seen:
            continue
        seen.add(doc["metadata"]["name"])
        spec = doc["spec"]
        for version in spec["versions"]:
            schema = (version.get("schema") or {}).get("openAPIV3Schema") or {}
            owned.append({
                "name": doc["metadata"]["name"],
                "version": version["name"],
                "kind": spec["names"]["kind"],
                "displayName": spec["names"]["kind"],
                "description": schema.get("description")
                or f"A {spec['names']['kind']}, reconciled by {cls.__name__}.",
            })
    return owned


def _csv(options: Options, classes: list[type[Reconciler]], crd_docs: list[dict | None],
         deployments: list[dict], rules: list[dict], operator_accounts: list[str],
         other_accounts: list[str], examples: list[dict], image: str) -> dict:
    claim = options.claim
    meta_annotations = {
        "capabilities": LEVEL_NAMES[claim.level],
        EVIDENCED_ANNOTATION: str(claim.evidenced),
        "alm-examples": json.dumps(examples, indent=2),
        "containerImage": image,
    }
    if claim.unevidenced:
        meta_annotations[UNEVIDENCED_ANNOTATION] = (
            f"{LEVEL_NAMES[claim.level]} claimed beyond the evidence: "
            + "; ".join(claim.unevidenced))
    kinds = sorted({d["spec"]["names"]["kind"] for d in crd_docs if d is not None})
    description = options.description or (
        f"Reconciles {', '.join(kinds) or 'built-in kinds'} "
        f"({', '.join(cls.name() for cls in classes)}). Needs PostgreSQL and Redis: create the "
        f"Secret `django-crd-operator` (SECRET_KEY, DATABASE_URL, REDIS_URL, "
        f"DJANGO_SUPERUSER_PASSWORD) in the install namespace first.")
    spec: dict[str, Any] = {
        "displayName": options.display_name or options.package,
        "description": description,
        "version": options.version,
        "maturity": options.default_channel,
        "keywords": ["django", "operator"],
        "installModes": [{"type": mode, "supported": mode == "AllNamespaces"}
                         for mode in ("OwnNamespace", "SingleNamespace", "MultiNamespace",
                                      "AllNamespaces")],
        "install": {"strategy": "deployment", "spec": {
            "deployments": deployments,
            "clusterPermissions": [{"serviceAccountName": account, "rules": rules}
                                   for account in operator_accounts],
        }},
        "customresourcedefinitions": {"owned": _owned(crd_docs, classes)},
    }
    if other_accounts:
        # An entry makes OLM create the ServiceAccount; it is given no rights.
        spec["install"]["spec"]["permissions"] = [
            {"serviceAccountName": account, "rules": []} for account in other_accounts]
    if options.provider:
        spec["provider"] = {"name": options.provider}
    return {
        "apiVersion": CSV_API,
        "kind": "ClusterServiceVersion",
        "metadata": {"name": f"{options.package}.v{options.version}",
                     "annotations": meta_annotations},
        "spec": spec,
    }
