"""What the api-server is told about this server: the admission configurations, each CRD's
conversion webhook, and the manifests that deploy them.

- ``hooked_resources()``: the classes with hooks - resource classes, then ``Webhook`` classes.
- ``configurations(...)``: the ``ValidatingWebhookConfiguration`` and
  ``MutatingWebhookConfiguration`` for every class that declares ``validate`` / ``default``,
  with the CA bundle, ``failurePolicy``, ``sideEffects: None``, ``timeoutSeconds`` and the
  selectors given; ``register`` server-side-applies them, ``unregister`` deletes them.
- ``cluster_manifests(...)``: the same configurations for ``deploy/webhook/``, with the
  server's read-only ServiceAccount and cert-manager injecting the CA.
- ``conversion_patches`` / ``conversion_configs`` / ``restore_conversions``: a converting
  CRD's webhook pointed at this server, and handed back to the one it called before.

The rule: every object is built from the classes' declared hooks, as plain dicts, and only
``register``, ``unregister`` and ``restore_conversions`` call the api-server (through
``kube``). Why: the command's ``--print``, ``webhook manifests`` and ``makecrds`` show exactly
what ``register`` would apply, and apply under one field manager is idempotent, so
registering again is always safe. Conversion is handed back rather than deleted because a
CRD's other versions, and the namespace controller deleting through them, need a webhook.
"""

from __future__ import annotations

import logging
from typing import Iterable, Sequence

import yaml

from reconcilers._authoring import rbac
from reconcilers._kube import kube
from reconcilers._webhooks import admission
from reconcilers.resources import default_registry
from reconcilers.resources.base import Resource
from reconcilers.resources.crd import INJECT_CA_FROM

log = logging.getLogger(__name__)

FIELD_MANAGER = "django-crd-operator"
ADMISSION = "/apis/admissionregistration.k8s.io/v1"


def hooked_resources() -> list:
    """The resource classes with hooks, then the ``Webhook`` classes (other kinds). A
    ``Webhook`` on a kind a resource class declares is an error: their hooks would be two
    webhooks of one name."""
    ours = [r for r in default_registry if admission.hooked(r)]
    others = [w for w in admission.webhook_registry if admission.hooked(w)]
    declared = {r._meta.crd_name for r in default_registry}
    twice = [w for w in others if w._meta.crd_name in declared]
    if twice:
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(
            f"{twice[0].__qualname__} hooks {twice[0]._meta.crd_name}, which a resource class "
            f"declares: give the resource class its default()/validate() instead")
    return ours + others


def configurations(resources: Iterable, *, ca_bundle: bytes | None,
                   url: str | None = None, service: tuple[str, str, int] | None = None,
                   failure_policy: str = "Fail", timeout: int = 5,
                   namespace_selector: dict | None = None,
                   name: str = "django-crd-operator",
                   inject_ca_from: str | None = None) -> list[dict]:
    """The two webhook configurations (an empty one is left out). Reach the server at
    ``url`` (``https://host:port``) or at a ``service`` ``(namespace, name, port)``; trust
    ``ca_bundle``, or leave it to cert-manager's CA injector (``inject_ca_from``: the serving
    Certificate's ``namespace/name``)."""
    if (url is None) == (service is None):
        raise ValueError("give exactly one of url and service")
    if (ca_bundle is None) == (inject_ca_from is None):
        raise ValueError("give exactly one of ca_bundle and inject_ca_from")
    out = []
    for hook, kind in ((admission.VALIDATE, "ValidatingWebhookConfiguration"),
                       (admission.MUTATE, "MutatingWebhookConfiguration")):
        webhooks = []
        for cls in resources:
            if hook not in admission.hooked(cls):
                continue
            meta = cls._meta
            client_config: dict = {} if ca_bundle is None else {"caBundle": _b64(ca_bundle)}
            if url is not None:
                client_config["url"] = f"{url.rstrip('/')}/{hook}"
            else:
                client_config["service"] = {"namespace": service[0], "name": service[1],
                                            "port": service[2], "path": f"/{hook}"}
            webhook = {
                "name": admission.webhook_name(cls, hook),
                "clientConfig": client_config,
                "rules": [{"apiGroups": [meta.group],
                           "apiVersions": admission.admitted_versions(cls),
                           "operations": admission.operations(cls, hook),
                           "resources": [meta.plural], "scope": meta.scope}],
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": failure_policy,
                "timeoutSeconds": timeout,
                "matchPolicy": "Equivalent",
            }
            if namespace_selector:
                webhook["namespaceSelector"] = namespace_selector
            if hook == admission.MUTATE:
                webhook["reinvocationPolicy"] = "IfNeeded"
            webhooks.append(webhook)
        if webhooks:
            metadata: dict = {"name": f"{name}-{hook}"}
            if inject_ca_from:
                metadata["annotations"] = {INJECT_CA_FROM: inject_ca_from}
            out.append({"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
                        "metadata": metadata, "webhooks": webhooks})
    return out


def cluster_manifests(resources: Sequence[type[Resource]], *,
                      namespace: str = "django-crd-operator",
                      service: str = "django-crd-operator-webhook", port: int = 443,
                      failure_policy: str = "Fail", timeout: int = 5,
                      name: str = "django-crd-operator") -> list[dict]:
    """What ``deploy/webhook/`` applies besides the server itself: the server's
    ServiceAccount with read-only rights on the hooked resources (a ``validate`` may look up
    others of its kind, nothing more), and the configurations pointing at its Service with
    their CA injected by cert-manager from the Certificate named like the Service."""
    account = f"{name}-webhook"
    rules = rbac.webhook_rules(resources)
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": account, "namespace": namespace}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": account}, "rules": rules},
        rbac.cluster_role_binding(account, account, namespace),
        *configurations(resources, ca_bundle=None, service=(namespace, service, port),
                        failure_policy=failure_policy, timeout=timeout, name=name,
                        inject_ca_from=f"{namespace}/{service}"),
    ]


def cluster_manifests_yaml(resources: Sequence[type[Resource]], **options) -> str:
    """``cluster_manifests`` as the file ``deploy/webhook/generated.yaml`` holds it."""
    return ("# generated: python manage.py webhook manifests - do not edit\n"
            + yaml.safe_dump_all(cluster_manifests(resources, **options), sort_keys=False))


def conversion_patches(resources: Iterable[type[Resource]], *, ca_bundle: bytes,
                       url: str | None = None,
                       service: tuple[str, str, int] | None = None) -> list[tuple[str, dict]]:
    """``(crd name, merge patch)`` pointing each converting CRD's webhook at this server with
    its CA bundle (the manifest names the Service from ``Meta.webhook_service``; ``url`` is for
    a server outside the cluster, as in the local stack)."""
    out = []
    for cls in resources:
        if admission.CONVERT not in admission.hooked(cls):
            continue
        config: dict = {"caBundle": _b64(ca_bundle)}
        if url is not None:
            config.update(url=f"{url.rstrip('/')}/convert", service=None)
        elif service is not None:
            config.update(url=None, service={"namespace": service[0], "name": service[1],
                                             "port": service[2], "path": "/convert"})
        out.append((cls._meta.crd_name, {"spec": {"conversion": {
            "strategy": "Webhook",
            "webhook": {"conversionReviewVersions": ["v1"], "clientConfig": config}}}}))
    return out


def register(api: kube.ApiClient, configs: Iterable[dict],
             conversions: Iterable[tuple[str, dict]] = ()) -> list[str]:
    """Server-side apply each configuration and point each converting CRD at the server (one
    not installed yet is reported, not an error); returns what was done."""
    names = []
    for crd, patch in conversions:
        try:
            kube.request(api, "PATCH", f"/apis/apiextensions.k8s.io/v1/"
                                       f"customresourcedefinitions/{crd}", patch,
                         content_type=kube.MERGE_PATCH)
        except kube.ApiError as exc:
            if not exc.gone:
                raise
            names.append(f"CustomResourceDefinition/{crd}: not installed - apply it "
                         f"(applycrds), then register again")
            continue
        names.append(f"CustomResourceDefinition/{crd} (conversion)")
    for config in configs:
        plural = config["kind"].lower() + "s"
        name = config["metadata"]["name"]
        kube.request(api, "PATCH", f"{ADMISSION}/{plural}/{name}", config,
                     query={"fieldManager": FIELD_MANAGER, "force": "true"},
                     content_type=kube.APPLY_PATCH)
        names.append(f"{config['kind']}/{name}")
    return names


def conversion_configs(api: kube.ApiClient, crds: Iterable[str]) -> dict[str, dict]:
    """Each installed CRD's live conversion ``clientConfig`` (``{}`` without a webhook) -
    what ``restore_conversions`` hands back to when this server stops."""
    out = {}
    for crd in crds:
        live = kube.get_or_none(api, kube.CRDS.path(None, crd))
        if live is not None:
            out[crd] = ((((live.get("spec") or {}).get("conversion") or {}).get("webhook")
                         or {}).get("clientConfig") or {})
    return out


def restore_conversions(api: kube.ApiClient, previous: dict[str, dict], url: str) -> list[str]:
    """Point each CRD whose conversion still calls ``url`` back at what it called before.

    A conversion webhook cannot simply be removed as the admission configurations are: the
    CRD's other versions, and the namespace controller deleting through them, need one. So a
    stopping server hands conversion back to the server registered before it (the local
    stack's, or the in-cluster Service the manifest names)."""
    restored = []
    ours = f"{url.rstrip('/')}/convert"
    for crd, config in conversion_configs(api, previous).items():
        if not previous[crd] or config.get("url") != ours or previous[crd].get("url") == ours:
            continue
        body = {"url": None, "service": None, "caBundle": None, **previous[crd]}
        patch = {"spec": {"conversion": {"webhook": {"clientConfig": body}}}}
        try:
            kube.request(api, "PATCH", kube.CRDS.path(None, crd), patch,
                         content_type=kube.MERGE_PATCH)
        except kube.ApiError as exc:  # the others are still handed back
            log.error("could not hand the conversion of %s back: %s", crd, exc.message)
            continue
        restored.append(crd)
    return restored


def unregister(api: kube.ApiClient, name: str = "django-crd-operator") -> None:
    for plural, hook in (("validatingwebhookconfigurations", admission.VALIDATE),
                         ("mutatingwebhookconfigurations", admission.MUTATE)):
        try:
            kube.request(api, "DELETE", f"{ADMISSION}/{plural}/{name}-{hook}")
        except kube.ApiError as exc:
            if not exc.gone:
                raise


def _b64(data: bytes) -> str:
    import base64

    return base64.b64encode(data).decode()
