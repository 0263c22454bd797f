"""``ctx`` helpers against the real api-server: conditions, status, children, conflicts."""

from __future__ import annotations

import pytest
from kubernetes import client

from reconcilers._queue import ledger
from reconcilers._run import runner
from reconcilers._base.reconcile import Key
from reconcilers.api import Reconciler, ReconcilerRegistry, register
from reconcilers.models import ReconcileRecord

pytestmark = pytest.mark.django_db(transaction=True)

GROUP, VERSION, PLURAL = "test.operator.local", "v1", "probes"


def run_once(reg: ReconcilerRegistry, name: str, namespace: str, reconciler: str):
    (d,) = ledger.enqueue([Key(reconciler, namespace, name)], "manual")
    return runner.run(str(d.key), d.token, registry=reg)


@pytest.fixture
def probe(kube, namespace, probe_crds):
    api = client.CustomObjectsApi(kube)
    api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "Probe", "metadata": {"name": "p"},
        "spec": {"value": 1}})
    return lambda: api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "p")


def test_conditions_keep_their_transition_time_until_the_status_flips(probe, namespace,
                                                                      redis_client):
    reg = ReconcilerRegistry()
    ready = {"value": False}

    @register(registry=reg)
    class Cond(Reconciler):
        group, version, kind = GROUP, VERSION, "Probe"

        def reconcile(self, obj, ctx):
            ctx.set_condition("Ready", ready["value"], "Waiting" if not ready["value"] else "Up",
                              "message")
            ctx.patch_status({"phase": "x"})

    assert run_once(reg, "p", namespace, Cond.name()).outcome == "success"
    first = {c["type"]: c for c in probe()["status"]["conditions"]}["Ready"]
    assert first["status"] == "False" and first["reason"] == "Waiting"
    assert first["observedGeneration"] == 1 and probe()["status"]["observedGeneration"] == 1

    run_once(reg, "p", namespace, Cond.name())
    again = {c["type"]: c for c in probe()["status"]["conditions"]}["Ready"]
    assert again["lastTransitionTime"] == first["lastTransitionTime"]

    ready["value"] = True
    run_once(reg, "p", namespace, Cond.name())
    flipped = {c["type"]: c for c in probe()["status"]["conditions"]}["Ready"]
    assert flipped["status"] == "True" and flipped["reason"] == "Up"


def test_a_status_write_from_a_stale_copy_conflicts_and_is_retried(kube, probe, namespace,
                                                                   redis_client):
    reg = ReconcilerRegistry()
    api = client.CustomObjectsApi(kube)

    @register(registry=reg)
    class Racer(Reconciler):
        group, version, kind = GROUP, VERSION, "Probe"

        def reconcile(self, obj, ctx):
            # Someone else writes between our read and our write.
            api.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "p",
                                               {"metadata": {"labels": {"touched": "yes"}}})
            ctx.patch_status({"value": 1})

    report = run_once(reg, "p", namespace, Racer.name())
    assert report.outcome == "error"
    record = ReconcileRecord.objects.get()
    assert record.error_message.startswith("409 Conflict")
    assert report.follow_up is not None  # retried with backoff, as client-go requeues


def test_create_or_update_writes_only_when_the_child_differs(kube, probe, namespace,
                                                             redis_client):
    reg = ReconcilerRegistry()
    core = client.CoreV1Api(kube)

    @register(registry=reg)
    class Parent(Reconciler):
        group, version, kind = GROUP, VERSION, "Probe"

        def reconcile(self, obj, ctx):
            ctx.create_or_update({"apiVersion": "v1", "kind": "ConfigMap",
                                  "metadata": {"name": "child"},
                                  "data": {"value": str(obj["spec"]["value"])}})

    run_once(reg, "p", namespace, Parent.name())
    cm = core.read_namespaced_config_map("child", namespace)
    assert cm.data == {"value": "1"}
    assert cm.metadata.owner_references[0].kind == "Probe"
    assert cm.metadata.owner_references[0].controller is True
    run_once(reg, "p", namespace, Parent.name())
    assert core.read_namespaced_config_map("child", namespace).metadata.resource_version == \
        cm.metadata.resource_version  # nothing changed, nothing written
    core.patch_namespaced_config_map("child", namespace, {"data": {"value": "drifted"}})
    run_once(reg, "p", namespace, Parent.name())
    assert core.read_namespaced_config_map("child", namespace).data == {"value": "1"}


def test_ctx_log_names_the_object_key(probe, namespace, redis_client, caplog):
    reg = ReconcilerRegistry()

    @register(registry=reg)
    class Logs(Reconciler):
        group, version, kind = GROUP, VERSION, "Probe"

        def reconcile(self, obj, ctx):
            ctx.log.info("reconciling now")

    probe()
    with caplog.at_level("INFO"):
        run_once(reg, "p", namespace, Logs.name())
    (line,) = [r for r in caplog.records if "reconciling now" in r.getMessage()]
    assert line.getMessage() == f"[{Logs.name()}:{namespace}/p] reconciling now"
    assert line.key == f"{Logs.name()}:{namespace}/p"


def test_apply_removes_a_field_dropped_from_the_desired_state_and_keeps_other_owners(
        probe, namespace, kube, redis_client):
    """Server-side apply: what the reconciler stops wanting goes away; what others own stays."""
    reg = ReconcilerRegistry()
    wanted = {"data": {"a": "1", "b": "2"}, "labels": {"tier": "web", "old": "yes"}}

    @register(registry=reg)
    class Applier(Reconciler):
        group, version, kind = GROUP, VERSION, "Probe"

        def reconcile(self, obj, ctx):
            ctx.apply({"apiVersion": "v1", "kind": "ConfigMap",
                       "metadata": {"name": "child", "labels": dict(wanted["labels"])},
                       "data": dict(wanted["data"])})

    core = client.CoreV1Api(kube)
    assert run_once(reg, "p", namespace, Applier.name()).outcome == "success"
    child = core.read_namespaced_config_map("child", namespace)
    assert child.data == {"a": "1", "b": "2"} and child.metadata.labels["old"] == "yes"
    (ref,) = child.metadata.owner_references
    assert ref.controller and ref.kind == "Probe" and ref.name == "p"

    # Someone else adds an owner reference (not a controller) and a label of their own.
    other = core.create_namespaced_config_map(namespace, {"metadata": {"name": "other"}})
    core.patch_namespaced_config_map("child", namespace, {"metadata": {
        "labels": {"team": "theirs"},
        "ownerReferences": [*[r.to_dict() for r in child.metadata.owner_references],
                            {"apiVersion": "v1", "kind": "ConfigMap", "name": "other",
                             "uid": other.metadata.uid}]}})
    # Our desired state drops data key b and label old.
    wanted["data"].pop("b")
    wanted["labels"].pop("old")
    assert run_once(reg, "p", namespace, Applier.name()).outcome == "success"
    child = core.read_namespaced_config_map("child", namespace)
    assert child.data == {"a": "1"}
    assert child.metadata.labels == {"tier": "web", "team": "theirs"}
    assert sorted(r.name for r in child.metadata.owner_references) == ["other", "p"]


def test_apply_refuses_an_object_another_controller_owns(probe, namespace, kube, redis_client):
    reg = ReconcilerRegistry()

    @register(registry=reg)
    class Applier(Reconciler):
        group, version, kind = GROUP, VERSION, "Probe"

        def reconcile(self, obj, ctx):
            ctx.apply({"apiVersion": "v1", "kind": "ConfigMap",
                       "metadata": {"name": "taken"}, "data": {"mine": "yes"}})

    core = client.CoreV1Api(kube)
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "taken"},
                                                  "data": {"theirs": "yes"}})
    done = run_once(reg, "p", namespace, Applier.name())
    record = ReconcileRecord.objects.get(pk=done.record_id)
    assert record.outcome == "error" and record.error_class.endswith("NotOwnedError")
    assert core.read_namespaced_config_map("taken", namespace).data == {"theirs": "yes"}


def test_capability_actions_are_kept_with_the_run_and_a_repaired_child_counts_as_healed(
        probe, namespace, kube, redis_client):
    reg = ReconcilerRegistry()
    report = {"action": "backup"}

    @register(registry=reg)
    class Lifecycle(Reconciler):
        group, version, kind = GROUP, VERSION, "Probe"

        def reconcile(self, obj, ctx):
            ctx.create_or_update({"apiVersion": "v1", "kind": "ConfigMap",
                                  "metadata": {"name": "kid"}, "data": {"k": "v"}})
            if report["action"]:
                ctx.capability(report["action"], "snapshot to s3://bucket/p")

    first = ReconcileRecord.objects.get(pk=run_once(reg, "p", namespace, Lifecycle.name()).record_id)
    # ... kept with what the run changed: the evidence of an action the cluster saw.
    assert first.capabilities == [{"action": "backup", "detail": "snapshot to s3://bucket/p",
                                   "changed": "ConfigMap/kid"}]

    # The child is deleted; the owned-child run that puts it back is a healing.
    report["action"] = None
    client.CoreV1Api(kube).delete_namespaced_config_map("kid", namespace)
    (d,) = ledger.enqueue([Key(Lifecycle.name(), namespace, "p")], "owned-child")
    healed = ReconcileRecord.objects.get(
        pk=runner.run(str(d.key), d.token, registry=reg).record_id)
    assert healed.capabilities == [{"action": "healed", "detail": "ConfigMap/kid"}]
    # Nothing to repair: the same trigger is not a healing.
    (d,) = ledger.enqueue([Key(Lifecycle.name(), namespace, "p")], "owned-child")
    calm = ReconcileRecord.objects.get(pk=runner.run(str(d.key), d.token, registry=reg).record_id)
    assert calm.outcome == "success" and calm.capabilities == []

    report["action"] = "world-domination"
    bad = ReconcileRecord.objects.get(pk=run_once(reg, "p", namespace, Lifecycle.name()).record_id)
    assert bad.outcome == "error" and "unknown capability action" in bad.error_message
