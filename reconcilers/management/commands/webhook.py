"""``python manage.py webhook certs|register|unregister|serve``: admission webhooks.

    manage.py webhook certs --dir .local/webhook --host 127.0.0.1      # CA + serving pair
    manage.py webhook register --url https://127.0.0.1:9443 --ca .local/webhook/ca.crt
    manage.py webhook serve --port 9443 --cert .local/webhook/tls.crt --key .local/webhook/tls.key

    manage.py webhook serve --certs-dir .local/webhook --host 127.0.0.1 --register

``serve --register`` is the self-managed mode (local stack, compose): it makes the certificates
for ``--host`` when none are given, registers the configurations at ``https://HOST:PORT``
before it serves and deletes them when it stops; a CRD's conversion, which cannot be deleted,
is handed back to whichever server it called before. ``--only conversion`` registers just the
conversion (the test suite's shared server); ``--only admission`` just the two configurations.
``register --print`` writes the
configurations as YAML instead of applying them; ``manifests`` writes ``deploy/webhook/``'s
generated part (ServiceAccount, read-only ClusterRole, configurations for cert-manager).

The command only parses its arguments: every action, and the server's lifecycle, is
``reconcilers._webhooks.lifecycle``'s. ``serve`` runs gunicorn's threaded worker
(``reconcilers._webhooks.server``): ``--workers``,
``--threads``, ``--max-connections`` (beyond: the listen ``--backlog``), ``--request-timeout``
(a request's handshake, headers, body and answer), ``--keepalive`` (idle connections); the
certificate files are reloaded when they change. SIGTERM stops it gracefully.
"""

from __future__ import annotations

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from reconcilers._webhooks import lifecycle, server
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
        self._registration_options(reg)
        reg.add_argument("--print", action="store_true", help="print YAML, apply nothing")
        unreg = sub.add_parser("unregister", help="delete the webhook configurations")
        unreg.add_argument("--name", default="django-crd-operator")
        manifests = sub.add_parser("manifests", help="print deploy/webhook/'s generated YAML")
        manifests.add_argument("--namespace", default="django-crd-operator")
        manifests.add_argument("--service-name", default="django-crd-operator-webhook")
        manifests.add_argument("--service-port", type=int, default=443)
        self._registration_options(manifests, selectors=False)
        serve = sub.add_parser("serve", help="serve /validate, /mutate and /convert over HTTPS")
        serve.add_argument("--bind", default="0.0.0.0")
        serve.add_argument("--port", type=int, default=9443)
        serve.add_argument("--cert", type=Path, help="serving certificate (PEM)")
        serve.add_argument("--key", type=Path, help="its private key (PEM)")
        serve.add_argument("--certs-dir", type=Path,
                           help="without --cert/--key: make (or keep) a CA and pair here")
        serve.add_argument("--host", action="append", default=[],
                           help="the IP or DNS name the api-server reaches this server at")
        serve.add_argument("--register", action="store_true",
                           help="register at https://HOST:PORT while serving, delete on exit")
        self._registration_options(serve)
        held = server.Options()
        serve.add_argument("--workers", type=int, default=held.workers,
                           help="worker processes (default %(default)s)")
        serve.add_argument("--threads", type=int, default=held.threads,
                           help="requests served at once per worker (default %(default)s)")
        serve.add_argument("--max-connections", type=int, default=held.max_connections,
                           help="open connections per worker; more wait in the listen backlog "
                                "(default %(default)s)")
        serve.add_argument("--backlog", type=int, default=held.backlog,
                           help="connections queued past the bound before the kernel refuses "
                                "(default %(default)s)")
        serve.add_argument("--request-timeout", type=float, default=held.request_timeout,
                           help="seconds a request has for its TLS handshake, headers, body "
                                "and answer (default %(default)s)")
        serve.add_argument("--keepalive", type=int, default=held.keepalive,
                           help="seconds an idle kept-alive connection stays open "
                                "(default %(default)s)")
        serve.add_argument("--graceful-timeout", type=int, default=held.graceful_timeout,
                           help="seconds a stopping server finishes what it serves "
                                "(default %(default)s)")

    @staticmethod
    def _registration_options(parser, selectors: bool = True) -> None:
        parser.add_argument("--failure-policy", choices=["Fail", "Ignore"], default="Fail")
        parser.add_argument("--timeout", type=int, default=5, help="seconds (1-30)")
        if selectors:
            parser.add_argument("--namespace-label", action="append", default=[],
                                help="only namespaces with this label (key=value), repeatable")
        parser.add_argument("--name", default="django-crd-operator")
        parser.add_argument("--only", choices=["admission", "conversion"],
                            help="register only the admission configurations, or only the "
                                 "CRDs' conversion")

    def handle(self, *args, action: str, **options) -> None:
        autodiscover()
        webhooks = lifecycle.Webhooks(out=self.stdout, err=self.stderr)
        try:
            getattr(webhooks, action)(**options)
        except lifecycle.Refused as exc:
            raise CommandError(str(exc)) from exc
