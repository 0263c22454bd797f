"""Admission reviews without the api-server in the loop: the JSONPatch a mutation sends, the
response shape, and what a bad request or a crashing hook gets."""

from __future__ import annotations

import base64
import copy
import json

import pytest

from reconcilers._webhooks import admission
from reconcilers.resources import KindRegistry, Resource, fields


def apply_patch(doc, ops):
    """A minimal RFC 6902 applier (add/remove/replace), to check what json_patch produces."""
    doc = copy.deepcopy(doc)
    for op in ops:
        if op["path"] == "":
            doc = copy.deepcopy(op["value"])
            continue
        *parents, last = [p.replace("~1", "/").replace("~0", "~")
                          for p in op["path"].split("/")[1:]]
        target = doc
        for p in parents:
            target = target[p]
        if op["op"] == "remove":
            del target[last]
        else:
            target[last] = copy.deepcopy(op["value"])
    return doc


@pytest.mark.parametrize("before,after", [
    ({"a": 1}, {"a": 1}),
    ({"a": 1}, {"a": 2}),
    ({"a": 1, "b": {"c": [1, 2]}}, {"b": {"c": [1, 2, 3], "d": None}}),
    ({"spec": {}}, {"spec": {"replicas": 1}}),
    ({"x/y": {"~t": 1}}, {"x/y": {"~t": 2}, "n": "1"}),
    ({"a": [1]}, {"a": {"k": 1}}),
    ({"a": 1}, {"a": True}),
])
def test_json_patch_turns_before_into_after(before, after):
    ops = admission.json_patch(before, after)
    assert apply_patch(before, ops) == after
    assert (ops == []) == (before == after and json.dumps(before) == json.dumps(after))


class Spec(fields.Object):
    size = fields.Integer()


class Gadget(Resource):
    group = "admission.test.local"
    version = "v1"
    spec = Spec()

    class Meta:
        registry = None

    def default(self, request):
        self.raw["spec"].setdefault("size", 3)

    def validate(self, old, request):
        if self.raw["spec"].get("size", 0) > 10:
            raise admission.ValidationError("spec.size", "at most 10")
        if old is not None and old.raw["spec"].get("size") != self.raw["spec"].get("size"):
            return ["size changed"]
        if self.raw["spec"].get("size") == 7:
            raise RuntimeError("seven is unlucky")
        return []


def review(obj, old=None, op="CREATE", dry_run=False):
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u-1", "operation": op, "namespace": "ns", "name": "g", "dryRun": dry_run,
        "resource": {"group": "admission.test.local", "version": "v1", "resource": "gadgets"},
        "object": obj, "oldObject": old, "userInfo": {"username": "alice"}}}


@pytest.fixture
def registered(monkeypatch):
    registry = KindRegistry()
    registry.register(Gadget)
    monkeypatch.setattr(admission, "default_registry", registry)


def gadget(**spec):
    return {"apiVersion": "admission.test.local/v1", "kind": "Gadget",
            "metadata": {"name": "g"}, "spec": spec}


def test_a_mutation_is_sent_as_a_base64_json_patch(registered):
    out = admission.review(review(gadget()), admission.MUTATE, api=object())
    response = out.response["response"]
    assert response["uid"] == "u-1" and response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(response["patch"])) == [
        {"op": "add", "path": "/spec/size", "value": 3}]
    nothing = admission.review(review(gadget(size=1)), admission.MUTATE, api=object())
    assert "patch" not in nothing.response["response"]


def test_a_denial_names_the_field_and_warnings_reach_the_client(registered):
    denied = admission.review(review(gadget(size=11)), admission.VALIDATE, api=object())
    response = denied.response["response"]
    assert response["allowed"] is False and not denied.allowed
    assert response["status"]["code"] == 422
    assert response["status"]["message"] == "spec.size: at most 10"
    assert response["status"]["details"]["causes"] == [
        {"field": "spec.size", "message": "at most 10", "reason": "FieldValueInvalid"}]
    warned = admission.review(review(gadget(size=2), old=gadget(size=1), op="UPDATE"),
                              admission.VALIDATE, api=object())
    assert warned.response["response"] == {"uid": "u-1", "allowed": True,
                                           "warnings": ["size changed"]}


def test_a_hook_that_crashes_denies_that_request_with_its_error(registered):
    out = admission.review(review(gadget(size=7)), admission.VALIDATE, api=object())
    assert out.allowed is False
    assert out.response["response"]["status"]["message"] == (
        "validate hook failed: RuntimeError: seven is unlucky")


@pytest.mark.parametrize("body,reason", [
    ([], "expected an AdmissionReview"),
    ({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1beta1"}, "unsupported"),
    ({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": {}}, "no request"),
    ({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1",
      "request": {"uid": "x"}}, "names no resource"),
])
def test_what_is_not_an_admission_review_is_refused_with_the_reason(registered, body, reason):
    with pytest.raises(admission.BadReview, match=reason):
        admission.review(body, admission.VALIDATE, api=object())


def conversion(objects, desired):
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
            "request": {"uid": "c-1", "desiredAPIVersion": desired, "objects": objects}}


def test_conversion_goes_through_the_hub_and_keeps_metadata():
    from tests.operatorapp.resources import Gauge

    group = Gauge._meta.group
    old = {"apiVersion": f"{group}/v1alpha1", "kind": "Gauge",
           "metadata": {"name": "g", "labels": {"a": "b"}}, "spec": {"replicas": 2}}
    out = admission.convert(conversion([old], f"{group}/v1"))["response"]
    assert out["result"] == {"status": "Success"} and out["uid"] == "c-1"
    (new,) = out["convertedObjects"]
    assert new == {"apiVersion": f"{group}/v1", "kind": "Gauge",
                   "metadata": {"name": "g", "labels": {"a": "b"}}, "spec": {"scale": {"count": 2}}}
    back = admission.convert(conversion([new], f"{group}/v1alpha1"))["response"]
    assert back["convertedObjects"] == [old]
    # A conversion function that fails fails the review with its reason.
    broken = {**new, "spec": {"scale": "not an object"}}
    failed = admission.convert(conversion([broken], f"{group}/v1alpha1"))["response"]
    assert failed["result"]["status"] == "Failure"
    assert "conversion to" in failed["result"]["message"]
    with pytest.raises(admission.BadReview, match="no resource of kind"):
        admission.convert(conversion([{**old, "kind": "Nope"}], f"{group}/v1"))


def test_a_converting_crd_calls_the_webhook_service_and_asks_cert_manager_for_its_ca():
    """deploy/webhook-cert-manager's CA injector fills the conversion caBundle from the
    Certificate named like the Service; a CRD that converts nothing has neither."""
    from reconcilers.contrib.podset.resources import PodSet
    from reconcilers.resources.crd import crd
    from tests.operatorapp.resources import Gauge

    manifest = crd(Gauge)
    assert manifest["spec"]["conversion"]["webhook"]["clientConfig"]["service"] == {
        "namespace": "django-crd-operator", "name": "django-crd-operator-webhook",
        "port": 443, "path": "/convert"}
    assert manifest["metadata"]["annotations"] == {
        "cert-manager.io/inject-ca-from": "django-crd-operator/django-crd-operator-webhook"}
    assert crd(PodSet)["spec"]["conversion"] == {"strategy": "None"}
    assert "cert-manager.io/inject-ca-from" not in crd(PodSet)["metadata"].get("annotations", {})


def test_re_applying_a_converting_crd_keeps_the_registered_webhook():
    """A registered URL (the local stack, compose) or cert-manager's injected CA bundle
    survives the manifest being applied again; a manifest naming another Service wins."""
    from reconcilers.resources.apply import _keep_conversion_registration
    from reconcilers.resources.crd import crd
    from tests.operatorapp.resources import Gauge

    manifest = crd(Gauge)
    service = manifest["spec"]["conversion"]["webhook"]["clientConfig"]["service"]

    def live(client_config: dict) -> dict:
        return {"spec": {"conversion": {"strategy": "Webhook", "webhook": {
            "conversionReviewVersions": ["v1"], "clientConfig": client_config}}}}

    def applied(client_config: dict) -> dict:
        body = _keep_conversion_registration(manifest, live(client_config))
        return body["spec"]["conversion"]["webhook"]["clientConfig"]

    registered = {"url": "https://127.0.0.1:9443/convert", "caBundle": "Q0E="}
    assert applied(registered) == registered
    injected = {"service": service, "caBundle": "Q0E="}
    assert applied(injected) == injected
    assert applied({"service": {**service, "name": "old-name"}, "caBundle": "Q0E="}) == {
        "service": service}
    assert manifest["spec"]["conversion"]["webhook"]["clientConfig"] == {"service": service}
    none = {"spec": {"conversion": {"strategy": "None"}}}
    assert _keep_conversion_registration(manifest, none) == manifest


def test_register_only_admission_or_only_conversion(capsys, tmp_path):
    from django.core.management import call_command

    from tests.operatorapp.resources import Gauge  # noqa: F401 - registers the converting kind

    ca = tmp_path / "ca.pem"
    ca.write_bytes(b"-----BEGIN CERTIFICATE-----\nQ0E=\n-----END CERTIFICATE-----\n")
    register = ["webhook", "register", "--url", "https://127.0.0.1:9443", "--ca", str(ca),
                "--print", "--only"]
    call_command(*register, "admission")
    out = capsys.readouterr().out
    assert "ValidatingWebhookConfiguration" in out and "kubectl patch crd" not in out
    call_command(*register, "conversion")
    out = capsys.readouterr().out
    assert "WebhookConfiguration" not in out
    assert "kubectl patch crd gauges.conversion.operator.local" in out
    assert "foos.samplecontroller.k8s.io" not in out  # one version: nothing to convert
