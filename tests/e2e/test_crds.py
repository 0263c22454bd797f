"""Generated CRDs against the real api-server: accepted as structural schemas, validating what
each field declares (422 naming the field), serving several versions, applied idempotently.

Every CRD here has its own group (``t<hex>.example.com``) and is deleted at the end, so tests
never collide with each other or with the sample's CRD.
"""

from __future__ import annotations

import sys
import textwrap
import uuid
from typing import Any, Callable, Iterator

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings
from kubernetes import client

from reconcilers._kube import kube as kube_module
from reconcilers.resources import (
    PrinterColumn, KindRegistry, Resource, Scale, Version, apply_crds, fields,
)
from reconcilers.resources.apply import CRD_PATH
from tests.helpers import wait_for

pytestmark = pytest.mark.e2e

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


def unique_group() -> str:
    return f"t{uuid.uuid4().hex[:10]}.example.com"


def _delete_crd(api: client.ApiClient, name: str) -> None:
    try:
        client.ApiextensionsV1Api(api).delete_custom_resource_definition(name)
    except client.ApiException as exc:
        if exc.status != 404:
            raise


@pytest.fixture
def installed(kube) -> Iterator[Callable[..., list[tuple[str, str]]]]:
    """Apply resources' CRDs (waiting for Established) and delete them after the test."""
    names: set[str] = set()

    def install(*resources: type[Resource]) -> list[tuple[str, str]]:
        names.update(r._meta.crd_name for r in resources)
        return apply_crds(resources, kube, timeout=60)

    yield install
    for name in names:
        _delete_crd(kube, name)


def read_crd(kube, resource: type[Resource]) -> dict:
    return kube_module.request(kube, "GET", f"{CRD_PATH}/{resource._meta.crd_name}")


def objects(kube) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(kube)


def create(kube, resource: type[Resource], namespace: str, name: str, spec: Any,
           version: str | None = None, **extra: Any) -> dict:
    meta = resource._meta
    version = version or meta.storage_version.name
    body = {"apiVersion": f"{meta.group}/{version}", "kind": meta.kind,
            "metadata": {"name": name}, "spec": spec, **extra}
    return objects(kube).create_namespaced_custom_object(
        meta.group, version, namespace, meta.plural, body)


def rejection(kube, resource: type[Resource], namespace: str, spec: Any) -> client.ApiException:
    with pytest.raises(client.ApiException) as err:
        create(kube, resource, namespace, f"bad-{uuid.uuid4().hex[:6]}", spec)
    return err.value


# --- one resource with every field type and option ---------------------------------------------

class Port(fields.Object):
    name = fields.String(required=True)
    port = fields.Integer(minimum=1, maximum=65535)


class Template(fields.Object):
    image = fields.String(required=True)
    pull_policy = fields.Enum(["Always", "IfNotPresent", "Never"], default="IfNotPresent")


class Free(fields.Object):
    mode = fields.String()


class KitchenSpec(fields.Object):
    name = fields.String(required=True, pattern=DNS_LABEL, min_length=3, max_length=10,
                         help_text="A short DNS label.")
    uid = fields.String(format="uuid")
    size = fields.Integer(minimum=1, maximum=10, default=3)
    ratio = fields.Number(minimum=0, maximum=1)
    enabled = fields.Boolean()
    color = fields.Enum(["red", "green"])
    level = fields.Enum([1, 2, 3])
    not_before = fields.DateTime()
    memory = fields.Quantity()
    max_unavailable = fields.IntOrString()
    tags = fields.List(fields.String(), min_items=1, max_items=3, unique=True)
    ports = fields.List(Port(), map_keys=["name"])
    labels = fields.Map(fields.String())
    limits = fields.Map(fields.Quantity())
    template = Template()
    free = Free(preserve_unknown_fields=True)
    strict = Free()
    note = fields.String(nullable=True)
    api_url = fields.String(json_name="apiURL")


class KitchenStatus(fields.Object):
    ready = fields.Boolean()
    observed_generation = fields.Integer()


@pytest.fixture(scope="module")
def kitchen(kube) -> Iterator[type[Resource]]:
    kitchen_group = unique_group()

    class Kitchen(Resource):
        """Every field type, for the api-server to judge."""

        group = kitchen_group
        version = "v1"
        spec = KitchenSpec(required=True)
        status = KitchenStatus()

        class Meta:
            registry = KindRegistry()
            printer_columns = [PrinterColumn("Size", "spec.size"),
                               PrinterColumn("Ready", "status.ready"), PrinterColumn.age()]

    assert apply_crds([Kitchen], kube) == [(Kitchen._meta.crd_name, "created")]
    yield Kitchen
    _delete_crd(kube, Kitchen._meta.crd_name)


VALID = {"name": "abc"}

INVALID = [
    # (case, spec, the field the 422 message must name, what it must say about it)
    ("required", {}, "spec.name", "Required value"),
    ("pattern", {"name": "Bad_Name"}, "spec.name", "should match"),
    ("min_length", {"name": "ab"}, "spec.name", "at least 3 chars"),
    ("max_length", {"name": "a" * 11}, "spec.name", "more than 10"),
    ("format", {**VALID, "uid": "not-a-uuid"}, "spec.uid", "type uuid"),
    ("integer type", {**VALID, "size": "three"}, "spec.size", "type integer"),
    ("integer minimum", {**VALID, "size": 0}, "spec.size", "greater than or equal to 1"),
    ("integer maximum", {**VALID, "size": 11}, "spec.size", "less than or equal to 10"),
    ("number type", {**VALID, "ratio": "half"}, "spec.ratio", "type number"),
    ("number maximum", {**VALID, "ratio": 1.5}, "spec.ratio", "less than or equal to 1"),
    ("boolean", {**VALID, "enabled": "yes"}, "spec.enabled", "type boolean"),
    ("string enum", {**VALID, "color": "blue"}, "spec.color", "Unsupported value"),
    ("integer enum", {**VALID, "level": 4}, "spec.level", "Unsupported value"),
    ("date-time", {**VALID, "notBefore": "yesterday"}, "spec.notBefore", "type date-time"),
    ("quantity", {**VALID, "memory": "lots"}, "spec.memory", "should match"),
    ("int-or-string", {**VALID, "maxUnavailable": 1.5}, "spec.maxUnavailable",
     "type integer,string"),
    ("list item type", {**VALID, "tags": [1]}, "spec.tags[0]", "type string"),
    ("list min_items", {**VALID, "tags": []}, "spec.tags", "at least 1 items"),
    ("list max_items", {**VALID, "tags": ["a", "b", "c", "d"]}, "spec.tags", "at most 3"),
    ("list unique (set)", {**VALID, "tags": ["a", "a"]}, "spec.tags[1]", "Duplicate value"),
    ("list map keys", {**VALID, "ports": [{"name": "a"}, {"name": "a"}]}, "spec.ports[1]",
     "Duplicate value"),
    ("list of objects", {**VALID, "ports": [{"name": "a", "port": 0}]}, "spec.ports[0].port",
     "greater than or equal to 1"),
    ("map value type", {**VALID, "labels": {"app": 1}}, "spec.labels.app", "type string"),
    ("map of quantities", {**VALID, "limits": {"cpu": "lots"}}, "spec.limits.cpu",
     "should match"),
    ("nested required", {**VALID, "template": {}}, "spec.template.image", "Required value"),
    ("nested enum", {**VALID, "template": {"image": "i", "pullPolicy": "Sometimes"}},
     "spec.template.pullPolicy", "Unsupported value"),
    ("preserved object keeps declared types", {**VALID, "free": {"mode": 1}},
     "spec.free.mode", "type string"),
    ("json_name override", {**VALID, "apiURL": 5}, "spec.apiURL", "type string"),
]


@pytest.mark.parametrize("case, spec, field, says", INVALID, ids=[c[0] for c in INVALID])
def test_an_invalid_object_is_rejected_with_422_naming_the_field(
        kube, namespace, kitchen, case, spec, field, says):
    error = rejection(kube, kitchen, namespace, spec)
    assert error.status == 422, error.body
    message = kube_module.ApiError.from_exception(error).message
    assert f"{field}: " in message and says in message, message


def test_a_valid_object_with_every_field_is_accepted_as_sent(kube, namespace, kitchen):
    spec = {
        "name": "abc", "uid": "7d9f3e0a-2b1c-4d5e-8f6a-0b1c2d3e4f5a", "size": 10, "ratio": 0.5,
        "enabled": True, "color": "green", "level": 2, "notBefore": "2024-05-01T10:00:00Z",
        "memory": "512Mi", "maxUnavailable": "25%", "tags": ["a", "b"],
        "ports": [{"name": "http", "port": 80}, {"name": "grpc", "port": 9090}],
        "labels": {"app": "x"}, "limits": {"cpu": "500m", "pods": 3},
        "template": {"image": "nginx", "pullPolicy": "Always"}, "free": {"mode": "m"},
        "strict": {"mode": "s"}, "note": "n", "apiURL": "https://example.com",
    }
    created = create(kube, kitchen, namespace, "full", spec)
    assert created["spec"] == spec
    assert create(kube, kitchen, namespace, "int-quantity", {**VALID, "memory": 2,
                                                            "maxUnavailable": 1})["spec"][
        "memory"] == 2


def test_defaults_are_applied_by_the_api_server(kube, namespace, kitchen):
    created = create(kube, kitchen, namespace, "defaults", {**VALID, "template": {"image": "i"}})
    assert created["spec"]["size"] == 3
    assert created["spec"]["template"]["pullPolicy"] == "IfNotPresent"


def test_unknown_fields_survive_only_where_preserved(kube, namespace, kitchen):
    created = create(kube, kitchen, namespace, "unknown", {
        **VALID, "free": {"mode": "m", "extra": {"a": 1}}, "strict": {"mode": "s", "extra": 1},
        "undeclared": True})
    assert created["spec"]["free"] == {"mode": "m", "extra": {"a": 1}}
    assert created["spec"]["strict"] == {"mode": "s"}
    assert "undeclared" not in created["spec"]


def test_null_is_kept_only_for_nullable_fields(kube, namespace, kitchen):
    created = create(kube, kitchen, namespace, "nulls", {**VALID, "note": None, "uid": None})
    assert created["spec"]["note"] is None
    assert "uid" not in created["spec"]


def test_help_text_is_the_served_schema_description(kube, kitchen):
    schema = read_crd(kube, kitchen)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert schema["description"] == "Every field type, for the api-server to judge."
    assert schema["properties"]["spec"]["properties"]["name"]["description"] == \
        "A short DNS label."


def test_status_is_written_through_the_status_subresource_from_typed_fields(
        kube, namespace, kitchen):
    meta = kitchen._meta
    obj = kitchen(create(kube, kitchen, namespace, "status", VALID,
                         status={"ready": True}))
    assert obj.status.ready is None  # the main resource ignores status
    obj.status.ready = True
    obj.status.observed_generation = obj.metadata.generation
    patched = objects(kube).patch_namespaced_custom_object_status(
        meta.group, "v1", namespace, meta.plural, "status", obj.status_patch())
    assert patched["status"] == {"ready": True, "observedGeneration": 1}
    assert patched["metadata"]["generation"] == 1


def test_printer_columns_are_served_as_a_table(kube, namespace, kitchen):
    meta = kitchen._meta
    create(kube, kitchen, namespace, "table", VALID)
    # What `kubectl get` asks for: the server renders the CRD's additionalPrinterColumns.
    table = kube_module.request(
        kube, "GET", f"/apis/{meta.group}/v1/namespaces/{namespace}/{meta.plural}",
        accept="application/json;as=Table;v=v1;g=meta.k8s.io")
    assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "Size", "Ready", "Age"]
    assert table["rows"][0]["cells"][:2] == ["table", 3]


# --- subresources, versions ---------------------------------------------------------------------

class ScaledSpec(fields.Object):
    replicas = fields.Integer(minimum=0, default=1)


class ScaledStatus(fields.Object):
    replicas = fields.Integer()
    selector = fields.String()


def test_the_scale_subresource_reads_and_writes_spec_replicas(kube, namespace, installed):
    scaled_group = unique_group()

    class Scaled(Resource):
        group = scaled_group
        version = "v1"
        spec = ScaledSpec()
        status = ScaledStatus()

        class Meta:
            registry = KindRegistry()
            scale = Scale("spec.replicas", "status.replicas", "status.selector")

    installed(Scaled)
    meta = Scaled._meta
    create(kube, Scaled, namespace, "s", {"replicas": 2})
    scale = objects(kube).get_namespaced_custom_object_scale(
        meta.group, "v1", namespace, meta.plural, "s")
    assert scale["spec"]["replicas"] == 2
    objects(kube).patch_namespaced_custom_object_scale(
        meta.group, "v1", namespace, meta.plural, "s", {"spec": {"replicas": 5}})
    got = objects(kube).get_namespaced_custom_object(meta.group, "v1", namespace, meta.plural, "s")
    assert got["spec"]["replicas"] == 5


class VersionedSpec(fields.Object):
    size = fields.Integer(minimum=1)
    owner = fields.String()


def versioned(versioned_group: str, injected: KindRegistry) -> type[Resource]:
    class Versioned(Resource):
        group = versioned_group
        versions = [
            Version("v1alpha1", deprecated=True, deprecation_warning="v1alpha1 is going; use v1"),
            Version("v1", storage=True),
        ]
        spec = VersionedSpec()

        class Meta:
            registry = injected

    return Versioned


def test_objects_written_through_either_version_read_back_through_both(
        kube, namespace, installed):
    resource = versioned(unique_group(), KindRegistry())
    installed(resource)
    meta = resource._meta
    create(kube, resource, namespace, "old", {"size": 1, "owner": "a"}, version="v1alpha1")
    create(kube, resource, namespace, "new", {"size": 2, "owner": "b"}, version="v1")
    for name, spec in (("old", {"size": 1, "owner": "a"}), ("new", {"size": 2, "owner": "b"})):
        for version in ("v1alpha1", "v1"):
            got = objects(kube).get_namespaced_custom_object(
                meta.group, version, namespace, meta.plural, name)
            assert got["apiVersion"] == f"{meta.group}/{version}"
            assert got["spec"] == spec
            assert resource(got).spec.size == spec["size"]
    stored = read_crd(kube, resource)
    assert stored["status"]["storedVersions"] == ["v1"]
    old = stored["spec"]["versions"][0]
    assert (old["name"], old["served"], old["deprecated"], old["storage"]) == (
        "v1alpha1", True, True, False)
    assert old["deprecationWarning"] == "v1alpha1 is going; use v1"
    assert stored["spec"]["conversion"] == {"strategy": "None"}


def converting(converting_group: str, injected: KindRegistry) -> type[Resource]:
    class HubSpec(fields.Object):
        size = fields.Integer()

    class SpokeSpec(fields.Object):
        count = fields.Integer()

    def to_hub(obj: dict) -> dict:
        obj["spec"] = {"size": (obj.get("spec") or {}).get("count")}
        return obj

    def from_hub(obj: dict) -> dict:
        obj["spec"] = {"count": (obj.get("spec") or {}).get("size")}
        return obj

    class Converting(Resource):
        group = converting_group
        versions = [Version("v1alpha1", storage=True, spec=HubSpec()),
                    Version("v1", spec=SpokeSpec(), to_hub=to_hub, from_hub=from_hub)]

        class Meta:
            registry = injected

    return Converting


def test_the_watcher_leaves_a_converting_crd_alone_while_nobody_serves_its_webhook(kube):
    """A converting CRD whose webhook has no server would make every list of its kind fail,
    the namespace controller's included: the watcher's CRD sync does not install it, and says
    why; once something accepts connections at the registered URL it does."""
    import socket

    from reconcilers._authoring import crds
    from reconcilers.resources.crd import crd

    resource = converting(unique_group(), KindRegistry())
    manifest = crd(resource)
    name = manifest["metadata"]["name"]
    service = manifest["spec"]["conversion"]["webhook"]["clientConfig"]["service"]
    outcome = crds.apply_if_served(kube, manifest)
    assert outcome.startswith("not applied")
    assert f"service {service['namespace']}/{service['name']} has no ready endpoint" in outcome
    assert kube_module.get_or_none(kube, f"{CRD_PATH}/{name}") is None

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        url = f"https://127.0.0.1:{listener.getsockname()[1]}/convert"
        manifest["spec"]["conversion"]["webhook"]["clientConfig"] = {"url": url}
        try:
            assert crds.apply_if_served(kube, manifest, timeout=60) == "created"
        finally:
            _delete_crd(kube, name)
    manifest["spec"]["conversion"]["webhook"]["clientConfig"] = {"url": url}
    assert "nothing accepts connections at" in crds.apply_if_served(kube, manifest)


def test_a_crd_that_stops_converting_drops_the_registration_another_manager_made(
        kube, installed):
    """Upgrading to a manifest without conversion (as the sample Foo did) must not fail on a
    webhook registration another field manager made - ``webhook serve --register``, or an
    operator by hand - and leaves a kind every version of which lists."""
    group = unique_group()
    old = converting(group, KindRegistry())
    installed(old)
    kube_module.request(kube, "PATCH", f"{CRD_PATH}/{old._meta.crd_name}", {"spec": {
        "conversion": {"strategy": "Webhook", "webhook": {
            "conversionReviewVersions": ["v1"],
            "clientConfig": {"url": "https://127.0.0.1:1/convert", "service": None}}}}},
        content_type=kube_module.MERGE_PATCH)

    from reconcilers.resources.crd import crd

    manifest = crd(old)  # the same kind, now one version that converts through nothing
    manifest["spec"]["versions"] = manifest["spec"]["versions"][:1]
    manifest["spec"]["conversion"] = {"strategy": "None"}
    assert apply_crds([manifest], kube, timeout=60) == [(old._meta.crd_name, "updated")]
    assert read_crd(kube, old)["spec"]["conversion"] == {"strategy": "None"}

    def lists() -> bool:  # the api-server rebuilds the kind's storage after the update
        try:
            kube_module.request(kube, "GET", f"/apis/{group}/v1alpha1/{old._meta.plural}")
        except kube_module.ApiError:
            return False
        return True
    wait_for(lists, 30, "the kind to list again")


# --- applying and regenerating ------------------------------------------------------------------

def gizmo(gizmo_group: str, maximum: int) -> type[Resource]:
    class GizmoSpec(fields.Object):
        size = fields.Integer(minimum=1, maximum=maximum)

    class Gizmo(Resource):
        group = gizmo_group
        version = "v1"
        spec = GizmoSpec()

        class Meta:
            registry = KindRegistry()

    return Gizmo


def test_apply_crds_is_idempotent_and_upgrades_a_changed_crd_in_place(
        kube, namespace, installed):
    group = unique_group()
    first, changed = gizmo(group, maximum=5), gizmo(group, maximum=50)
    name = first._meta.crd_name
    assert installed(first) == [(name, "created")]
    uid = read_crd(kube, first)["metadata"]["uid"]
    create(kube, first, namespace, "kept", {"size": 5})
    assert installed(first) == [(name, "unchanged")]
    assert installed(changed) == [(name, "updated")]
    stored = read_crd(kube, first)
    assert stored["metadata"]["uid"] == uid
    assert stored["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"]["size"]["maximum"] == 50
    assert installed(changed) == [(name, "unchanged")]
    assert objects(kube).get_namespaced_custom_object(
        group, "v1", namespace, "gizmos", "kept")["spec"] == {"size": 5}


class TempApp:
    """A throwaway installed app; ``declare`` (re)writes its ``resources.py``."""

    TEMPLATE = textwrap.dedent("""\
        from reconcilers.resources import Resource, fields


        class GizmoSpec(fields.Object):
            size = fields.Integer(minimum=1, maximum={maximum})


        class Gizmo(Resource):
            group = "{group}"
            version = "v1"
            spec = GizmoSpec()
        """)

    def __init__(self, label: str, path: Any, group: str) -> None:
        self.label, self.path, self.group = label, path, group
        self.crd_name = f"gizmos.{group}"
        self.manifest = path / "crds" / f"{self.crd_name}.yaml"

    def declare(self, maximum: int) -> None:
        (self.path / "resources.py").write_text(
            self.TEMPLATE.format(maximum=maximum, group=self.group))
        # The next autodiscover() imports the new source, as a restarted process would.
        sys.modules.pop(f"{self.label}.resources", None)


@pytest.fixture
def temp_app(tmp_path, monkeypatch) -> Iterator[TempApp]:
    from django.conf import settings

    from reconcilers.resources import default_registry

    label = f"crdapp_{uuid.uuid4().hex[:8]}"
    (tmp_path / label).mkdir()
    (tmp_path / label / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    app = TempApp(label, tmp_path / label, unique_group())
    with override_settings(INSTALLED_APPS=[*settings.INSTALLED_APPS, label]):
        yield app
    if app.crd_name in default_registry:
        default_registry.unregister(default_registry.get(app.crd_name))
    for module in [m for m in sys.modules if m == label or m.startswith(f"{label}.")]:
        del sys.modules[module]


def run(*args: str) -> str:
    import io

    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_makecrds_check_passes_for_the_committed_sample_manifests():
    assert "up to date" in run("makecrds", "samplecontroller", "podset", "--check")


def test_makecrds_check_fails_when_a_field_changes_without_regenerating(temp_app):
    temp_app.declare(maximum=5)
    with pytest.raises(CommandError, match=f"missing: .*{temp_app.crd_name}.yaml"):
        run("makecrds", temp_app.label, "--check")
    assert not temp_app.manifest.exists()
    assert "Wrote" in run("makecrds", temp_app.label)
    assert "maximum: 5" in temp_app.manifest.read_text()
    assert "up to date" in run("makecrds", temp_app.label, "--check")
    assert "No changes" in run("makecrds", temp_app.label)

    temp_app.declare(maximum=6)
    with pytest.raises(CommandError, match=f"stale: .*{temp_app.crd_name}.yaml"):
        run("makecrds", temp_app.label, "--check")
    assert "maximum: 5" in temp_app.manifest.read_text()
    run("makecrds", temp_app.label)
    assert "up to date" in run("makecrds", temp_app.label, "--check")


def test_applycrds_reports_created_unchanged_then_updated(kube, temp_app):
    temp_app.declare(maximum=5)
    try:
        assert run("applycrds", temp_app.label) == f"{temp_app.crd_name}: created\n"
        assert run("applycrds", temp_app.label) == f"{temp_app.crd_name}: unchanged\n"
        temp_app.declare(maximum=6)
        assert run("applycrds", temp_app.label) == f"{temp_app.crd_name}: updated\n"
        assert run("applycrds", temp_app.label) == f"{temp_app.crd_name}: unchanged\n"
    finally:
        _delete_crd(kube, temp_app.crd_name)


def test_applycrds_refuses_an_unknown_app():
    with pytest.raises(CommandError, match="nope"):
        run("applycrds", "nope")


# --- the sample --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def sample_foo_crd(kube) -> Iterator[tuple[str, dict]]:
    """The committed Foo manifest, applied under a private group (the real one is the lead's)."""
    import yaml

    from reconcilers.contrib.samplecontroller.resources import Foo
    from reconcilers.resources.manifests import manifest_path

    body = yaml.safe_load(manifest_path(Foo).read_text())
    group = unique_group()
    body["spec"]["group"] = group
    body["metadata"]["name"] = f"foos.{group}"
    try:
        assert apply_crds([body], kube) == [(f"foos.{group}", "created")]
        yield group, yaml.safe_load(
            (manifest_path(Foo).parent.parent / "examples" / "foo.yaml").read_text())
    finally:
        _delete_crd(kube, f"foos.{group}")


@pytest.mark.parametrize("spec, field", [
    ({"deploymentName": "x", "replicas": 0}, "spec.replicas"),
    ({"deploymentName": "x", "replicas": 101}, "spec.replicas"),
    ({"replicas": 1}, "spec.deploymentName"),
    ({"deploymentName": "Not_DNS"}, "spec.deploymentName"),
    ({"deploymentName": "a" * 254}, "spec.deploymentName"),
])
def test_the_sample_foo_accepts_the_example_and_rejects_what_upstream_let_through(
        kube, namespace, sample_foo_crd, spec, field):
    group, example = sample_foo_crd
    api = objects(kube)
    example = {**example, "apiVersion": f"{group}/v1alpha1"}
    created = api.create_namespaced_custom_object(group, "v1alpha1", namespace, "foos", example)
    assert created["metadata"]["name"] == "example-foo"
    assert created["spec"] == {"deploymentName": "example-foo", "replicas": 1}
    with pytest.raises(client.ApiException) as err:
        api.create_namespaced_custom_object(group, "v1alpha1", namespace, "foos", {
            **example, "metadata": {"name": "bad"}, "spec": spec})
    assert err.value.status == 422
    assert f"{field}: " in kube_module.ApiError.from_exception(err.value).message


class RangeSpec(fields.Object):
    name = fields.String(immutable=True)
    low = fields.Integer()
    high = fields.Integer()


def test_cel_rules_and_immutable_fields_are_enforced_by_the_api_server(kube, namespace,
                                                                       installed):
    ranged_group = unique_group()

    class Ranged(Resource):
        group = ranged_group
        version = "v1"
        spec = RangeSpec(rules=[fields.Rule("self.low <= self.high", "low may not exceed high",
                                            field_path=".low")])

        class Meta:
            registry = KindRegistry()

    installed(Ranged)
    schema = read_crd(kube, Ranged)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    spec = schema["properties"]["spec"]
    assert spec["x-kubernetes-validations"] == [
        {"rule": "self.low <= self.high", "message": "low may not exceed high",
         "fieldPath": ".low"}]
    create(kube, Ranged, namespace, "r", {"name": "first", "low": 1, "high": 2})
    api, meta = objects(kube), Ranged._meta
    for patch, message in [({"low": 5}, "spec.low: Invalid value: low may not exceed high"),
                           ({"name": "second"}, "name is immutable")]:
        with pytest.raises(client.ApiException) as err:
            api.patch_namespaced_custom_object(meta.group, "v1", namespace, meta.plural, "r",
                                               {"spec": patch})
        assert err.value.status == 422
        assert message in kube_module.ApiError.from_exception(err.value).message
    api.patch_namespaced_custom_object(meta.group, "v1", namespace, meta.plural, "r",
                                       {"spec": {"low": 2}})  # within the rule: accepted
