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

``serve`` runs gunicorn's threaded worker (``reconcilers._webhooks.server``): ``--workers``,
``--threads``, ``--max-connections`` (beyond: the listen ``--backlog``), ``--request-timeout``
(a request's handshake, headers, body and answer), ``--keepalive`` (idle connections); the
certificate files are reloaded when they change. SIGTERM stops it gracefully.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import yaml
from django.core.management.base import BaseCommand, CommandError

from reconcilers._kube import kube
from reconcilers._webhooks import certificates, registration, server
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
        getattr(self, f"_{action}")(**options)

    def _certs(self, dir: Path, host: list[str], **_) -> None:  # noqa: A002 - the option's name
        made = certificates.ensure_certificates(dir, host)
        self.stdout.write(f"CA {made.ca}\ncertificate {made.cert}\nkey {made.key}")

    @staticmethod
    def _hooked(timeout: int, only: str | None = None) -> list:
        resources = registration.hooked_resources()
        if only == "conversion":
            resources = [r for r in resources if r._meta.converts]
        if not resources:
            raise CommandError("no resource declares validate(), default() or conversion "
                               "functions: nothing to register")
        if not 1 <= timeout <= 30:
            raise CommandError("--timeout must be 1-30 seconds (the api-server's limit)")
        return resources

    def _manifests(self, namespace: str, service_name: str, service_port: int,
                   failure_policy: str, timeout: int, name: str, **_) -> None:
        self.stdout.write(registration.cluster_manifests_yaml(
            self._hooked(timeout), namespace=namespace, service=service_name,
            port=service_port, failure_policy=failure_policy, timeout=timeout, name=name),
            ending="")

    def _register(self, url, service, ca: Path, failure_policy: str, timeout: int,
                  namespace_label: list[str], name: str, print: bool,  # noqa: A002
                  only: str | None = None, **_) -> list[tuple[str, dict]]:
        """The conversion patches are returned for ``serve`` to hand back and to retry on
        CRDs not installed yet."""
        resources = self._hooked(timeout, only)
        target = None
        if service:
            try:
                ns_name, port = service.rsplit(":", 1)
                namespace, svc = ns_name.split("/", 1)
                target = (namespace, svc, int(port))
            except ValueError:
                raise CommandError("--service is NAMESPACE/NAME:PORT") from None
        labels = dict(item.split("=", 1) for item in namespace_label if "=" in item)
        configs = registration.configurations(
            resources, ca_bundle=ca.read_bytes(), url=url, service=target,
            failure_policy=failure_policy, timeout=timeout,
            namespace_selector={"matchLabels": labels} if labels else None, name=name)
        conversions = registration.conversion_patches(resources, ca_bundle=ca.read_bytes(),
                                                      url=url, service=target)
        if only == "conversion":
            configs = []
        elif only == "admission":
            conversions = []
        if print:
            self.stdout.write(yaml.safe_dump_all(configs, sort_keys=False))
            for crd, patch in conversions:
                self.stdout.write(f"# kubectl patch crd {crd} --type merge -p '"
                                  f"{json.dumps(patch)}'\n")
            return conversions
        try:
            for applied in registration.register(kube.api_client(), configs, conversions):
                self.stdout.write(applied if ": " in applied else f"{applied}: applied")
        except kube.ApiError as exc:
            raise CommandError(f"registering the webhooks failed: {exc.message}") from exc
        return conversions

    def _unregister(self, name: str, **_) -> None:
        registration.unregister(kube.api_client(), name)
        self.stdout.write(f"{name}: webhook configurations deleted")

    def _serve(self, bind: str, port: int, cert: Path | None, key: Path | None,
               certs_dir: Path | None, host: list[str], register: bool, name: str,
               workers: int, threads: int, max_connections: int, backlog: int,
               request_timeout: float, keepalive: int, graceful_timeout: int,
               **options) -> None:
        ca = None
        if cert is None or key is None:
            if certs_dir is None or not host:
                raise CommandError("give --cert and --key, or --certs-dir and --host")
            made = certificates.ensure_certificates(certs_dir, host)
            cert, key, ca = made.cert, made.key, made.ca
        for path in (cert, key):
            if not path.exists():
                raise CommandError(f"{path} does not exist (manage.py webhook certs makes one)")
        if register and (ca is None or not host):
            raise CommandError("--register needs --certs-dir and --host (the CA it registers "
                               "and the address the api-server calls)")
        if min(workers, threads, max_connections, backlog, keepalive) < 1 \
                or not 0 < request_timeout:
            raise CommandError("--workers, --threads, --max-connections, --backlog, "
                               "--keepalive and --request-timeout must be positive")
        held = server.Options(
            workers=workers, threads=threads, max_connections=max_connections, backlog=backlog,
            request_timeout=request_timeout, keepalive=keepalive,
            graceful_timeout=graceful_timeout)
        stop = threading.Event()  # ends the late registrations when the server stops
        url = f"https://{_url_host(host[0])}:{port}" if host else ""
        previous: dict[str, dict] = {}
        later = None

        def listening() -> None:  # registered only once the api-server's calls can land
            nonlocal later
            if register:
                if options.get("only") != "admission":
                    converting = [r._meta.crd_name for r in registration.hooked_resources()
                                  if r._meta.converts]
                    previous.update(registration.conversion_configs(kube.api_client(),
                                                                    converting))
                conversions = self._register(url=url, service=None, ca=ca, name=name,
                                             print=False, **options)
                waiting = [(crd, patch) for crd, patch in conversions if crd not in previous]
                if waiting:
                    later = threading.Thread(target=self._register_when_installed, daemon=True,
                                             args=(waiting, previous, stop))
                    later.start()
            self.stdout.write(f"webhooks on https://{bind}:{port} "
                              f"({len(registration.hooked_resources())} resource(s))")

        try:
            server.serve(bind, port, cert, key, options=held, ready=listening)
        finally:
            stop.set()
            if later is not None:
                later.join(15)  # no registration may land after the hand-back
            if register:
                self._hand_back(name, url, previous, options.get("only"))

    def _register_when_installed(self, waiting: list[tuple[str, dict]],
                                 previous: dict[str, dict], stop: threading.Event) -> None:
        """A converting CRD not installed yet when this server started - the watcher installs
        it a moment later on a fresh stack - gets its conversion pointed here once it is."""
        api = kube.api_client()
        while waiting and not stop.wait(1):
            for item in list(waiting):
                try:
                    live = registration.conversion_configs(api, [item[0]])
                    if item[0] not in live:
                        continue
                    previous.update(live)
                    registration.register(api, [], [item])
                except kube.ApiError as exc:
                    self.stderr.write(f"CustomResourceDefinition/{item[0]}: registering "
                                      f"its conversion failed: {exc.message}")
                    continue
                waiting.remove(item)
                self.stdout.write(f"CustomResourceDefinition/{item[0]} (conversion): applied")

    def _hand_back(self, name: str, url: str, previous: dict[str, dict],
                   only: str | None) -> None:
        """Conversion first (a CRD left calling a stopped server blocks namespace deletion),
        then the configurations; a failure of one does not skip the other."""
        try:
            for crd in registration.restore_conversions(kube.api_client(), previous, url):
                self.stdout.write(f"CustomResourceDefinition/{crd}: conversion handed back")
        except kube.ApiError as exc:
            self.stderr.write(f"handing conversion back failed: {exc.message}")
        if only != "conversion":
            self._unregister(name)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
