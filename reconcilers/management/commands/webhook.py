"""``python manage.py webhook certs|register|unregister|serve``: admission webhooks.

    manage.py webhook certs --dir .local/webhook --host 127.0.0.1      # CA + serving pair
    manage.py webhook register --url https://127.0.0.1:9443 --ca .local/webhook/ca.crt
    manage.py webhook serve --port 9443 --cert .local/webhook/tls.crt --key .local/webhook/tls.key

``register --print`` writes the configurations as YAML instead of applying them (for
``deploy/``: ``--service NAMESPACE/NAME:PORT`` points them at a Service).
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from django.core.management.base import BaseCommand, CommandError

from reconcilers import kube, webhooks
from reconcilers.resources import autodiscover


class Command(BaseCommand):
    help = __doc__.splitlines()[0]

    def add_arguments(self, parser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        certs = sub.add_parser("certs", help="make (or keep) a CA and a serving certificate")
        certs.add_argument("--dir", type=Path, required=True)
        certs.add_argument("--host", action="append", required=True,
                           help="an IP or DNS name the api-server reaches the server at "
                                "(repeat for several)")
        reg = sub.add_parser("register", help="apply the webhook configurations")
        where = reg.add_mutually_exclusive_group(required=True)
        where.add_argument("--url", help="https://host:port of the webhook server")
        where.add_argument("--service", help="NAMESPACE/NAME:PORT of its Service")
        reg.add_argument("--ca", type=Path, required=True, help="the CA bundle (PEM)")
        reg.add_argument("--failure-policy", choices=["Fail", "Ignore"], default="Fail")
        reg.add_argument("--timeout", type=int, default=5, help="seconds (1-30)")
        reg.add_argument("--namespace-label", action="append", default=[],
                         help="only namespaces with this label (key=value), repeatable")
        reg.add_argument("--name", default="django-crd-operator")
        reg.add_argument("--print", action="store_true", help="print YAML, apply nothing")
        unreg = sub.add_parser("unregister", help="delete the webhook configurations")
        unreg.add_argument("--name", default="django-crd-operator")
        serve = sub.add_parser("serve", help="serve /validate and /mutate over HTTPS")
        serve.add_argument("--bind", default="0.0.0.0")
        serve.add_argument("--port", type=int, default=9443)
        serve.add_argument("--cert", type=Path, required=True)
        serve.add_argument("--key", type=Path, required=True)

    def handle(self, *args, action: str, **options) -> None:
        autodiscover()
        getattr(self, f"_{action}")(**options)

    def _certs(self, dir: Path, host: list[str], **_) -> None:  # noqa: A002 - the option's name
        made = webhooks.ensure_certificates(dir, host)
        self.stdout.write(f"CA {made.ca}\ncertificate {made.cert}\nkey {made.key}")

    def _register(self, url, service, ca: Path, failure_policy: str, timeout: int,
                  namespace_label: list[str], name: str, print: bool, **_) -> None:  # noqa: A002
        resources = webhooks.hooked_resources()
        if not resources:
            raise CommandError("no resource declares validate(), default() or conversion "
                               "functions: nothing to register")
        if not 1 <= timeout <= 30:
            raise CommandError("--timeout must be 1-30 seconds (the api-server's limit)")
        target = None
        if service:
            try:
                ns_name, port = service.rsplit(":", 1)
                namespace, svc = ns_name.split("/", 1)
                target = (namespace, svc, int(port))
            except ValueError:
                raise CommandError("--service is NAMESPACE/NAME:PORT") from None
        labels = dict(item.split("=", 1) for item in namespace_label if "=" in item)
        configs = webhooks.configurations(
            resources, ca_bundle=ca.read_bytes(), url=url, service=target,
            failure_policy=failure_policy, timeout=timeout,
            namespace_selector={"matchLabels": labels} if labels else None, name=name)
        conversions = webhooks.conversion_patches(resources, ca_bundle=ca.read_bytes(), url=url,
                                                  service=target)
        if print:
            self.stdout.write(yaml.safe_dump_all(configs, sort_keys=False))
            for crd, patch in conversions:
                self.stdout.write(f"# kubectl patch crd {crd} --type merge -p '"
                                  f"{json.dumps(patch)}'\n")
            return
        try:
            for applied in webhooks.register(kube.api_client(), configs, conversions):
                self.stdout.write(applied if ": " in applied else f"{applied}: applied")
        except kube.ApiError as exc:
            raise CommandError(f"registering the webhooks failed: {exc.message}") from exc

    def _unregister(self, name: str, **_) -> None:
        webhooks.unregister(kube.api_client(), name)
        self.stdout.write(f"{name}: webhook configurations deleted")

    def _serve(self, bind: str, port: int, cert: Path, key: Path, **_) -> None:
        for path in (cert, key):
            if not path.exists():
                raise CommandError(f"{path} does not exist (manage.py webhook certs makes one)")
        self.stdout.write(f"admission webhooks on https://{bind}:{port} "
                          f"({len(webhooks.hooked_resources())} resource(s))")
        webhooks.serve(bind, port, cert, key)
