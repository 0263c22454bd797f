"""Replay: a failed run's inputs kept, the fixed code run against exactly them, writes
captured - on the real api-server, PostgreSQL and Redis."""

from __future__ import annotations

import base64
import io
import json
import uuid

import pytest
from django.core.management import call_command
from django.db import connection
from kubernetes import client

from reconcilers._run import replay
from reconcilers.api import Reconciler, ReconcilerRegistry, register
from reconcilers.models import ReconcileRecord, RunInputs
from tests.kube.test_context import GROUP, VERSION, probe, run_once  # noqa: F401 - fixture

pytestmark = pytest.mark.django_db(transaction=True)

WORDS = {"one": 1, "two": 2, "three": 3}


def _reconciler(fixed: bool):
    class Sizer(Reconciler):
        group, version, kind = GROUP, VERSION, "Probe"

        def reconcile(self, obj, ctx):
            settings = ctx.get("v1", "ConfigMap", "sizing") or {"data": {}}
            raw = settings["data"]["replicas"]
            replicas = WORDS.get(raw, raw) if fixed else raw
            replicas = int(replicas)  # the bug: "three" raises ValueError
            ctx.create_or_update({"apiVersion": "v1", "kind": "ConfigMap",
                                  "metadata": {"name": f"{obj['metadata']['name']}-size"},
                                  "data": {"replicas": str(replicas)}})
            ctx.patch_status({"replicas": replicas})

    Sizer.__name__ = "Sizer"
    return Sizer


def test_a_failed_run_replayed_with_the_fix_succeeds_and_sends_nothing(
        kube, probe, namespace, redis_client, settings):  # noqa: F811
    settings.RECONCILERS_RECORD_INPUTS = "failed"
    core = client.CoreV1Api(kube)
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "sizing"},
                                                  "data": {"replicas": "three"}})
    buggy = ReconcilerRegistry()
    register(registry=buggy)(_reconciler(fixed=False))
    name = _reconciler(False).name()

    report = run_once(buggy, "p", namespace, name)
    record = ReconcileRecord.objects.get(pk=report.record_id)
    assert record.outcome == "error" and "invalid literal" in record.error_message
    kept = RunInputs.objects.get(record_id=record.pk)
    assert kept.obj["metadata"]["name"] == "p"
    assert [r["read"] for r in kept.reads] == ["get"]
    assert kept.reads[0]["result"]["data"] == {"replicas": "three"}

    # The data changes since: a replay must not see it - it runs on what the run read.
    core.patch_namespaced_config_map("sizing", namespace, {"data": {"replicas": "nine"}})

    # The fix, replayed: success, and the writes it would make - none of them sent.
    fixed = ReconcilerRegistry()
    register(registry=fixed)(_reconciler(fixed=True))
    result = replay.replay(record.pk, registry=fixed)
    assert (result.recorded_outcome, result.outcome) == ("error", "success"), result.report()
    assert [(w["method"], w["path"].rsplit("/", 2)[-2:]) for w in result.writes] == [
        ("POST", [namespace, "configmaps"]), ("PATCH", ["p", "status"])], result.writes
    assert result.writes[0]["body"]["data"] == {"replicas": "3"}
    # The fix reads what the failed run never reached: answered as not found, and said.
    assert result.unrecorded == [f"get(v1, ConfigMap, p-size, {namespace})"]
    assert "could not answer" in result.report()
    assert "p-size" not in [c.metadata.name for c in
                            core.list_namespaced_config_map(namespace).items]
    status = client.CustomObjectsApi(kube).get_namespaced_custom_object(
        GROUP, VERSION, namespace, "probes", "p").get("status") or {}
    assert "replicas" not in status

    # The failure, kept as a regression test: it replays the same inputs on the fixed code.
    source = replay.regression_test(record.pk)
    module: dict = {}
    exec(compile(source, "test_regression.py", "exec"), module)
    assert replay.replay_inputs(module["INPUTS"], registry=fixed).outcome == "success"
    assert replay.replay_inputs(module["INPUTS"], registry=buggy).outcome == "error"


def test_a_replay_is_the_runners_own_attempt_as_the_recorded_run_was(
        kube, probe, namespace, redis_client, settings, monkeypatch):  # noqa: F811
    """A replay is no copy of the runner's steps: it goes through ``call.attempt``, the one
    a worker's run takes, on the record's inputs - so whatever a run does around user code
    (reading the object, capturing what it raises, writing a typed status, deciding what
    follows) a replay does the same."""
    from reconcilers._run import call

    settings.RECONCILERS_RECORD_INPUTS = "failed"
    attempts, real = [], call.attempt

    def seen(key, cls, registry, **options):
        done = real(key, cls, registry, **options)
        attempts.append((key, options["attempts"], list(options["triggers"]),
                         done.decision.outcome, done.decision.error_class,
                         done.decision.error_message))
        return done

    monkeypatch.setattr(call, "attempt", seen)
    client.CoreV1Api(kube).create_namespaced_config_map(
        namespace, {"metadata": {"name": "sizing"}, "data": {"replicas": "three"}})
    buggy = ReconcilerRegistry()
    register(registry=buggy)(_reconciler(fixed=False))

    report = run_once(buggy, "p", namespace, _reconciler(False).name())  # a worker's run
    result = replay.replay(report.record_id, registry=buggy)
    assert len(attempts) == 2, "the replay did not go through call.attempt"
    ran, replayed = attempts
    assert replayed == ran and ran[3:5] == ("error", "builtins.ValueError")
    assert (result.recorded_outcome, result.outcome) == ("error", "error")


def _auditor(fixed: bool):
    """A second reconciler of the Probe kind, under a name of its own: it writes a ConfigMap
    ``<probe>-audit`` - unless it still has its bug."""

    class Auditor(Reconciler):
        name = "probe-auditor"
        group, version, kind = GROUP, VERSION, "Probe"

        def reconcile(self, obj, ctx):
            if not fixed:
                raise RuntimeError("the auditor's bug")
            ctx.create_or_update({"apiVersion": "v1", "kind": "ConfigMap",
                                  "metadata": {"name": f"{obj['metadata']['name']}-audit"},
                                  "data": {"audited": "yes"}})

    return Auditor


class _KindsOwn(Reconciler):
    """The Probe kind's own reconciler, beside the auditor: never the one replayed for it."""

    group, version, kind = GROUP, VERSION, "Probe"

    def reconcile(self, obj, ctx):
        raise AssertionError("the kind's own reconciler ran for the auditor's record")


def test_a_run_of_a_second_reconciler_of_a_kind_replays_its_own_code(
        kube, probe, namespace, redis_client, settings):  # noqa: F811
    settings.RECONCILERS_RECORD_INPUTS = "failed"
    buggy, fixed = ReconcilerRegistry(), ReconcilerRegistry()
    for registry, auditor in ((buggy, _auditor(False)), (fixed, _auditor(True))):
        register(registry=registry)(_KindsOwn)
        register(registry=registry)(auditor)
    record = ReconcileRecord.objects.get(
        pk=run_once(buggy, "p", namespace, "probe-auditor").record_id)
    assert (record.reconciler, record.outcome) == ("probe-auditor", "error")
    result = replay.replay(record.pk, registry=fixed)
    assert (result.recorded_outcome, result.outcome) == ("error", "success"), result.report()
    assert [w["body"]["metadata"]["name"] for w in result.writes] == ["p-audit"]


def _copier(fixed: bool):
    """Reads the Secret ``credentials`` and lists the Secrets, copies its data into a Secret
    of its own, then - unless ``fixed`` - fails on the optional key ``token``."""

    class Copier(Reconciler):
        group, version, kind = GROUP, VERSION, "Probe"

        def reconcile(self, obj, ctx):
            data = dict(ctx.get("v1", "Secret", "credentials")["data"])
            listed = ctx.list("v1", "Secret")
            ctx.create_or_update({"apiVersion": "v1", "kind": "Secret",
                                  "metadata": {"name": f"{obj['metadata']['name']}-copy"},
                                  "data": data})
            if not fixed and "token" not in data:  # the bug: the token is optional
                raise RuntimeError("the credentials have no 'token'")
            ctx.patch_status({"value": len(listed)})

    Copier.__name__ = "Copier"
    return Copier


def _failed_run_that_read_a_secret(kube, namespace) -> tuple[int, list[str]]:
    """A failed run of ``_copier`` on a Secret created as ``kubectl apply`` leaves it (its
    last-applied annotation carries the data too): its record and the forms its value
    takes (as written, in base64)."""
    value = f"hunter2-{uuid.uuid4().hex}"
    encoded = base64.b64encode(value.encode()).decode()
    applied = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "credentials"},
               "stringData": {"password": value}}
    client.CoreV1Api(kube).create_namespaced_secret(namespace, {
        "metadata": {"name": "credentials", "annotations": {
            "kubectl.kubernetes.io/last-applied-configuration": json.dumps(applied)}},
        "data": {"password": encoded}})
    buggy = ReconcilerRegistry()
    register(registry=buggy)(_copier(fixed=False))
    report = run_once(buggy, "p", namespace, _copier(False).name())
    record = ReconcileRecord.objects.get(pk=report.record_id)
    assert record.outcome == "error" and "no 'token'" in record.error_message
    return record.pk, [value, encoded]


def test_a_failed_run_that_read_a_secret_keeps_its_keys_never_its_values(
        kube, probe, namespace, redis_client, settings):  # noqa: F811
    settings.RECONCILERS_RECORD_INPUTS = "failed"
    record_id, forms = _failed_run_that_read_a_secret(kube, namespace)

    # What is at rest: the columns as PostgreSQL holds them.
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT obj::text, reads::text, writes::text "
                       f"FROM {RunInputs._meta.db_table} WHERE record_id = %s", [record_id])
        stored = " ".join(cursor.fetchone())
    assert [form for form in forms if form in stored] == []

    # The keys are kept, each value replaced by the marker; the rest of each object as read.
    kept = RunInputs.objects.get(record_id=record_id)
    (got,) = [r for r in kept.reads if r["read"] == "get" and r["args"][2] == "credentials"]
    (listed,) = [r for r in kept.reads if r["read"] == "list"]
    assert got["result"]["data"] == {"password": "<redacted>"}
    annotations = got["result"]["metadata"]["annotations"]
    assert annotations["kubectl.kubernetes.io/last-applied-configuration"] == "<redacted>"
    assert got["result"]["metadata"]["name"] == "credentials"
    (item,) = [s for s in listed["result"] if s["metadata"]["name"] == "credentials"]
    assert item["data"] == {"password": "<redacted>"}
    (written,) = kept.writes
    assert written["method"] == "POST" and written["path"].endswith("/secrets")
    assert written["body"]["data"] == {"password": "<redacted>"}
    assert written["body"]["metadata"]["name"] == "p-copy"


def test_a_regression_test_of_a_run_that_read_a_secret_holds_no_value_and_replays(
        kube, probe, namespace, redis_client, settings):  # noqa: F811
    settings.RECONCILERS_RECORD_INPUTS = "failed"
    record_id, forms = _failed_run_that_read_a_secret(kube, namespace)

    out = io.StringIO()
    call_command("replay", str(record_id), "--as-test", stdout=out)
    source = out.getvalue()
    assert [form for form in forms if form in source] == []
    assert "'password': '<redacted>'" in source

    # Code that reads the Secret's keys replays on them: the fix succeeds, the bug still fails.
    fixed, buggy = ReconcilerRegistry(), ReconcilerRegistry()
    register(registry=fixed)(_copier(fixed=True))
    register(registry=buggy)(_copier(fixed=False))
    module: dict = {}
    exec(compile(source, "test_regression.py", "exec"), module)
    run = replay.replay_inputs(module["INPUTS"], registry=fixed)
    assert run.outcome == "success", run.error
    assert run.writes[0]["body"]["data"] == {"password": "<redacted>"}
    assert replay.replay_inputs(module["INPUTS"], registry=buggy).outcome == "error"
    assert replay.replay(record_id, registry=fixed).outcome == "success"


def test_successful_runs_keep_nothing_by_default_and_the_command_says_why(
        kube, probe, namespace, redis_client, settings, capsys):  # noqa: F811
    settings.RECONCILERS_RECORD_INPUTS = "failed"
    client.CoreV1Api(kube).create_namespaced_config_map(
        namespace, {"metadata": {"name": "sizing"}, "data": {"replicas": "2"}})
    reg = ReconcilerRegistry()
    register(registry=reg)(_reconciler(fixed=False))
    report = run_once(reg, "p", namespace, _reconciler(False).name())
    assert ReconcileRecord.objects.get(pk=report.record_id).outcome == "success"
    assert not RunInputs.objects.exists()
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="kept no inputs"):
        call_command("replay", str(report.record_id))


def test_the_admin_replays_a_run_for_whoever_may_trigger_runs(kube, namespace, probe_crds,
                                                              redis_client, settings):
    from django.contrib.auth.models import Permission, User
    from django.test import Client

    from reconcilers.models import AuditLog
    from reconcilers._authoring.registry import registry

    settings.RECONCILERS_RECORD_INPUTS = "failed"
    client.CustomObjectsApi(kube).create_namespaced_custom_object(
        GROUP, VERSION, namespace, "probes", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "Probe", "metadata": {"name": "once"},
            "spec": {"value": 1, "failTimes": 1}})
    probe_name = "probes.test.operator.local"
    failed = run_once(registry, "once", namespace, probe_name)
    assert ReconcileRecord.objects.get(pk=failed.record_id).outcome == "error"

    url = "/admin/reconcilers/reconcilerecord/"
    form = {"action": "replay_selected", "_selected_action": [failed.record_id]}
    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_reconcilerecord"))
    browser = Client()
    browser.force_login(viewer)
    assert browser.post(url, form).status_code == 403  # a forged POST without the permission
    assert not AuditLog.objects.filter(action="replay").exists()

    oncall = User.objects.create_superuser("oncall", password="pw")
    browser.force_login(oncall)
    page = browser.post(url, form, follow=True).content.decode()
    assert f"run #{failed.record_id}: recorded error, replayed success" in page
    assert AuditLog.objects.get(action="replay").username == "oncall"
