"""Installing the CRDs that registered reconcilers need, when the watcher starts.

A reconciler's CRD manifest is ``<app>/crds/<plural>.<group>.yaml`` in the app that defines
it (``manage.py makecrds`` writes it). The watcher server-side-applies it when
``RECONCILERS_APPLY_CRDS`` is on, and always for the bundled samples when ``OPERATOR_SAMPLES=1``. Production clusters usually install CRDs
through their own pipeline, so this is off by default there.

A CRD that converts through a webhook is applied only while that webhook has a server: the
api-server converts every read of another version through it, so with nobody serving it no
list of the kind answers - ``kubectl get``, the garbage collector and the namespace controller
included, which leaves every namespace holding such an object ``Terminating``. The watcher then
says why it left the CRD alone and goes on; run the webhook server (or install the CRD through
your own pipeline once it runs) and start the watcher again.
"""

from __future__ import annotations

import logging
import socket
import sys
from pathlib import Path
from typing import Any, Iterable, TextIO
from urllib.parse import urlsplit

import yaml
from django.apps import apps
from django.conf import settings as django_settings

from reconcilers._kube import kube
from reconcilers._base.conf import settings
from reconcilers.resources.apply import apply_crds
from reconcilers._authoring.reconciler import Reconciler

log = logging.getLogger(__name__)


def manifest_for(cls: type[Reconciler]) -> Path | None:
    app = apps.get_containing_app_config(cls.__module__)
    if app is None:
        return None
    path = Path(app.path) / "crds" / f"{cls.resource_name()}.yaml"
    return path if path.exists() else None


def is_sample(cls: type[Reconciler]) -> bool:
    return cls.__module__.startswith("reconcilers.contrib.")


def apply_manifest(api, path: Path, timeout: float = 60) -> str:
    """Server-side apply one CRD manifest and wait until it is Established."""
    ((_, outcome),) = apply_crds([yaml.safe_load(path.read_text())], api, timeout=timeout)
    return outcome


def converts(path: Path) -> bool:
    """Whether the manifest at ``path`` converts through a webhook."""
    spec = yaml.safe_load(path.read_text()).get("spec") or {}
    return (spec.get("conversion") or {}).get("strategy") == "Webhook"


def conversion_webhook(manifest: dict[str, Any], live: dict[str, Any] | None) -> dict | None:
    """The ``clientConfig`` a CRD converts through once applied: the live CRD's registration
    where applying keeps it (``resources.apply``), else the manifest's; ``None`` when the
    manifest converts through nothing."""
    wanted = (manifest.get("spec") or {}).get("conversion") or {}
    if wanted.get("strategy") != "Webhook":
        return None
    registered = ((live or {}).get("spec") or {}).get("conversion") or {}
    if registered.get("strategy") == "Webhook":
        have = (registered.get("webhook") or {}).get("clientConfig") or {}
        if "url" in have or "caBundle" in have:
            return have
    return (wanted.get("webhook") or {}).get("clientConfig") or {}


def unserved(api, client_config: dict, timeout: float = 2.0) -> str | None:
    """Why nobody serves this webhook (``None`` when something does): a URL must accept a
    connection, a Service must have a ready endpoint."""
    if "url" in client_config:
        url = urlsplit(client_config["url"])
        try:
            socket.create_connection((url.hostname, url.port or 443), timeout=timeout).close()
        except OSError as exc:
            return f"nothing accepts connections at {client_config['url']} ({exc})"
        return None
    service = client_config.get("service") or {}
    where = f"service {service.get('namespace')}/{service.get('name')}"
    try:
        slices = kube.request(api, "GET", f"/apis/discovery.k8s.io/v1/namespaces/"
                              f"{service.get('namespace')}/endpointslices",
                              query={"labelSelector":
                                     f"kubernetes.io/service-name={service.get('name')}"})
    except kube.ApiError as exc:
        return f"the endpoints of {where} could not be read ({exc.status} {exc.reason})"
    for piece in slices.get("items") or []:
        for endpoint in piece.get("endpoints") or []:
            if (endpoint.get("conditions") or {}).get("ready") is not False:
                return None
    return f"{where} has no ready endpoint"


def apply_if_served(api, manifest: dict[str, Any], timeout: float = 60) -> str:
    """Server-side apply one CRD manifest and wait until it is Established - unless it
    converts through a webhook nobody serves: then it is left alone and the answer says why."""
    live = kube.get_or_none(api, kube.CRDS.path(None, manifest["metadata"]["name"]))
    webhook = conversion_webhook(manifest, live)
    reason = unserved(api, webhook) if webhook is not None else None
    if reason is not None:
        return (f"not applied - it converts through a webhook and {reason}; a converting "
                f"CRD without its server blocks every list of the kind and every namespace "
                f"deletion. Run the webhook server, then start the watcher again")
    ((_, outcome),) = apply_crds([manifest], api, timeout=timeout)
    return outcome


def sync_registered(classes: Iterable[type[Reconciler]], out: TextIO = sys.stdout) -> None:
    """Apply the manifests of ``classes`` the settings allow (idempotent: server-side apply),
    leaving out any converting CRD whose webhook nobody serves. One kind has one CRD, applied
    once however many of its reconcilers there are."""
    apply_all = settings().apply_crds
    samples = getattr(django_settings, "OPERATOR_SAMPLES", False)
    api = kube.api_client()
    applied: set[Path] = set()
    for cls in classes:
        path = manifest_for(cls)
        if path is not None and path not in applied and (apply_all or (samples and is_sample(cls))):
            applied.add(path)
            outcome = apply_if_served(api, yaml.safe_load(path.read_text()))
            out.write(f"CRD {cls.resource_name()}: {outcome}\n")
            if outcome.startswith("not applied"):
                log.error("CRD %s: %s", cls.resource_name(), outcome)
