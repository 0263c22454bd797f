"""Resource classes generate the schemas, CRDs and typed access they declare (no I/O)."""

from __future__ import annotations

import enum
from datetime import datetime, timedelta, timezone

import pytest
import yaml
from django.core.exceptions import ImproperlyConfigured

from reconcilers.resources import (
    PrinterColumn, KindRegistry, Resource, Scale, Version, crd, fields, render,
)
from reconcilers.resources.fields import QUANTITY_PATTERN, camel_case


@pytest.fixture
def registry() -> KindRegistry:
    return KindRegistry()


def schema_of(field: fields.Field) -> dict:
    class Holder(fields.Object):
        value = field

    return Holder().schema()["properties"]["value"]


class Color(str, enum.Enum):
    RED = "red"
    GREEN = "green"


# --- names -------------------------------------------------------------------------------------

@pytest.mark.parametrize("python, json", [
    ("replicas", "replicas"), ("deployment_name", "deploymentName"),
    ("max_surge_percent", "maxSurgePercent"), ("class_", "class"),
])
def test_json_names_are_lower_camel_case(python, json):
    assert camel_case(python) == json


def test_json_name_overrides_the_conversion():
    class Spec(fields.Object):
        api_url = fields.String(json_name="apiURL")

    assert list(Spec().schema()["properties"]) == ["apiURL"]


def test_two_fields_with_one_json_name_are_refused():
    with pytest.raises(TypeError, match="share the JSON name"):
        class Spec(fields.Object):
            api_url = fields.String()
            apiUrl = fields.String()


# --- field types -------------------------------------------------------------------------------

def test_string_options_map_to_openapi_keywords():
    assert schema_of(fields.String(pattern="^[a-z]+$", min_length=1, max_length=9,
                                   format="hostname")) == {
        "type": "string", "format": "hostname", "pattern": "^[a-z]+$",
        "minLength": 1, "maxLength": 9,
    }


def test_integer_and_number_carry_bounds():
    assert schema_of(fields.Integer(minimum=1, maximum=5)) == {
        "type": "integer", "minimum": 1, "maximum": 5}
    assert schema_of(fields.Number(minimum=0, maximum=0.5)) == {
        "type": "number", "minimum": 0, "maximum": 0.5}


def test_boolean_and_date_time():
    assert schema_of(fields.Boolean()) == {"type": "boolean"}
    assert schema_of(fields.DateTime()) == {"type": "string", "format": "date-time"}


def test_enum_takes_strings_integers_or_an_enum_class():
    assert schema_of(fields.Enum(["a", "b"])) == {"type": "string", "enum": ["a", "b"]}
    assert schema_of(fields.Enum([1, 2])) == {"type": "integer", "enum": [1, 2]}
    assert schema_of(fields.Enum(Color)) == {"type": "string", "enum": ["red", "green"]}
    with pytest.raises(TypeError):
        fields.Enum(["a", 1])


def test_quantity_is_an_int_or_string_with_the_quantity_pattern():
    assert schema_of(fields.Quantity()) == {
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        "pattern": QUANTITY_PATTERN,
        "x-kubernetes-int-or-string": True,
    }


def test_int_or_string():
    assert schema_of(fields.IntOrString()) == {
        "anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": True}


def test_list_of_a_type_with_bounds():
    assert schema_of(fields.List(fields.Integer(minimum=0), min_items=1, max_items=3)) == {
        "type": "array", "items": {"type": "integer", "minimum": 0},
        "minItems": 1, "maxItems": 3,
    }


def test_unique_list_of_scalars_is_a_set_not_unique_items():
    out = schema_of(fields.List(fields.String(), unique=True))
    assert out["x-kubernetes-list-type"] == "set"
    assert "uniqueItems" not in out


class Port(fields.Object):
    name = fields.String(required=True)
    port = fields.Integer()


def test_unique_list_of_objects_is_refused():
    with pytest.raises(TypeError, match="scalars"):
        fields.List(Port(), unique=True)


def test_list_of_objects_keyed_by_a_required_field_is_a_map_list():
    out = schema_of(fields.List(Port(), map_keys=["name"]))
    assert out["x-kubernetes-list-type"] == "map"
    assert out["x-kubernetes-list-map-keys"] == ["name"]
    with pytest.raises(TypeError, match="required"):
        fields.List(Port(), map_keys=["port"])


def test_map_is_additional_properties():
    assert schema_of(fields.Map(fields.Quantity())) == {
        "type": "object", "additionalProperties": schema_of(fields.Quantity())}


def test_nested_object_lists_properties_in_declaration_order_and_required():
    class Inner(fields.Object):
        image = fields.String(required=True)
        tag = fields.String()

    assert schema_of(Inner(required=True)) == {
        "type": "object",
        "properties": {"image": {"type": "string"}, "tag": {"type": "string"}},
        "required": ["image"],
    }


def test_unknown_fields_are_preserved_only_where_asked():
    class Free(fields.Object):
        mode = fields.String()

    assert "x-kubernetes-preserve-unknown-fields" not in schema_of(Free())
    assert schema_of(Free(preserve_unknown_fields=True))[
        "x-kubernetes-preserve-unknown-fields"] is True


def test_help_text_default_and_nullable():
    assert schema_of(fields.Integer(help_text="How many.", default=1, nullable=True)) == {
        "description": "How many.", "type": "integer", "default": 1, "nullable": True}


def test_defaults_are_stored_in_json_form():
    when = datetime(2024, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    assert schema_of(fields.DateTime(default=when))["default"] == "2024-01-02T03:04:05Z"
    assert schema_of(fields.Enum(Color, default=Color.GREEN))["default"] == "green"
    with pytest.raises(ValueError):
        fields.Enum(["a"], default="b")


# --- resources and CRDs ------------------------------------------------------------------------

class WidgetSpec(fields.Object):
    size = fields.Integer(minimum=1, default=1, help_text="How big.")
    owner_name = fields.String(required=True)


class WidgetStatus(fields.Object):
    ready_replicas = fields.Integer()
    replicas = fields.Integer()
    ratio = fields.Number()
    selector = fields.String()
    last_seen = fields.DateTime()
    phase = fields.Enum(Color)
    tags = fields.List(fields.String())
    ports = fields.List(Port())
    counts = fields.Map(fields.Integer())
    port = Port()


def declare(registry: KindRegistry, **meta) -> type[Resource]:
    meta.setdefault("registry", registry)

    class Widget(Resource):
        """A widget."""

        group = "widgets.example.com"
        version = "v1"
        spec = WidgetSpec(required=True)
        status = WidgetStatus()
        Meta = type("Meta", (), meta)

    return Widget


def test_names_default_from_the_kind(registry):
    spec = crd(declare(registry))["spec"]
    assert spec["names"] == {"kind": "Widget", "listKind": "WidgetList",
                             "plural": "widgets", "singular": "widget"}
    assert spec["scope"] == "Namespaced"


def test_meta_names_scope_short_names_and_categories(registry):
    doc = crd(declare(registry, plural="gizmos", singular="gizmo", short_names=["gz"],
                      categories=["all"], scope="Cluster"))
    assert doc["metadata"]["name"] == "gizmos.widgets.example.com"
    assert doc["spec"]["names"] == {"kind": "Widget", "listKind": "WidgetList",
                                    "plural": "gizmos", "singular": "gizmo",
                                    "shortNames": ["gz"], "categories": ["all"]}
    assert doc["spec"]["scope"] == "Cluster"


@pytest.mark.parametrize("meta, message", [
    ({"scope": "Global"}, "scope"),
    ({"plural": "Widgets"}, "DNS label"),
])
def test_invalid_meta_is_refused_at_class_definition(registry, meta, message):
    with pytest.raises(ImproperlyConfigured, match=message):
        declare(registry, **meta)


def test_protected_groups_need_the_approval_annotation(registry):
    with pytest.raises(ImproperlyConfigured, match="api-approved"):
        class Thing(Resource):
            group = "things.k8s.io"
            version = "v1"

            class Meta:
                registry = None


def test_schema_has_spec_status_and_required_spec(registry):
    version = crd(declare(registry))["spec"]["versions"][0]
    root = version["schema"]["openAPIV3Schema"]
    assert root["description"] == "A widget."
    assert list(root["properties"]) == ["apiVersion", "kind", "metadata", "spec", "status"]
    assert root["required"] == ["spec"]
    spec = root["properties"]["spec"]
    assert spec["properties"]["ownerName"] == {"type": "string"}
    assert spec["properties"]["size"]["description"] == "How big."
    assert spec["required"] == ["ownerName"]


def test_status_subresource_is_on_when_a_status_is_declared(registry):
    assert crd(declare(registry))["spec"]["versions"][0]["subresources"] == {"status": {}}
    off = crd(declare(KindRegistry(), status_subresource=False))
    assert "subresources" not in off["spec"]["versions"][0]


def test_scale_subresource_resolves_python_paths(registry):
    doc = crd(declare(registry, scale=Scale("spec.size", "status.ready_replicas",
                                            "status.selector")))
    assert doc["spec"]["versions"][0]["subresources"]["scale"] == {
        "specReplicasPath": ".spec.size", "statusReplicasPath": ".status.readyReplicas",
        "labelSelectorPath": ".status.selector"}
    with pytest.raises(ImproperlyConfigured, match="Integer"):
        declare(KindRegistry(), scale=Scale("spec.owner_name", "status.replicas"))
    with pytest.raises(ImproperlyConfigured, match="Integer"):
        declare(KindRegistry(), scale=Scale("spec.size", "status.ratio"))


def test_printer_columns_derive_type_path_and_description_from_fields(registry):
    widget = declare(registry, printer_columns=[
        PrinterColumn("Owner", "spec.owner_name"),
        PrinterColumn("Size", "spec.size", priority=1),
        PrinterColumn("Seen", "status.last_seen"),
        PrinterColumn("First port", ".status.ports[0].port", type="integer"),
        PrinterColumn.age(),
    ])
    columns = crd(widget)["spec"]["versions"][0]["additionalPrinterColumns"]
    assert columns == [
        {"name": "Owner", "type": "string", "jsonPath": ".spec.ownerName"},
        {"name": "Size", "type": "integer", "jsonPath": ".spec.size",
         "description": "How big.", "priority": 1},
        {"name": "Seen", "type": "date", "jsonPath": ".status.lastSeen"},
        {"name": "First port", "type": "integer", "jsonPath": ".status.ports[0].port"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]


def test_a_printer_column_naming_no_field_fails_at_class_definition(registry):
    with pytest.raises(ImproperlyConfigured, match="spec.sise"):
        declare(registry, printer_columns=[PrinterColumn("Size", "spec.sise")])


# --- versions ----------------------------------------------------------------------------------

def test_a_single_version_is_served_and_stored_with_no_conversion(registry):
    spec = crd(declare(registry))["spec"]
    assert [(v["name"], v["served"], v["storage"]) for v in spec["versions"]] == [
        ("v1", True, True)]
    assert spec["conversion"] == {"strategy": "None"}


def test_several_versions_one_storage_with_deprecation(registry):
    class V1Spec(WidgetSpec):
        colour = fields.String()

    class Gadget(Resource):
        group = "gadgets.example.com"
        versions = [
            Version("v1alpha1", served=False),
            Version("v1beta1", deprecated=True, deprecation_warning="use v1"),
            Version("v1", storage=True, spec=V1Spec()),
        ]
        spec = WidgetSpec()

        class Meta:
            registry = KindRegistry()

    versions = crd(Gadget)["spec"]["versions"]
    assert [(v["name"], v["served"], v["storage"]) for v in versions] == [
        ("v1alpha1", False, False), ("v1beta1", True, False), ("v1", True, True)]
    assert versions[1]["deprecated"] is True and versions[1]["deprecationWarning"] == "use v1"
    assert "deprecated" not in versions[2]
    props = [v["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"] for v in versions]
    assert "colour" not in props[0] and "colour" in props[2]
    assert Gadget._meta.storage_version.name == "v1"


@pytest.mark.parametrize("declared, message", [
    ([Version("v1"), Version("v2")], "exactly one"),
    ([Version("v1", storage=True), Version("v2", storage=True)], "exactly one"),
    ([Version("v1", storage=True), Version("v1")], "duplicate"),
    ([Version("v1", storage=True, deprecation_warning="x")], "not deprecated"),
    ([], "either"),
])
def test_invalid_versions_are_refused(declared, message):
    with pytest.raises(ImproperlyConfigured, match=message):
        class Gadget(Resource):
            group = "gadgets.example.com"
            versions = declared

            class Meta:
                registry = None


# --- deterministic YAML ------------------------------------------------------------------------

def test_rendering_twice_gives_identical_bytes(registry):
    widget = declare(registry, printer_columns=[PrinterColumn.age()],
                     scale=Scale("spec.size", "status.replicas"))
    assert render(widget).encode() == render(widget).encode()
    assert render(widget) == render(declare(KindRegistry(), printer_columns=[PrinterColumn.age()],
                                            scale=Scale("spec.size", "status.replicas")))


def test_yaml_keeps_the_manifest_key_order_and_round_trips(registry):
    widget = declare(registry)
    text = render(widget)
    assert [line for line in text.splitlines() if line and line[0] not in " #-"] == [
        "apiVersion: apiextensions.k8s.io/v1", "kind: CustomResourceDefinition",
        "metadata:", "spec:"]
    assert yaml.safe_load(text) == crd(widget)
    assert crd(widget)["metadata"] == {"name": "widgets.widgets.example.com"}  # no timestamps


# --- registry ----------------------------------------------------------------------------------

def test_a_resource_registers_itself_in_the_injected_registry(registry):
    widget = declare(registry)
    assert list(registry) == [widget]
    assert registry.get("widgets.widgets.example.com") is widget
    assert "widgets.widgets.example.com" in registry


def test_redefining_the_same_class_replaces_it_but_a_different_class_is_refused(registry):
    first = declare(registry)
    second = declare(registry)
    assert registry.get("widgets.widgets.example.com") is second is not first
    with pytest.raises(ImproperlyConfigured, match="declared twice"):
        class Widget(Resource):
            group = "widgets.example.com"
            version = "v1"

            class Meta:
                registry = second._meta.registry


def test_abstract_resources_and_registry_none_register_nowhere(registry):
    injected = registry

    class Base(Resource):
        group = "bases.example.com"
        version = "v1"

        class Meta:
            abstract = True

    class Concrete(Base):
        class Meta:
            registry = injected

    class Unlisted(Base):
        class Meta:
            registry = None

    assert not hasattr(Base, "_meta")
    assert list(registry) == [Concrete]
    assert Unlisted._meta.crd_name == "unlisteds.bases.example.com"
    registry.clear()
    assert len(registry) == 0


def test_autodiscover_registers_the_resources_of_installed_apps():
    from reconcilers.resources import autodiscover, default_registry

    autodiscover()
    foo = default_registry.get("foos.samplecontroller.k8s.io")
    assert foo.__module__ == "reconcilers.contrib.samplecontroller.resources"
    assert foo in default_registry.for_apps(["samplecontroller"])


# --- typed access ------------------------------------------------------------------------------

def widget_obj(**status) -> dict:
    return {
        "apiVersion": "widgets.example.com/v1", "kind": "Widget",
        "metadata": {"name": "w", "namespace": "ns", "resourceVersion": "7", "generation": 2},
        "spec": {"ownerName": "ana", "extra": "kept"},
        **({"status": status} if status else {}),
    }


def test_spec_and_metadata_read_by_python_names(registry):
    widget = declare(registry)(widget_obj())
    assert widget.spec.owner_name == "ana"
    assert widget.spec.size == 1  # the declared default, when the object has none
    assert widget.metadata.name == "w" and widget.metadata.resource_version == "7"
    assert widget.metadata.labels is None
    assert widget.raw["spec"]["extra"] == "kept"
    with pytest.raises(AttributeError, match="owner_name"):
        widget.spec.owner


def test_wrapping_copies_so_the_cached_object_is_never_modified(registry):
    obj = widget_obj(replicas=1)
    widget = declare(registry)(obj)
    widget.status.replicas = 5
    widget.spec.size = 3
    assert obj["status"] == {"replicas": 1} and "size" not in obj["spec"]


def test_status_writes_become_a_camel_case_merge_patch(registry):
    widget = declare(registry)(widget_obj())
    assert widget.status.ready_replicas is None
    assert widget.status_patch() == {}
    widget.status.ready_replicas = 2
    assert widget.status_patch() == {"status": {"readyReplicas": 2}}


def test_status_patch_holds_only_changes_and_nulls_removals(registry):
    widget = declare(registry)(widget_obj(replicas=1, readyReplicas=1, selector="a=b",
                                          port={"name": "http", "port": 80}))
    widget.status.ready_replicas = 1
    widget.status.replicas = 3
    widget.status.selector = None
    widget.status.port.port = 8080
    assert widget.status_patch() == {"status": {
        "replicas": 3, "selector": None, "port": {"port": 8080}}}


def test_lists_maps_and_nested_objects_write_through(registry):
    widget = declare(registry)(widget_obj())
    widget.status.tags.append("a")
    widget.status.tags += ["b"]
    widget.status.ports.append({"name": "http", "port": 80})
    widget.status.ports[0].port = 81
    widget.status.counts["ok"] = 3
    widget.status.port = {"name": "grpc"}
    assert widget.status.tags == ["a", "b"]
    assert widget.status.ports[0].name == "http"
    assert dict(widget.status.counts) == {"ok": 3}
    assert widget.status_patch() == {"status": {
        "tags": ["a", "b"], "ports": [{"name": "http", "port": 81}],
        "counts": {"ok": 3}, "port": {"name": "grpc"}}}


def test_typed_values_convert_both_ways(registry):
    widget = declare(registry)(widget_obj(lastSeen="2024-05-01T10:00:00Z", phase="red"))
    assert widget.status.last_seen == datetime(2024, 5, 1, 10, tzinfo=timezone.utc)
    assert widget.status.phase is Color.RED
    widget.status.last_seen = datetime(2024, 5, 1, 12, tzinfo=timezone(timedelta(hours=2)))
    widget.status.phase = Color.GREEN
    assert widget.raw["status"] == {"lastSeen": "2024-05-01T10:00:00Z", "phase": "green"}


@pytest.mark.parametrize("name, value, error", [
    ("replicas", "2", TypeError), ("replicas", True, TypeError),
    ("phase", "blue", ValueError), ("tags", "abc", TypeError),
    ("last_seen", datetime(2024, 1, 1), ValueError),
])
def test_writing_the_wrong_type_fails_before_any_request(registry, name, value, error):
    widget = declare(registry)(widget_obj())
    with pytest.raises(error):
        setattr(widget.status, name, value)
    assert widget.status_patch() == {}


def test_the_object_version_picks_the_schema(registry):
    class V1Spec(fields.Object):
        colour = fields.String()

    class Gadget(Resource):
        group = "gadgets.example.com"
        versions = [Version("v1alpha1"), Version("v1", storage=True, spec=V1Spec())]
        spec = WidgetSpec()

        class Meta:
            registry = KindRegistry()

    old = Gadget({"apiVersion": "gadgets.example.com/v1alpha1", "spec": {"ownerName": "x"}})
    new = Gadget({"apiVersion": "gadgets.example.com/v1", "spec": {"colour": "blue"}})
    assert old.spec.owner_name == "x" and new.spec.colour == "blue"
    with pytest.raises(AttributeError):
        new.spec.owner_name


# --- the sample --------------------------------------------------------------------------------

def test_the_sample_foo_validates_what_upstream_leaves_to_the_controller():
    from reconcilers.contrib.samplecontroller.resources import Foo

    root = crd(Foo)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    spec = root["properties"]["spec"]
    assert spec["required"] == ["deploymentName"]
    assert spec["properties"]["replicas"]["minimum"] == 1
    assert spec["properties"]["deploymentName"]["maxLength"] == 253
    assert Foo._meta.crd_name == "foos.samplecontroller.k8s.io"
    foo = Foo({"spec": {"deploymentName": "example-foo"}})
    foo.status.available_replicas = 1
    assert foo.status_patch() == {"status": {"availableReplicas": 1}}


def test_the_old_name_of_the_kind_registry_imports_with_a_deprecation_warning():
    """``reconcilers.resources.Registry`` is ``KindRegistry`` for one release, named in a
    warning and not exported by ``import *``."""
    import reconcilers.resources as resources

    with pytest.warns(DeprecationWarning, match=r"reconcilers\.resources\.KindRegistry"):
        from reconcilers.resources import Registry as old
    assert old is resources.KindRegistry
    assert "Registry" not in resources.__all__
    with pytest.raises(AttributeError, match="Registri"):
        resources.Registri
