"""Serving and registering the admission webhooks of ``admission.py``.

- ``ensure_certificates(directory, hosts)``: a private CA and a serving certificate for the
  given IPs/DNS names (kept and reused while they cover the hosts and are valid for 30 days
  more); in a cluster, a Secret (or cert-manager) provides them instead.
- ``configurations(...)``: the ``ValidatingWebhookConfiguration`` and
  ``MutatingWebhookConfiguration`` for every resource that declares ``validate`` / ``default``,
  with the CA bundle, ``failurePolicy``, ``sideEffects: None``, ``timeoutSeconds`` and the
  selectors given; ``register`` server-side-applies them.
- ``respond(method, path, body)``: one request's answer - ``POST /validate``, ``/mutate``,
  ``/convert``, ``GET /healthz`` - which ``webhookserver`` serves over HTTPS. Every call is
  recorded (``WebhookCall``); a body that is not an AdmissionReview gets a 400 with the
  reason, never a crashed server.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import logging
import queue
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

import yaml
from django.db import close_old_connections, connection

from reconcilers._webhooks import admission
from reconcilers._kube import kube
from reconcilers._authoring import rbac
from reconcilers.models import WebhookCall
from reconcilers.resources import default_registry
from reconcilers.resources.crd import INJECT_CA_FROM
from reconcilers.resources.base import Resource

log = logging.getLogger(__name__)

MAX_BODY = 3 * 1024 * 1024  # the api-server's own request limit is 3 MiB
FIELD_MANAGER = "django-crd-operator"
ADMISSION = "/apis/admissionregistration.k8s.io/v1"


# --- certificates ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Certificates:
    ca: Path
    cert: Path
    key: Path

    @property
    def ca_bundle(self) -> bytes:
        return self.ca.read_bytes()


def ensure_certificates(directory: Path, hosts: Sequence[str]) -> Certificates:
    """A CA (``ca.crt``) and a serving pair (``tls.crt``, ``tls.key``) for ``hosts``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    directory.mkdir(parents=True, exist_ok=True)
    out = Certificates(directory / "ca.crt", directory / "tls.crt", directory / "tls.key")
    if out.cert.exists() and _covers(out.cert.read_bytes(), hosts):
        return out
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "django-crd-operator webhook CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=3650))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False,
                                       encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    names = [x509.IPAddress(ipaddress.ip_address(h)) if _is_ip(h) else x509.DNSName(h)
             for h in hosts]
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=365))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    out.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    out.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    out.key.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    out.key.chmod(0o600)
    return out


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _covers(pem: bytes, hosts: Sequence[str]) -> bool:
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(pem)
    if cert.not_valid_after_utc - datetime.datetime.now(datetime.timezone.utc) \
            < datetime.timedelta(days=30):
        return False
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    have = {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}
    have |= set(san.get_values_for_type(x509.DNSName))
    return set(hosts) <= have


# --- registration ------------------------------------------------------------------------------


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


# --- the server --------------------------------------------------------------------------------


HOOK_PATHS = {"/validate": admission.VALIDATE, "/mutate": admission.MUTATE,
              "/convert": admission.CONVERT}


def respond(method: str, path: str, body: bytes | None) -> tuple[int, dict, Callable | None]:
    """``(status, JSON body, what to run once it is sent)`` for one request."""
    if path == "/healthz" and method == "GET":
        return 200, {"status": "ok"}, None
    hook = HOOK_PATHS.get(path)
    if hook is None or method != "POST":
        return 404, {"error": f"no {method} {path} here; POST /validate, /mutate or "
                              "/convert"}, None
    if not body:
        return 400, {"error": "a JSON review body is required (at most "
                              f"{MAX_BODY} bytes)"}, None
    try:
        review = json.loads(body)
        if hook == admission.CONVERT:
            return 200, admission.convert(review), None
        outcome = admission.review(review, hook)
    except (ValueError, admission.BadReview) as exc:  # JSONDecodeError is a ValueError
        what = "ConversionReview" if hook == admission.CONVERT else "AdmissionReview"
        return 400, {"error": f"bad {what}: {exc}"}, None
    # The record is written after the api-server has its answer, not before.
    return 200, outcome.response, lambda: _record(outcome)


class _Recorder(threading.Thread):
    """Writes ``WebhookCall`` rows in batches from one thread with one database connection,
    off the path of the answer. A database outage loses records (logged), never admission."""

    def __init__(self) -> None:
        super().__init__(daemon=True, name="webhook-recorder")
        self.queue: queue.Queue[admission.Outcome] = queue.Queue(maxsize=10_000)

    def put(self, outcome: admission.Outcome) -> None:
        try:
            self.queue.put_nowait(outcome)
        except queue.Full:
            log.warning("webhook call records are backing up; dropping one")

    def run(self) -> None:
        while True:
            batch = [self.queue.get()]
            while len(batch) < 500:
                try:
                    batch.append(self.queue.get_nowait())
                except queue.Empty:
                    break
            try:
                close_old_connections()
                WebhookCall.objects.bulk_create([WebhookCall(
                    resource=o.resource, namespace=o.namespace, name=o.name,
                    operation=o.operation, hook=o.hook, allowed=o.allowed,
                    message=o.message[:4000], dry_run=o.dry_run, duration_ms=o.seconds * 1000)
                    for o in batch])
            except Exception as exc:
                log.warning("could not record %d webhook calls: %s", len(batch), exc)
                connection.close()


_recorder: _Recorder | None = None
_recorder_lock = threading.Lock()


def _record(outcome: admission.Outcome) -> None:
    global _recorder
    with _recorder_lock:
        if _recorder is None:
            _recorder = _Recorder()
            _recorder.start()
    _recorder.put(outcome)
