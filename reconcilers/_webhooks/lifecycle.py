"""The webhook server's lifecycle, as ``_watch.lifecycle`` is the watcher's: everything
``manage.py webhook`` does between its arguments and its exit.

``Webhooks.serve``:

1. make (or keep) the serving pair for ``--host`` when no ``--cert``/``--key`` is given
   (``certificates``), and refuse options that cannot work before anything starts;
2. serve (``server.serve``); once the socket listens, with ``--register``, remember which
   server each converting CRD called before, then register the configurations at
   ``https://HOST:PORT`` (``registration``) - and point a converting CRD installed later (the
   watcher installs it a moment after on a fresh stack) here once it appears;
3. when the server stops, end the late registrations, hand each CRD's conversion back to the
   server it called before (a CRD left calling a stopped server blocks namespace deletion)
   and delete the configurations.

The one-shot actions - ``certs``, ``register``, ``unregister``, ``manifests`` - are here too,
since ``serve`` registers as ``register`` does. What cannot work is refused with ``Refused``
(the command's error); what was done is written to ``out``, what failed on the way to ``err``.
The command only parses its arguments.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import TextIO

import yaml

from reconcilers._kube import kube
from reconcilers._webhooks import certificates, registration, server


class Refused(Exception):
    """Options that cannot work, said before anything was changed."""


class Webhooks:
    """``manage.py webhook``'s actions, reporting to ``out`` and ``err``."""

    def __init__(self, out: TextIO | None = None, err: TextIO | None = None):
        self.out = out or sys.stdout
        self.err = err or sys.stderr

    def certs(self, dir: Path, host: list[str], **_) -> None:  # noqa: A002 - the option's name
        made = certificates.ensure_certificates(dir, host)
        self._say(f"CA {made.ca}\ncertificate {made.cert}\nkey {made.key}")

    def manifests(self, namespace: str, service_name: str, service_port: int,
                  failure_policy: str, timeout: int, name: str, **_) -> None:
        self.out.write(registration.cluster_manifests_yaml(
            _hooked(timeout), namespace=namespace, service=service_name,
            port=service_port, failure_policy=failure_policy, timeout=timeout, name=name))

    def register(self, url, service, ca: Path, failure_policy: str, timeout: int,
                 namespace_label: list[str], name: str, print: bool,  # noqa: A002
                 only: str | None = None, **_) -> list[tuple[str, dict]]:
        """The conversion patches are returned for ``serve`` to hand back and to retry on
        CRDs not installed yet."""
        resources = _hooked(timeout, only)
        target = None
        if service:
            try:
                ns_name, port = service.rsplit(":", 1)
                namespace, svc = ns_name.split("/", 1)
                target = (namespace, svc, int(port))
            except ValueError:
                raise Refused("--service is NAMESPACE/NAME:PORT") from None
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
            self._say(yaml.safe_dump_all(configs, sort_keys=False))
            for crd, patch in conversions:
                self._say(f"# kubectl patch crd {crd} --type merge -p '{json.dumps(patch)}'\n")
            return conversions
        try:
            for applied in registration.register(kube.api_client(), configs, conversions):
                self._say(applied if ": " in applied else f"{applied}: applied")
        except kube.ApiError as exc:
            raise Refused(f"registering the webhooks failed: {exc.message}") from exc
        return conversions

    def unregister(self, name: str, **_) -> None:
        registration.unregister(kube.api_client(), name)
        self._say(f"{name}: webhook configurations deleted")

    def serve(self, bind: str, port: int, cert: Path | None, key: Path | None,
              certs_dir: Path | None, host: list[str], register: bool, name: str,
              workers: int, threads: int, max_connections: int, backlog: int,
              request_timeout: float, keepalive: int, graceful_timeout: int,
              **options) -> None:
        """Serve until SIGTERM (``server.serve`` returns); with ``register``, registered
        while it listens and handed back when it stops."""
        ca = None
        if cert is None or key is None:
            if certs_dir is None or not host:
                raise Refused("give --cert and --key, or --certs-dir and --host")
            made = certificates.ensure_certificates(certs_dir, host)
            cert, key, ca = made.cert, made.key, made.ca
        for path in (cert, key):
            if not path.exists():
                raise Refused(f"{path} does not exist (manage.py webhook certs makes one)")
        if register and (ca is None or not host):
            raise Refused("--register needs --certs-dir and --host (the CA it registers "
                          "and the address the api-server calls)")
        if min(workers, threads, max_connections, backlog, keepalive) < 1 \
                or not 0 < request_timeout:
            raise Refused("--workers, --threads, --max-connections, --backlog, "
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
                conversions = self.register(url=url, service=None, ca=ca, name=name,
                                            print=False, **options)
                waiting = [(crd, patch) for crd, patch in conversions if crd not in previous]
                if waiting:
                    later = threading.Thread(target=self._register_when_installed, daemon=True,
                                             args=(waiting, previous, stop))
                    later.start()
            self._say(f"webhooks on https://{bind}:{port} "
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
                    self._warn(f"CustomResourceDefinition/{item[0]}: registering "
                               f"its conversion failed: {exc.message}")
                    continue
                waiting.remove(item)
                self._say(f"CustomResourceDefinition/{item[0]} (conversion): applied")

    def _hand_back(self, name: str, url: str, previous: dict[str, dict],
                   only: str | None) -> None:
        """Conversion first (a CRD left calling a stopped server blocks namespace deletion),
        then the configurations; a failure of one does not skip the other."""
        try:
            for crd in registration.restore_conversions(kube.api_client(), previous, url):
                self._say(f"CustomResourceDefinition/{crd}: conversion handed back")
        except kube.ApiError as exc:
            self._warn(f"handing conversion back failed: {exc.message}")
        if only != "conversion":
            self.unregister(name)

    def _say(self, text: str) -> None:
        """``text`` as a whole line: a newline is added unless it ends with one."""
        self.out.write(text if text.endswith("\n") else text + "\n")

    def _warn(self, text: str) -> None:
        self.err.write(text if text.endswith("\n") else text + "\n")


def _hooked(timeout: int, only: str | None = None) -> list:
    """The resources to register, refused when there are none or ``timeout`` is beyond the
    api-server's limit."""
    resources = registration.hooked_resources()
    if only == "conversion":
        resources = [r for r in resources if r._meta.converts]
    if not resources:
        raise Refused("no resource declares validate(), default() or conversion "
                      "functions: nothing to register")
    if not 1 <= timeout <= 30:
        raise Refused("--timeout must be 1-30 seconds (the api-server's limit)")
    return resources


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
