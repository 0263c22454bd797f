"""Admission webhooks through the real api-server: the sample Foo's validating webhook (a
lookup CEL cannot do) and mutating webhook, served over HTTPS by ``manage.py webhook serve``
in its own process, registered with ``manage.py webhook register``; dry runs, records,
failurePolicy with the server down, and a malformed review."""

from __future__ import annotations

import json
import socket
import ssl
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from kubernetes import client

from reconcilers._authoring import crds
from reconcilers.models import WebhookCall
from tests.helpers import REPO, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

GROUP, VERSION, PLURAL = "samplecontroller.k8s.io", "v1alpha1", "foos"
FOO_CRD = REPO / "reconcilers" / "contrib" / "samplecontroller" / "crds" / f"{PLURAL}.{GROUP}.yaml"
CONVERTING = ["gauges.conversion.operator.local"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Webhooks:
    def __init__(self, start_process, tmp: Path, namespace: str,
                 settings: str = "tests.settings"):
        self.start_process, self.namespace, self.settings = start_process, namespace, settings
        self.dir = tmp / "webhook"
        self.port = _free_port()
        self.name = f"wh-{namespace}"
        self.proc = None
        self.previous: dict | None = None

    def manage(self, *args: str) -> str:
        import subprocess

        out = subprocess.run([sys.executable, "manage.py", "webhook", *args], cwd=REPO,
                             capture_output=True, text=True, timeout=120,
                             env={**__import__("os").environ,
                                  "DJANGO_SETTINGS_MODULE": self.settings})
        assert out.returncode == 0, out.stdout + out.stderr
        return out.stdout

    def https(self, path: str, body: bytes | None = None) -> tuple[int, dict]:
        ctx = ssl.create_default_context(cafile=str(self.dir / "ca.crt"))
        req = urllib.request.Request(f"https://127.0.0.1:{self.port}{path}", data=body,
                                     method="POST" if body is not None else "GET",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def start(self, *flags: str, cert_dir: Path | None = None) -> None:
        where = cert_dir or self.dir
        self.proc = self.start_process("webhook", [
            sys.executable, "manage.py", "webhook", "serve", "--bind", "127.0.0.1",
            "--port", str(self.port), "--cert", str(where / "tls.crt"),
            "--key", str(where / "tls.key"), *flags],
            env={"DJANGO_SETTINGS_MODULE": self.settings})

        def answers() -> bool:
            try:
                return self.https("/healthz")[0] == 200
            except OSError:
                return False
        wait_for(answers, 30, "the webhook server")

    def register(self, failure_policy: str = "Fail", only: str | None = "admission",
                 ca: Path | None = None) -> None:
        """Admission only by default; ``only=None`` points the Gauge CRD's conversion here
        too, handed back to its previous server at the end of the test."""
        if only != "admission" and self.previous is None:
            from reconcilers._kube import kube
            from reconcilers._webhooks import registration
            self.previous = registration.conversion_configs(kube.api_client(), CONVERTING)
        self.manage("register", "--url", f"https://127.0.0.1:{self.port}",
                    "--ca", str(ca or self.dir / "ca.crt"), "--name", self.name,
                    "--failure-policy", failure_policy, "--timeout", "5",
                    "--namespace-label", f"webhook-test={self.namespace}",
                    *(["--only", only] if only else []))

    def hand_back(self) -> None:
        if self.previous:
            from reconcilers._kube import kube
            from reconcilers._webhooks import registration
            registration.restore_conversions(kube.api_client(), self.previous,
                                             f"https://127.0.0.1:{self.port}")


def served(kube, namespace: str, start_process, tmp_path: Path,
           settings: str = "tests.settings", *flags: str, register: bool = True):
    """A webhook server for this test's namespace alone (its configurations select the
    namespace by a label), unregistered when the test ends."""
    crds.apply_manifest(kube, FOO_CRD)
    client.CoreV1Api(kube).patch_namespace(namespace, {"metadata": {"labels": {
        "webhook-test": namespace}}})
    hooks = Webhooks(start_process, tmp_path, namespace, settings)
    hooks.manage("certs", "--dir", str(hooks.dir), "--host", "127.0.0.1")
    hooks.start(*flags)
    try:
        if register:
            hooks.register()
        yield hooks
    finally:
        hooks.manage("unregister", "--name", hooks.name)
        hooks.hand_back()


@pytest.fixture
def webhooks(kube, namespace, start_process, tmp_path, redis_client):
    yield from served(kube, namespace, start_process, tmp_path)


def foo(name: str, deployment: str, **spec) -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Foo", "metadata": {"name": name},
            "spec": {"deploymentName": deployment, **spec}}


def _create(kube, namespace: str, body: dict, dry_run: bool = False) -> dict:
    return client.CustomObjectsApi(kube).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, body, dry_run="All" if dry_run else None)


def _delete_gauges(kube) -> None:
    from tests.operatorapp.resources import Gauge

    extensions = client.ApiextensionsV1Api(kube)
    extensions.delete_custom_resource_definition(Gauge._meta.crd_name)
    wait_for(lambda: Gauge._meta.crd_name not in {
        c.metadata.name for c in extensions.list_custom_resource_definition().items},
        60, "the test CRD to go")


def _until_registered(kube, namespace: str) -> None:
    """Webhook configurations reach the api-server's admission chain within a moment."""
    def mutated() -> bool:
        got = _create(kube, namespace, foo("probe", "probe-nginx"), dry_run=True)
        return got["spec"].get("replicas") == 1
    wait_for(mutated, 30, "the webhooks to be called")


def test_a_second_foo_naming_the_same_deployment_is_denied_with_the_first_ones_name(
        kube, namespace, webhooks):
    _until_registered(kube, namespace)
    first = _create(kube, namespace, foo("first", "shared"))
    assert first["spec"]["replicas"] == 1  # the mutating webhook filled it in
    with pytest.raises(client.ApiException) as err:
        _create(kube, namespace, foo("second", "shared", replicas=2))
    message = json.loads(err.value.body)["message"]
    assert err.value.status == 422
    assert message == ('admission webhook "validate.foos.samplecontroller.k8s.io" denied the '
                       'request: spec.deploymentName: Deployment "shared" is already named by '
                       'Foo "first"')
    # A dry run is judged the same way, and persists nothing.
    with pytest.raises(client.ApiException):
        _create(kube, namespace, foo("third", "shared"), dry_run=True)
    assert _create(kube, namespace, foo("fourth", "own"), dry_run=True)["spec"]["replicas"] == 1
    names = [f["metadata"]["name"] for f in client.CustomObjectsApi(kube).list_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL)["items"]]
    assert names == ["first"]

    # Every call is in the admin's record (written just after the answer), with its verdict,
    # message and latency.
    denied = WebhookCall.objects.filter(resource=f"{PLURAL}.{GROUP}", namespace=namespace,
                                        allowed=False)
    wait_for(lambda: {(c.name, c.hook, c.dry_run) for c in denied} >= {
        ("second", "validate", False), ("third", "validate", True)}, 10, "the call records")
    assert all('already named by Foo "first"' in c.message and c.duration_ms > 0
               for c in denied)
    wait_for(lambda: WebhookCall.objects.filter(name="first", hook="mutate",
                                                allowed=True).exists(), 10, "the mutate record")


def test_with_the_server_down_fail_refuses_and_ignore_lets_writes_through(kube, namespace,
                                                                         webhooks):
    _until_registered(kube, namespace)
    webhooks.proc.stop()
    with pytest.raises(client.ApiException) as err:
        _create(kube, namespace, foo("blocked", "blocked"))
    assert "failed calling webhook" in json.loads(err.value.body)["message"]
    webhooks.register(failure_policy="Ignore")

    def goes_through() -> bool:
        try:
            _create(kube, namespace, foo("through", "through", replicas=2))
        except client.ApiException:
            return False
        return True
    wait_for(goes_through, 30, "Ignore to let the write through")


def test_a_malformed_review_gets_a_clear_400_and_the_server_keeps_serving(webhooks):
    assert webhooks.https("/validate", b"{not json")[0] == 400
    status, body = webhooks.https("/validate", json.dumps({"kind": "Pod"}).encode())
    assert status == 400 and "expected an AdmissionReview" in body["error"]
    status, body = webhooks.https("/mutate", json.dumps({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "u1", "resource": {"group": "nope.example.com", "version": "v1",
                                              "resource": "things"}}}).encode())
    assert status == 400 and "no resource things.nope.example.com" in body["error"]
    assert webhooks.https("/healthz") == (200, {"status": "ok"})
    time.sleep(0.1)
    assert webhooks.proc.popen.poll() is None


def test_a_gauge_written_in_either_version_reads_back_in_both(kube, namespace, webhooks):
    """Conversion through the webhook: v1alpha1 (the hub) says spec.replicas, v1 renamed it
    spec.scale.count; the api-server converts every read and write between them."""
    from reconcilers.resources import apply_crds
    from tests.operatorapp.resources import Gauge

    group, plural = Gauge._meta.group, Gauge._meta.plural
    api = client.CustomObjectsApi(kube)
    apply_crds([Gauge], kube, timeout=60)
    try:
        webhooks.register(only=None)  # now the CRD exists: point its conversion here

        def as_v1(name: str) -> dict:
            return api.get_namespaced_custom_object(group, "v1", namespace, plural, name)

        def created() -> bool:  # the CRD's storage is rebuilt after the conversion patch
            try:
                api.create_namespaced_custom_object(group, "v1alpha1", namespace, plural, {
                    "apiVersion": f"{group}/v1alpha1", "kind": "Gauge",
                    "metadata": {"name": "old"}, "spec": {"replicas": 3}})
            except client.ApiException as exc:
                if exc.status != 503:
                    raise
                return False
            return True
        wait_for(created, 30, "the Gauge CRD to serve")

        def converted() -> bool:
            try:
                return as_v1("old")["spec"] == {"scale": {"count": 3}}
            except client.ApiException:
                return False
        wait_for(converted, 30, "a v1alpha1 object read as v1")

        api.create_namespaced_custom_object(group, "v1", namespace, plural, {
            "apiVersion": f"{group}/v1", "kind": "Gauge", "metadata": {"name": "new"},
            "spec": {"scale": {"count": 5}}})
        stored = api.get_namespaced_custom_object(group, "v1alpha1", namespace, plural, "new")
        assert stored["spec"] == {"replicas": 5}
        api.patch_namespaced_custom_object(group, "v1", namespace, plural, "new",
                                           {"spec": {"scale": {"count": 7}}})
        assert api.get_namespaced_custom_object(group, "v1alpha1", namespace, plural,
                                                "new")["spec"] == {"replicas": 7}
        listed = api.list_namespaced_custom_object(group, "v1", namespace, plural)["items"]
        assert sorted((o["metadata"]["name"], o["spec"]["scale"]["count"]) for o in listed) == [
            ("new", 7), ("old", 3)]
    finally:
        _delete_gauges(kube)


def test_admission_judges_v1_writes_in_the_hub_version(kube, namespace, webhooks):
    """default() and validate() are written against the hub (Gauge v1alpha1); a v1 write
    reaches them converted (matchPolicy Equivalent), and their verdict and patch come back
    as v1."""
    from reconcilers.resources import apply_crds
    from tests.operatorapp.resources import Gauge

    group, plural = Gauge._meta.group, Gauge._meta.plural
    api = client.CustomObjectsApi(kube)
    apply_crds([Gauge], kube, timeout=60)
    try:
        webhooks.register(only=None)

        def create_v1(name: str, spec: dict) -> dict:
            return api.create_namespaced_custom_object(group, "v1", namespace, plural, {
                "apiVersion": f"{group}/v1", "kind": "Gauge", "metadata": {"name": name},
                "spec": spec})

        def defaulted() -> bool:  # the CRD's storage is rebuilt after the conversion patch
            try:
                got = create_v1("probe", {})
            except client.ApiException as exc:
                if exc.status < 500:
                    raise
                return False
            return got["spec"] == {"scale": {"count": 1}}
        wait_for(defaulted, 30, "a v1 Gauge defaulted through the hub")
        with pytest.raises(client.ApiException) as err:
            create_v1("big", {"scale": {"count": 11}})
        assert err.value.status in (400, 422)
        assert "at most 10" in json.loads(err.value.body)["message"]
    finally:
        _delete_gauges(kube)


def test_a_malformed_conversion_review_gets_a_400(webhooks):
    status, body = webhooks.https("/convert", json.dumps({"kind": "ConversionReview"}).encode())
    assert status == 400 and "expected a ConversionReview" in body["error"]


def test_serve_register_makes_its_certificates_registers_and_unregisters_on_stop(
        kube, namespace, start_process, tmp_path):
    """The self-managed mode of the local stack and compose: one command makes the CA and
    serving pair, registers at https://HOST:PORT, serves, and removes its configurations when
    stopped, so a stopped server never leaves Foo writes refused."""
    crds.apply_manifest(kube, FOO_CRD)
    client.CoreV1Api(kube).patch_namespace(namespace, {"metadata": {"labels": {
        "webhook-test": namespace}}})
    port, name = _free_port(), f"self-{namespace}"
    proc = start_process("webhook", [
        sys.executable, "manage.py", "webhook", "serve", "--bind", "127.0.0.1",
        "--port", str(port), "--certs-dir", str(tmp_path / "certs"), "--host", "127.0.0.1",
        "--register", "--name", name, "--namespace-label", f"webhook-test={namespace}"])
    _until_registered(kube, namespace)
    assert (tmp_path / "certs" / "ca.crt").exists()
    admission_api = client.AdmissionregistrationV1Api(kube)
    validating = admission_api.read_validating_webhook_configuration(f"{name}-validate")
    assert validating.webhooks[0].client_config.url == f"https://127.0.0.1:{port}/validate"
    _create(kube, namespace, foo("first", "shared"))
    with pytest.raises(client.ApiException) as err:
        _create(kube, namespace, foo("second", "shared"))
    assert 'already named by Foo "first"' in json.loads(err.value.body)["message"]

    proc.stop()
    assert proc.popen.returncode == 0, proc.log()
    for read in (admission_api.read_validating_webhook_configuration,
                 admission_api.read_mutating_webhook_configuration):
        with pytest.raises(client.ApiException) as gone:
            read(f"{name}-{'validate' if 'validating' in read.__name__ else 'mutate'}")
        assert gone.value.status == 404

    def unhooked() -> bool:  # the api-server's admission chain drops them within a moment
        try:
            return "replicas" not in _create(kube, namespace, foo("after", "after"),
                                             dry_run=True)["spec"]
        except client.ApiException:
            return False
    wait_for(unhooked, 30, "writes to go through unhooked")


def test_a_converting_crd_installed_after_the_server_started_is_registered_then_handed_back(
        kube, namespace, start_process, tmp_path):
    """On a fresh stack the webhook server can start before the watcher installs the CRDs:
    it registers each one's conversion once it appears, and hands it back when it stops."""
    from reconcilers.resources import apply_crds
    from tests.operatorapp.resources import Gauge

    extensions = client.ApiextensionsV1Api(kube)
    name = Gauge._meta.crd_name
    assert name not in {c.metadata.name for c in
                        extensions.list_custom_resource_definition().items}
    port = _free_port()
    proc = start_process("webhook", [
        sys.executable, "manage.py", "webhook", "serve", "--bind", "127.0.0.1",
        "--port", str(port), "--certs-dir", str(tmp_path / "certs"), "--host", "127.0.0.1",
        "--register", "--only", "conversion"])
    proc.wait_for_log("webhooks on https://", timeout=60)
    try:
        apply_crds([Gauge], kube, timeout=60)

        def client_config():
            return extensions.read_custom_resource_definition(
                name).spec.conversion.webhook.client_config
        wait_for(lambda: client_config().url == f"https://127.0.0.1:{port}/convert", 30,
                 "the server to register the new CRD's conversion")
        proc.stop()
        assert proc.popen.returncode == 0, proc.log()
        handed_back = client_config()
        assert handed_back.url is None
        assert handed_back.service.name == Gauge._meta.webhook_service[1]
    finally:
        extensions.delete_custom_resource_definition(name)
        wait_for(lambda: name not in {c.metadata.name for c in
                                      extensions.list_custom_resource_definition().items},
                 60, "the test CRD to go")


# --- hooks on a built-in kind, and on deletion --------------------------------------------------


@pytest.fixture
def deployment_hooks(kube, namespace, start_process, tmp_path, redis_client):
    """The server with ``tests.webhookapp``'s ``Webhook`` on Deployments."""
    yield from served(kube, namespace, start_process, tmp_path, "tests.webhook_settings")


def _deployment(name: str, image: str, **annotations: str) -> dict:
    labels = {"app": name}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "annotations": annotations},
            "spec": {"replicas": 0, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [{"name": "c", "image": image}]}}}}


def test_a_deployment_webhook_declared_in_python_judges_writes_and_deletions(
        kube, namespace, deployment_hooks):
    """A ``Webhook`` class on apps/v1 Deployments, registered like the CRDs' hooks: the
    api-server calls its default() and validate() on writes and validate_delete() on
    DELETE (operations CREATE, UPDATE, DELETE), scoped to this namespace."""
    from tests.webhookapp.resources import PROTECTED

    apps = client.AppsV1Api(kube)
    validating = client.AdmissionregistrationV1Api(kube).read_validating_webhook_configuration(
        f"{deployment_hooks.name}-validate")
    rules = {w.name: w.rules[0] for w in validating.webhooks}
    assert rules["validate.deployments.apps"].operations == ["CREATE", "UPDATE", "DELETE"]

    def defaulted() -> bool:
        got = apps.create_namespaced_deployment(namespace, _deployment("probe", "nginx:1.27"),
                                                dry_run="All")
        return got.metadata.labels.get("webhook-test/policy") == "checked"
    wait_for(defaulted, 30, "the Deployment webhooks to be called")

    with pytest.raises(client.ApiException) as err:
        apps.create_namespaced_deployment(namespace, _deployment("loose", "nginx:latest"))
    assert err.value.status == 422
    assert json.loads(err.value.body)["message"] == (
        'admission webhook "validate.deployments.apps" denied the request: '
        "spec.template.spec.containers: image 'nginx:latest': pin a tag")

    kept = apps.create_namespaced_deployment(
        namespace, _deployment("kept", "nginx:1.27", **{PROTECTED: "true"}))
    assert kept.metadata.labels["webhook-test/policy"] == "checked"
    with pytest.raises(client.ApiException) as err:
        apps.delete_namespaced_deployment("kept", namespace)
    assert err.value.status in (400, 422)
    assert f"Deployment kept is protected: remove the {PROTECTED} annotation first" in \
        json.loads(err.value.body)["message"]
    assert apps.read_namespaced_deployment("kept", namespace).metadata.deletion_timestamp is None

    apps.patch_namespaced_deployment("kept", namespace,
                                     {"metadata": {"annotations": {PROTECTED: None}}})
    apps.delete_namespaced_deployment("kept", namespace)

    def gone() -> bool:
        try:
            apps.read_namespaced_deployment("kept", namespace)
        except client.ApiException as exc:
            return exc.status == 404
        return False
    wait_for(gone, 30, "the unprotected Deployment to go")
    calls = WebhookCall.objects.filter(resource="deployments.apps", namespace=namespace,
                                       name="kept", operation="DELETE")
    wait_for(lambda: {c.allowed for c in calls} == {False, True}, 10, "the DELETE records")
