"""The soak's reading of the api-server's audit log (``soak.audit``), on synthetic lines: the
writes of this soak's runs, two runs of one key interleaving, writes outside any run, rotated
backups - and the operator's user agent naming each run as the audit reader expects."""

from __future__ import annotations

import json

from soak import audit


def _audit_line(name: str, agent: str, at: str, code: int = 200, verb: str = "patch",
                ns: str = "soak-1-0", resource: str = "configmaps", **extra) -> str:
    return json.dumps({
        "kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": "Metadata",
        "stage": "ResponseComplete", "verb": verb, "userAgent": agent,
        "objectRef": {"resource": resource, "namespace": ns, "name": name, **extra},
        "responseStatus": {"code": code}, "requestReceivedTimestamp": f"2026-12-06T05:00:{at}Z",
        "stageTimestamp": f"2026-12-06T05:00:{at}Z"})


def _run(identity: str) -> str:
    return f"django-crd-operator/0.9.0 (run {identity})"


def test_the_audit_checker_sees_two_runs_interleaving_writes_to_one_object():
    lines = [
        _audit_line("item-1-0", _run("5-a"), "01.000000", verb="create"),
        _audit_line("item-1-0", _run("6-b"), "01.500000"),  # b writes between a's writes
        _audit_line("item-1-0", _run("5-a"), "02.000000"),
        # one after the other on another object: no overlap
        _audit_line("item-2", _run("7-c"), "01.000000", resource="soakitems",
                    subresource="status"),
        _audit_line("item-2", _run("8-d"), "03.000000", resource="soakitems"),
        # refused writes change nothing; other namespaces are not this soak's
        _audit_line("item-2", _run("9-e"), "02.000000", code=409, resource="soakitems"),
        _audit_line("item-1-0", _run("5-x"), "01.700000", ns="other"),
        '{"torn line',
    ]
    found = list(audit.writes(lines, "soak-1-"))
    assert len(found) == 6
    overlaps = audit.overlaps(found)
    # A child's writes count for its SoakItem's key (``item-1-0`` is ``item-1``'s).
    assert len(overlaps) == 1 and overlaps[0].startswith("soak-1-0/item-1: runs 5-a")
    assert audit.summary(found)["writes refused (not 2xx)"] == 1


def test_writes_outside_a_run_are_named_but_kubectl_and_the_garbage_collector_may_write():
    found = list(audit.writes([
        _audit_line("item-1", "kubectl/v1.35.4 (linux/amd64) kubernetes/abc", "01.0"),
        _audit_line("item-1-0", "kube-controller-manager/v1.35.4 (linux/amd64) kubernetes/abc"
                    "/system:serviceaccount:kube-system:generic-garbage-collector", "02.0",
                    verb="delete"),
        _audit_line("item-1-1", "django-crd-operator/0.9.0", "03.0"),
    ], "soak-1-"))
    outside = audit.outside_runs(found)
    assert len(outside) == 1 and "item-1-1" in outside[0]


def test_the_audit_log_is_read_with_its_rotated_backups(tmp_path):
    log = tmp_path / "kube-apiserver-audit.log"
    (tmp_path / "kube-apiserver-audit-2026-12-06T05-00-00.000.log").write_text(
        _audit_line("item-1", _run("1-a"), "01.0") + "\n")
    log.write_text(_audit_line("item-1", _run("2-b"), "02.0") + "\n")
    assert [w.run for w in audit.read(log, "soak-1-")] == ["1-a", "2-b"]
