"""The soak's checker can fail: fed synthetic histories - an api-server audit log and the
faults as injected - it passes a clean one and fails each history with one planted defect: two
runs of one key at once, a change no run saw, a fault with no effect. No stack needed: the
checker's judgement is pure (``soak.check.history_checks`` over ``soak.audit``'s reading)."""

from __future__ import annotations

import json
from datetime import datetime, timezone

from soak import audit, check, faults

NS = "soak-1-0"
T0 = datetime(2026, 12, 6, 5, 0, tzinfo=timezone.utc).timestamp()


def _stamp(at: float) -> str:
    return datetime.fromtimestamp(T0 + at, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _event(verb: str, agent: str, at: float, name: str = "item-1", resource: str = "soakitems",
           subresource: str = "", code: int = 200, took: float = 0.01, dry_run: bool = False) -> str:
    ref = {"resource": resource, "namespace": NS, "name": name}
    if subresource:
        ref["subresource"] = subresource
    return json.dumps({
        "kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": "Metadata",
        "stage": "ResponseComplete", "verb": verb, "userAgent": agent, "objectRef": ref,
        "requestURI": f"/apis/x/{name}" + ("?dryRun=All" if dry_run else ""),
        "responseStatus": {"code": code}, "requestReceivedTimestamp": _stamp(at),
        "stageTimestamp": _stamp(at + took)})


KUBECTL = "kubectl/v1.35.4 (linux/amd64) kubernetes/abc"


def _by(run: str) -> str:
    return f"django-crd-operator/0.9.0 (run {run})"


def _run(run: str, begin: float, end: float, name: str = "item-1", child_at: float | None = None,
         end_code: int = 200) -> list[str]:
    """One run as the soak's reconciler makes it: its begin (a patch of the object), a child
    written, its end (the status)."""
    child_at = begin + (end - begin) / 2 if child_at is None else child_at
    return [_event("patch", _by(run), begin, name),
            _event("patch", _by(run), child_at, f"{name}-0", "configmaps"),
            _event("patch", _by(run), end, name, subresource="status", code=end_code)]


def _clean() -> list[str]:
    """Created by the soak, run; changed, run; a child deleted, run; runs one after the
    other (a refused write and a dry run in between change nothing)."""
    return [
        _event("create", KUBECTL, 0.0),
        *_run("a-1", 1.0, 2.0),
        _event("patch", KUBECTL, 3.0),
        *_run("a-2", 4.0, 5.0),
        _event("delete", KUBECTL, 6.0, "item-1-0", "configmaps"),
        _event("patch", _by("a-3"), 6.5, code=409),
        *_run("a-4", 7.0, 8.0),
        _event("create", KUBECTL, 8.5, "fault-probe", "configmaps", code=201, dry_run=True),
    ]


def _fault(effect: str | None = "worker0 (pid 7) ended by SIGKILL", **kw) -> faults.Injected:
    return faults.Injected(kw.pop("kind", "worker killed (-9)"), T0 + 1, T0 + 3, effect, **kw)


def _judge(lines: list[str], injected: list[faults.Injected], tmp_path) -> tuple[dict, bool]:
    """The checker's verdict on a history, as ``check.run`` reaches it."""
    trace = tmp_path / "trace.log"
    if not trace.exists():
        trace.write_text("")
    found = list(audit.writes(lines, "soak-1-"))
    faults.observe(injected, found, trace)
    checks = check.history_checks(check.audit_figures(found), injected)
    return checks, check.verdict(checks, {})


def _failed(checks: dict) -> list[str]:
    return [name for name, ok in checks.items() if ok is not True]


def test_a_clean_history_passes(tmp_path):
    checks, passed = _judge(_clean(), [_fault()], tmp_path)
    assert passed and _failed(checks) == [], checks
    figures = audit.summary(list(audit.writes(_clean(), "soak-1-")))
    assert figures["runs with a begin and an end"] == 3
    assert figures["changes by the soak"] == 3


def test_a_double_run_is_caught_as_an_overlap(tmp_path):
    # b begins after a's begin and before a's end: two holders of the key at once. Each run
    # writes each object once between its begin and end, so without the begin and end writes
    # the two runs would show only as single points.
    lines = [*_clean(), *_run("b-1", 10.0, 12.0), *_run("b-2", 11.0, 13.0, child_at=12.5)]
    checks, passed = _judge(lines, [_fault()], tmp_path)
    assert not passed
    assert _failed(checks) == ["no two runs of one key overlapped (audit log: begin-to-end spans)"]
    overlaps = audit.overlaps(list(audit.writes(lines, "soak-1-")))
    assert len(overlaps) == 1 and overlaps[0].startswith(f"{NS}/item-1: runs b-1")


def test_runs_one_right_after_the_other_are_no_overlap(tmp_path):
    # The next run's begin is received just after the previous run's end was complete.
    lines = [*_clean(), *_run("b-1", 10.0, 12.0), *_run("b-2", 12.02, 13.0)]
    assert _judge(lines, [_fault()], tmp_path)[1]


def test_a_run_that_writes_nothing_after_its_lease_is_no_overlap_but_a_write_in_flight_is(
        tmp_path):
    # Run c began, was stopped past its lease and fenced: it never wrote its end.
    fenced = [*_clean(), _event("patch", _by("c-1"), 10.0), *_run("c-2", 12.0, 13.0)]
    assert _judge(fenced, [_fault()], tmp_path)[1]
    # Its write already sent lands after its successor began: that is an overlap.
    landed = [*fenced, _event("patch", _by("c-1"), 12.5, "item-1-0", "configmaps")]
    assert not _judge(landed, [_fault()], tmp_path)[1]


def test_a_change_no_run_saw_is_caught_as_lost(tmp_path):
    # The soak changes the object at 10.0 while run d is under way: d began before it (it
    # read the older generation) and no run begins after it.
    lines = [*_clean(), *_run("d-1", 9.5, 10.5), _event("patch", KUBECTL, 10.0)]
    checks, passed = _judge(lines, [_fault()], tmp_path)
    assert not passed
    assert _failed(checks) == ["no change lost (audit log: every change seen by a run that ended)"]
    lost = audit.lost(list(audit.writes(lines, "soak-1-")))
    assert len(lost) == 1 and lost[0].startswith(f"{NS}/item-1: patch of soakitems")


def test_a_change_seen_only_by_a_run_that_never_ended_is_lost(tmp_path):
    began_only = [*_clean(), _event("patch", KUBECTL, 10.0), _event("patch", _by("e-1"), 11.0)]
    assert not _judge(began_only, [_fault()], tmp_path)[1]
    end_refused = [*_clean(), _event("patch", KUBECTL, 10.0),
                   *_run("e-2", 11.0, 12.0, end_code=409)]
    assert not _judge(end_refused, [_fault()], tmp_path)[1]
    # A run beginning in the very instant the change completes may have read the older copy.
    same_instant = [*_clean(), _event("patch", KUBECTL, 10.0, took=0.5),
                    *_run("e-3", 10.2, 12.0)]
    assert not _judge(same_instant, [_fault()], tmp_path)[1]
    # The change is seen when a later run begins after it and ends.
    assert _judge([*end_refused, *_run("e-4", 13.0, 14.0)], [_fault()], tmp_path)[1]


def test_a_child_deleted_behind_the_operators_back_needs_a_run_after_it(tmp_path):
    lines = [*_clean(), _event("delete", KUBECTL, 10.0, "item-1-2", "configmaps")]
    assert not _judge(lines, [_fault()], tmp_path)[1]
    # The garbage collector's deletions are no change the operator must act on.
    gc = [*_clean(), _event("delete", "kube-controller-manager/v1.35.4 (linux/amd64) "
                            "kubernetes/abc/system:serviceaccount:kube-system:generic-garbage"
                            "-collector", 10.0, "item-1-2", "configmaps")]
    assert _judge(gc, [_fault()], tmp_path)[1]


def test_a_change_to_an_object_deleted_after_it_needs_no_run(tmp_path):
    lines = [*_clean(), _event("patch", KUBECTL, 10.0), _event("delete", KUBECTL, 11.0)]
    assert _judge(lines, [_fault()], tmp_path)[1]


def test_a_silent_fault_is_caught(tmp_path):
    checks, passed = _judge(_clean(), [_fault(), _fault(None, kind="worker stopped past its "
                                                       "lease (SIGSTOP)")], tmp_path)
    assert not passed
    assert _failed(checks) == ["every fault had an effect the soak saw (none silent)"]
    assert faults.silent([_fault(None)])[0].startswith("worker killed (-9) at ")


def test_a_fault_on_the_api_servers_side_has_its_effect_in_the_audit_log(tmp_path):
    # The operator's write answered 429 inside the window; none answered 500 in any.
    lines = [*_clean(), _event("patch", _by("f-1"), 2.5, code=429)]
    throttled = _fault(None, kind="api-server answering 429 (APF, no seats)", codes=(429, 429))
    failing = _fault(None, kind="api-server answering 500 (admission webhook unreachable)",
                     codes=(500, 599))
    checks, passed = _judge(lines, [throttled, failing], tmp_path)
    assert throttled.effect == "1 of the operator's writes answered 429"
    assert failing.effect is None and not passed


def test_a_blocking_fault_has_its_effect_in_the_side_channel(tmp_path):
    (tmp_path / "trace.log").write_text(
        f"start soakitem:{NS}/item-1 g-1 {T0 + 0.5}\nblock soakitem:{NS}/item-1 g-1 {T0 + 0.6}\n"
        f"block soakitem:{NS}/item-2 g-2 {T0 + 2.0}\nblock soakitem:{NS}/item-3 g-3")  # torn
    blocked = _fault(None, kind="reconciles blocked in C past the hard limit",
                     keys=(f"{NS}/item-1", f"{NS}/item-2"))
    _checks, passed = _judge(_clean(), [blocked], tmp_path)
    assert passed and blocked.effect == "1 runs of 2 objects blocked in C"  # item-1's: before
    unblocked = _fault(None, kind="reconciles blocked in C past the hard limit",
                       keys=(f"{NS}/item-9",))
    assert not _judge(_clean(), [unblocked], tmp_path)[1]


def test_a_proxy_fault_counts_only_when_its_probe_shows_what_the_toxic_does():
    assert faults.probe_effect("latency", "answered", 1.2)
    assert faults.probe_effect("latency", "no answer", 3.0)
    assert faults.probe_effect("latency", "answered", 0.05) is None
    assert faults.probe_effect("black hole", "no answer", 3.0)
    assert faults.probe_effect("black hole", "answered", 1.5) is None
    assert faults.probe_effect("reset", "cut (ConnectionResetError)", 0.01)
    assert faults.probe_effect("data limit", "cut (closed before the answer)", 0.01)
    assert faults.probe_effect("data limit", "answered", 0.01) is None


def test_without_an_audit_log_the_checks_on_it_are_not_run_and_nothing_passes():
    checks = check.history_checks({"ran": False, "why not": "no audit log"}, [_fault()])
    assert [v for v in checks.values() if v is None] and not check.verdict(checks, {})
    assert not check.verdict({"a": True}, {"the ledger": False})  # secondary can fail a run


def test_the_checker_reads_convergence_from_the_cluster_with_the_official_client(
        kube, namespace, stack, apply_crd, monkeypatch):
    """Against the api-server, through the ``kubernetes`` client from ``KUBECONFIG`` (none of
    the operator's code): a converged object passes; a status behind its spec, a child
    missing, a child not wanted and a deleted object's child left over are each found."""
    from pathlib import Path
    from types import SimpleNamespace

    from kubernetes import client

    apply_crd(Path(check.__file__).parent / "soakapp" / "crds"
              / "soakitems.soak.operator.local.yaml")
    items, core = client.CustomObjectsApi(kube), client.CoreV1Api(kube)

    def item(name: str, value: int, children: int, status: dict) -> None:
        items.create_namespaced_custom_object(
            "soak.operator.local", "v1", namespace, "soakitems",
            {"apiVersion": "soak.operator.local/v1", "kind": "SoakItem",
             "metadata": {"name": name}, "spec": {"value": value, "children": children}})
        items.patch_namespaced_custom_object_status(
            "soak.operator.local", "v1", namespace, "soakitems", name,
            {"status": {"observedGeneration": 1, "note": "n1", **status}})

    def child(name: str, value: int) -> None:
        core.create_namespaced_config_map(namespace, {"metadata": {"name": name},
                                                      "data": {"value": str(value)}})

    item("done", 3, 1, {"value": 3, "children": 1})
    child("done-0", 3)
    soak = SimpleNamespace(ns=[namespace], note="n1", deleted=[])
    monkeypatch.setenv("KUBECONFIG", str(stack.kubeconfig))
    api = check.cluster()
    try:
        assert check.unconverged(soak, api) == []
        item("behind", 2, 0, {"value": 1, "children": 0})
        item("short", 2, 2, {"value": 2, "children": 2})
        child("short-0", 2)
        item("extra", 2, 0, {"value": 2, "children": 0})
        child("extra-1", 2)
        child("gone-0", 1)
        soak.deleted = [(namespace, "gone")]
        found = check.unconverged(soak, api)
    finally:
        api.close()
    assert sorted(p.split()[0].rstrip(":") for p in found) == [
        f"{namespace}/behind", f"{namespace}/extra-1", f"{namespace}/gone",
        f"{namespace}/short-1"]
