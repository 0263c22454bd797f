"""Serving and registering the admission webhooks of ``admission.py``.

- ``ensure_certificates(directory, hosts)``: a private CA and a serving certificate for the
  given IPs/DNS names (kept and reused while they cover the hosts and are valid for 30 days
  more); in a cluster, a Secret (or cert-manager) provides them instead.
- ``configurations(...)``: the ``ValidatingWebhookConfiguration`` and
  ``MutatingWebhookConfiguration`` for every resource that declares ``validate`` / ``default``,
  with the CA bundle, ``failurePolicy``, ``sideEffects: None``, ``timeoutSeconds`` and the
  selectors given; ``register`` server-side-applies them.
- ``serve(...)``: HTTPS on its own port, one thread per request, ``POST /validate``,
  ``POST /mutate`` and ``GET /healthz``. Every call is recorded (``WebhookCall``); a body that
  is not an AdmissionReview gets a 400 with the reason, never a crashed server.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import logging
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import Iterable, Sequence
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from django.db import close_old_connections, connection

from . import admission, kube
from .models import WebhookCall
from .resources import default_registry
from .resources.base import Resource

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


def hooked_resources() -> list[type[Resource]]:
    return [r for r in default_registry if admission.hooked(r)]


def configurations(resources: Iterable[type[Resource]], *, ca_bundle: bytes,
                   url: str | None = None, service: tuple[str, str, int] | None = None,
                   failure_policy: str = "Fail", timeout: int = 5,
                   namespace_selector: dict | None = None,
                   name: str = "django-crd-operator") -> list[dict]:
    """The two webhook configurations (an empty one is left out). Reach the server at
    ``url`` (``https://host:port``) or at a ``service`` ``(namespace, name, port)``."""
    if (url is None) == (service is None):
        raise ValueError("give exactly one of url and service")
    out = []
    for hook, kind in ((admission.VALIDATE, "ValidatingWebhookConfiguration"),
                       (admission.MUTATE, "MutatingWebhookConfiguration")):
        webhooks = []
        for cls in resources:
            if hook not in admission.hooked(cls):
                continue
            meta = cls._meta
            client_config: dict = {"caBundle": _b64(ca_bundle)}
            if url is not None:
                client_config["url"] = f"{url.rstrip('/')}/{hook}"
            else:
                client_config["service"] = {"namespace": service[0], "name": service[1],
                                            "port": service[2], "path": f"/{hook}"}
            webhook = {
                "name": f"{hook}.{meta.crd_name}",
                "clientConfig": client_config,
                "rules": [{"apiGroups": [meta.group],
                           "apiVersions": [v.name for v in meta.versions if v.served],
                           "operations": ["CREATE", "UPDATE"], "resources": [meta.plural],
                           "scope": meta.scope}],
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
            out.append({"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
                        "metadata": {"name": f"{name}-{hook}"}, "webhooks": webhooks})
    return out


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
            config["service"] = {"namespace": service[0], "name": service[1],
                                 "port": service[2], "path": "/convert"}
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


def application(environ, start_response):
    """The webhook endpoints as a WSGI application (any WSGI server with TLS can host it)."""
    path, method = environ.get("PATH_INFO", ""), environ.get("REQUEST_METHOD", "")
    if path == "/healthz" and method == "GET":
        return _answer(start_response, 200, {"status": "ok"})
    hook = {"/validate": admission.VALIDATE, "/mutate": admission.MUTATE,
            "/convert": admission.CONVERT}.get(path)
    if hook is None or method != "POST":
        return _answer(start_response, 404, {"error": f"no {method} {path} here; "
                                                      "POST /validate, /mutate or /convert"})
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = -1
    if not 0 < length <= MAX_BODY:
        return _answer(start_response, 400, {"error": "a JSON AdmissionReview body is required "
                                                      f"(at most {MAX_BODY} bytes)"})
    try:
        body = json.loads(environ["wsgi.input"].read(length))
        if hook == admission.CONVERT:
            return _answer(start_response, 200, admission.convert(body))
        outcome = admission.review(body, hook)
    except (ValueError, admission.BadReview) as exc:  # JSONDecodeError is a ValueError
        what = "ConversionReview" if hook == admission.CONVERT else "AdmissionReview"
        return _answer(start_response, 400, {"error": f"bad {what}: {exc}"})
    _record(outcome)
    return _answer(start_response, 200, outcome.response)


def _answer(start_response, status: int, body: dict):
    data = json.dumps(body).encode()
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found"}[status]
    start_response(f"{status} {reason}", [("Content-Type", "application/json"),
                                          ("Content-Length", str(len(data)))])
    return [data]


def _record(outcome: admission.Outcome) -> None:
    """History of the call; a database outage must not fail admission."""
    try:
        close_old_connections()
        WebhookCall.objects.create(
            resource=outcome.resource, namespace=outcome.namespace, name=outcome.name,
            operation=outcome.operation, hook=outcome.hook, allowed=outcome.allowed,
            message=outcome.message[:4000], dry_run=outcome.dry_run,
            duration_ms=outcome.seconds * 1000)
    except Exception as exc:
        log.warning("could not record the webhook call: %s", exc)
    finally:
        connection.close()  # each request has its own thread, and so its own connection


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the base class's signature
        log.debug("%s " + format, self.address_string(), *args)


def serve(host: str, port: int, cert: Path, key: Path,
          stop: threading.Event | None = None) -> None:
    """HTTPS until ``stop`` is set (or for ever)."""
    server = make_server(host, port, application, server_class=_Server,
                         handler_class=_QuietHandler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(cert), str(key))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    log.info("admission webhooks on https://%s:%d (/validate, /mutate)", host, port)
    if stop is None:
        server.serve_forever()
        return
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    stop.wait()
    server.shutdown()
    server.server_close()
