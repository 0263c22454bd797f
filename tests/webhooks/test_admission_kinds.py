"""Hooks beyond CREATE and UPDATE of the project's own kinds, without the api-server: a
``Webhook`` on a built-in kind (registered as a resource is, answered from its review),
``validate_delete`` on the object being deleted, and the configurations both produce."""

from __future__ import annotations

import base64
import json

import pytest
from django.core.exceptions import ImproperlyConfigured

from reconcilers._webhooks import admission, registration
from reconcilers.api import ValidationError, Webhook
from reconcilers.resources import KindRegistry, Resource, fields


class DeploymentPolicy(Webhook):
    group, version, kind = "apps", "v1", "Deployment"

    class Meta:
        registry = None

    def default(self, request):
        self.raw["metadata"].setdefault("labels", {})["policy"] = "checked"

    def validate(self, old, request):
        for container in self.raw["spec"]["template"]["spec"]["containers"]:
            if container["image"].endswith(":latest"):
                raise ValidationError("spec.template.spec.containers",
                                      f"{container['image']}: pin a tag")
        return []

    def validate_delete(self, request):
        if (self.raw["metadata"].get("annotations") or {}).get("protected") == "true":
            raise ValidationError(f"Deployment {request.name} is protected")
        return [f"deleting {request.name}"]


class PodDeletions(Webhook):
    version, kind = "v1", "Pod"

    class Meta:
        registry = None

    def validate_delete(self, request):
        return []


class Spec(fields.Object):
    size = fields.Integer()


class Keepsake(Resource):
    group = "kinds.test.local"
    version = "v1"
    spec = Spec()

    class Meta:
        registry = None

    def validate_delete(self, request):
        raise ValidationError("a keepsake is kept")


@pytest.fixture
def registered(monkeypatch):
    kinds, resources = KindRegistry(), KindRegistry()
    kinds.register(DeploymentPolicy)
    kinds.register(PodDeletions)
    resources.register(Keepsake)
    monkeypatch.setattr(admission, "webhook_registry", kinds)
    monkeypatch.setattr(admission, "default_registry", resources)


def deployment(image="nginx:1.27", **annotations) -> dict:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "ns", "annotations": annotations},
            "spec": {"template": {"spec": {"containers": [{"name": "c", "image": image}]}}}}


def review(resource: dict, op: str, obj=None, old=None) -> dict:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u-1", "operation": op, "namespace": "ns", "name": "web", "resource": resource,
        "object": obj, "oldObject": old, "userInfo": {"username": "alice"}}}


DEPLOYMENTS = {"group": "apps", "version": "v1", "resource": "deployments"}


def test_a_built_in_kind_is_defaulted_and_validated_by_its_webhook_class(registered):
    mutated = admission.review(review(DEPLOYMENTS, "CREATE", deployment()), admission.MUTATE,
                               api=object())
    assert json.loads(base64.b64decode(mutated.response["response"]["patch"])) == [
        {"op": "add", "path": "/metadata/labels", "value": {"policy": "checked"}}]
    assert mutated.resource == "deployments.apps"
    denied = admission.review(review(DEPLOYMENTS, "UPDATE", deployment("nginx:latest"),
                                     deployment()), admission.VALIDATE, api=object())
    assert denied.allowed is False
    assert denied.response["response"]["status"]["message"] == (
        "spec.template.spec.containers: nginx:latest: pin a tag")


def test_validate_delete_judges_the_object_going_and_nothing_else_runs_on_delete(registered):
    denied = admission.review(review(DEPLOYMENTS, "DELETE", old=deployment(protected="true")),
                              admission.VALIDATE, api=object())
    assert denied.allowed is False and denied.operation == "DELETE"
    assert denied.response["response"]["status"]["message"] == "Deployment web is protected"
    allowed = admission.review(review(DEPLOYMENTS, "DELETE", old=deployment()),
                               admission.VALIDATE, api=object())
    assert allowed.response["response"] == {"uid": "u-1", "allowed": True,
                                            "warnings": ["deleting web"]}
    # validate() is not called on DELETE (no new object), default() never on DELETE.
    assert admission.review(review(DEPLOYMENTS, "DELETE", old=deployment("nginx:latest")),
                            admission.VALIDATE, api=object()).allowed
    assert "patch" not in admission.review(review(DEPLOYMENTS, "DELETE", old=deployment()),
                                           admission.MUTATE, api=object()).response["response"]
    # A resource of the project's own declares it the same way.
    kept = admission.review(review({"group": "kinds.test.local", "version": "v1",
                                    "resource": "keepsakes"}, "DELETE",
                                   old={"apiVersion": "kinds.test.local/v1", "kind": "Keepsake",
                                        "metadata": {"name": "k"}, "spec": {}}),
                            admission.VALIDATE, api=object())
    assert kept.allowed is False and "a keepsake is kept" in kept.message


def test_a_core_kind_is_found_by_its_plural_alone(registered):
    out = admission.review(review({"group": "", "version": "v1", "resource": "pods"}, "DELETE",
                                  old={"apiVersion": "v1", "kind": "Pod",
                                       "metadata": {"name": "p"}}),
                           admission.VALIDATE, api=object())
    assert out.allowed and out.resource == "pods"


def test_the_configurations_carry_each_kinds_operations_and_a_three_part_name():
    configs = registration.configurations([Keepsake, DeploymentPolicy, PodDeletions],
                                      ca_bundle=b"CA", url="https://127.0.0.1:9443")
    validating = {w["name"]: w["rules"] for w in configs[0]["webhooks"]}
    mutating = {w["name"]: w["rules"] for w in configs[1]["webhooks"]}
    assert validating == {
        "validate.keepsakes.kinds.test.local": [{
            "apiGroups": ["kinds.test.local"], "apiVersions": ["v1"], "operations": ["DELETE"],
            "resources": ["keepsakes"], "scope": "Namespaced"}],
        "validate.deployments.apps": [{
            "apiGroups": ["apps"], "apiVersions": ["v1"],
            "operations": ["CREATE", "UPDATE", "DELETE"], "resources": ["deployments"],
            "scope": "Namespaced"}],
        "validate.pods.core": [{
            "apiGroups": [""], "apiVersions": ["v1"], "operations": ["DELETE"],
            "resources": ["pods"], "scope": "Namespaced"}],
    }
    assert list(mutating) == ["mutate.deployments.apps"]
    assert mutating["mutate.deployments.apps"][0]["operations"] == ["CREATE", "UPDATE"]


def test_a_webhook_class_must_name_its_kind():
    with pytest.raises(ImproperlyConfigured, match="version and kind"):
        class Nameless(Webhook):
            group = "apps"

            class Meta:
                registry = None


def test_a_webhook_class_on_a_kind_a_resource_declares_is_refused(monkeypatch):
    class Keepsakes(Webhook):
        group, version, kind = "kinds.test.local", "v1", "Keepsake"

        class Meta:
            registry = None

        def validate(self, old, request):
            return []

    kinds, resources = KindRegistry(), KindRegistry()
    kinds.register(Keepsakes)
    resources.register(Keepsake)
    monkeypatch.setattr(admission, "webhook_registry", kinds)
    monkeypatch.setattr(registration, "default_registry", resources)
    with pytest.raises(ImproperlyConfigured, match="which a resource class declares"):
        registration.hooked_resources()
