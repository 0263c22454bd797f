"""The shared words: one key format, one plural rule, one clock."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from reconcilers.api import Owns, Reconciler
from reconcilers._base.vocab import GVR, object_path, parse_rfc3339, plural, rfc3339
from reconcilers._base.reconcile import Key


def test_a_key_prints_and_parses_back():
    for key in (Key("foos.example.com", "ns", "a"), Key("nodes", "", "n1")):
        assert Key.parse(str(key)) == key
    assert str(Key("foos.example.com", "ns", "a")) == "foos.example.com:ns/a"


@pytest.mark.parametrize("text", ["", "no-colon", "r:", ":ns/a", "r:ns/"])
def test_a_malformed_key_is_refused_with_its_text(text):
    with pytest.raises(ValueError, match="malformed key"):
        Key.parse(text)


def test_the_object_part_of_a_key_is_the_cache_field():
    assert object_path("ns", "a") == "ns/a"
    assert object_path(None, "n1") == "n1"


@pytest.mark.parametrize("kind,expected", [
    ("Deployment", "deployments"), ("NetworkPolicy", "networkpolicies"),
    ("Ingress", "ingresses"), ("Gateway", "gateways"), ("Box", "boxes"),
    ("Match", "matches"), ("Mesh", "meshes"), ("Quiz", "quizes"), ("ConfigMap", "configmaps"),
])
def test_one_plural_rule(kind, expected):
    assert plural(kind) == expected


def test_owned_and_primary_resources_of_one_kind_get_the_same_plural():
    class Policies(Reconciler):
        group, version, kind = "networking.k8s.io", "v1", "NetworkPolicy"

    assert Owns("networking.k8s.io/v1", "NetworkPolicy").gvr() == Policies.primary()
    assert GVR.of("networking.k8s.io/v1", "NetworkPolicy").plural == "networkpolicies"


def test_paths_of_core_and_grouped_resources():
    cm = GVR.of("v1", "ConfigMap")
    assert cm.path("ns", "x") == "/api/v1/namespaces/ns/configmaps/x"
    deploy = GVR.of("apps/v1", "Deployment")
    assert deploy.path() == "/apis/apps/v1/deployments"
    node = GVR.of("v1", "Node", namespaced=False)
    assert node.path("ignored", "n1") == "/api/v1/nodes/n1"


def test_kubernetes_timestamps_round_trip():
    t = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=timezone.utc)
    assert rfc3339(t) == "2026-01-02T03:04:05Z"
    assert rfc3339(t, micros=True) == "2026-01-02T03:04:05.678901Z"
    assert parse_rfc3339(rfc3339(t, micros=True)) == t
    assert parse_rfc3339("") is None
