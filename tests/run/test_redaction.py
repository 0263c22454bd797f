"""What a run's kept inputs hold of a Secret (or a kind a project marks sensitive): its keys,
never its values - in read answers, list answers and write bodies alike."""

from __future__ import annotations

import copy
import json

import pytest
from django.core.exceptions import ImproperlyConfigured

from reconcilers._base.conf import settings as conf
from reconcilers._run.redaction import REDACTED, Redaction

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
SECRETS = Redaction.configured  # the default: Secrets only

SECRET = {
    "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
    "metadata": {"name": "db", "namespace": "ns", "labels": {"app": "web"}, "annotations": {
        "note": "rotated monthly",
        LAST_APPLIED: json.dumps({"kind": "Secret", "stringData": {"password": "hunter2"}})}},
    "data": {"password": "aHVudGVyMg==", "user": "YWRtaW4="},
    "stringData": {"token": "t0k3n"},
}


def test_a_secret_keeps_its_keys_and_metadata_and_loses_every_value():
    before = copy.deepcopy(SECRET)
    out = SECRETS().object(SECRET)
    assert out["data"] == {"password": REDACTED, "user": REDACTED}
    assert out["stringData"] == {"token": REDACTED}
    assert out["type"] == REDACTED  # outside metadata, nothing is kept as it was
    assert (out["apiVersion"], out["kind"]) == ("v1", "Secret")
    assert out["metadata"]["labels"] == {"app": "web"}
    assert out["metadata"]["annotations"] == {"note": "rotated monthly", LAST_APPLIED: REDACTED}
    assert SECRET == before  # a copy: the run's own objects are left alone


def test_other_kinds_pass_unchanged_even_of_the_same_name_in_another_group():
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"},
              "data": {"color": "blue"}}
    own = {"apiVersion": "example.com/v1", "kind": "Secret", "metadata": {"name": "s"},
           "spec": {"value": "not a core Secret"}}
    assert SECRETS().object(config) == config
    assert SECRETS().object(own) == own
    assert SECRETS().object(None) is None


def test_get_and_list_answers_are_redacted_by_the_kind_read():
    r = SECRETS()
    got = r.read({"read": "get", "args": ["v1", "Secret", "db", "ns", None], "result": SECRET})
    assert got["result"]["data"] == {"password": REDACTED, "user": REDACTED}
    assert got["args"] == ["v1", "Secret", "db", "ns", None]
    missing = {"read": "get", "args": ["v1", "Secret", "gone", "ns", None], "result": None}
    assert r.read(missing) == missing
    # Items of a LIST may come without apiVersion and kind: the read's own say what they are.
    bare = {"metadata": {"name": "db"}, "data": {"password": "aHVudGVyMg=="}}
    listed = r.read({"read": "list", "args": ["v1", "Secret", "ns", None, None, None],
                     "result": [SECRET, bare]})
    assert [o["data"] for o in listed["result"]] == [
        {"password": REDACTED, "user": REDACTED}, {"password": REDACTED}]


def test_write_bodies_to_a_secret_are_redacted_whatever_their_shape():
    r = SECRETS()
    path = "/api/v1/namespaces/ns/secrets/db"
    created = r.write({"method": "POST", "path": "/api/v1/namespaces/ns/secrets",
                       "body": SECRET})
    assert created["body"]["data"] == {"password": REDACTED, "user": REDACTED}
    # A merge patch names neither apiVersion nor kind: the path says it is a Secret.
    merged = r.write({"method": "PATCH", "path": path, "body": {
        "metadata": {"resourceVersion": "7"}, "data": {"password": "bmV3", "old": None}}})
    assert merged["body"] == {"metadata": {"resourceVersion": "7"},
                              "data": {"password": REDACTED, "old": None}}
    # A JSON patch: each value as the object it would be part of.
    ops = r.write({"method": "PATCH", "path": path, "body": [
        {"op": "replace", "path": "/data/password", "value": "bmV3"},
        {"op": "add", "path": "/data", "value": {"user": "YWRtaW4="}},
        {"op": "add", "path": "/metadata/annotations/kubectl.kubernetes.io~1last-applied-"
                             "configuration", "value": "{...}"},
        {"op": "add", "path": "/metadata/labels/app", "value": "web"},
        {"op": "remove", "path": "/stringData/token"}]})
    assert [op.get("value") for op in ops["body"]] == [
        REDACTED, {"user": REDACTED}, REDACTED, "web", None]
    # A body that is not JSON (YAML sent as apply) cannot be picked apart: all of it goes.
    assert r.write({"method": "PATCH", "path": path, "body": "data:\n  password: x\n"}
                   )["body"] == REDACTED
    deleted = {"method": "DELETE", "path": path, "body": None}
    assert r.write(deleted) == deleted
    other = {"method": "PATCH", "path": "/api/v1/namespaces/ns/configmaps/db",
             "body": {"data": {"password": "plain"}}}
    assert r.write(other) == other


def test_more_kinds_are_redacted_when_a_project_says_so(settings):
    settings.RECONCILERS_REDACT_KINDS = " v1/ConfigMap , example.com/v1/Database "
    r = Redaction.configured()
    config = r.object({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"},
                       "data": {"dsn": "postgres://u:pw@db"}, "binaryData": {"k": "AA=="}})
    assert (config["data"], config["binaryData"]) == ({"dsn": REDACTED}, {"k": REDACTED})
    database = r.object({"apiVersion": "example.com/v1", "kind": "Database",
                         "metadata": {"name": "d"}, "status": {"ready": True},
                         "spec": {"admin": {"password": "pw", "port": 5432},
                                  "users": [{"name": "a"}], "note": None}})
    assert database["spec"] == {"admin": {"password": REDACTED, "port": REDACTED},
                                "users": [{"name": REDACTED}], "note": None}
    assert database["status"] == {"ready": REDACTED}
    written = r.write({"method": "PATCH",
                       "path": "/apis/example.com/v1/namespaces/ns/databases/d/status",
                       "body": {"status": {"ready": True}}})
    assert written["body"] == {"status": {"ready": REDACTED}}
    assert r.object(SECRET)["data"] == {"password": REDACTED, "user": REDACTED}  # still


@pytest.mark.parametrize("value", ["configmaps", "v1/configmaps", "/Secret", "v1/"])
def test_a_kind_that_is_not_api_version_slash_kind_is_a_clear_error(settings, value):
    settings.RECONCILERS_REDACT_KINDS = value
    with pytest.raises(ImproperlyConfigured, match="RECONCILERS_REDACT_KINDS"):
        conf()


@pytest.mark.django_db
def test_the_upgrade_redacts_secrets_in_inputs_kept_before_redaction():
    """Inputs kept by an older release hold Secret data as read: the migration that comes with
    redaction rewrites them, so no value stays at rest after the upgrade."""
    import importlib

    from django.apps import apps

    from reconcilers.models import RunInputs

    migration = importlib.import_module("reconcilers.migrations.0014_redact_kept_secrets")
    plain = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"},
             "data": {"k": "v"}}
    kept = RunInputs.objects.create(
        record_id=1, obj=plain,
        reads=[{"read": "get", "args": ["v1", "Secret", "db", "ns", None], "result": SECRET}],
        writes=[{"method": "POST", "path": "/api/v1/namespaces/ns/secrets", "body": SECRET}])
    untouched = RunInputs.objects.create(record_id=2, obj=plain)

    migration.redact_kept_inputs(apps, None)

    kept.refresh_from_db()
    stored = json.dumps([kept.obj, kept.reads, kept.writes])
    assert "aHVudGVyMg==" not in stored and "hunter2" not in stored and "t0k3n" not in stored
    assert kept.reads[0]["result"]["data"] == {"password": REDACTED, "user": REDACTED}
    assert kept.obj == plain
    untouched.refresh_from_db()
    assert (untouched.obj, untouched.reads, untouched.writes) == (plain, [], [])
