"""The admin: permissions on the server, CSRF, audited manual actions through the ledger,
clear messages for bad input, escaped and redacted object data, pages that render."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.core.management import call_command
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from reconcilers._kube import cache
from reconcilers._run import evidence, runner
from reconcilers._queue import ledger
from reconcilers._run.evidence import evidenced_level, score
from reconcilers._base.reconcile import Decision, Key
from reconcilers.models import AuditLog, ReconcileRecord, RegisteredReconciler, WorkItem
from reconcilers._authoring.registry import registry

pytestmark = pytest.mark.django_db(transaction=True)

PROBE = "probes.test.operator.local"
CHANGELIST = "admin:reconcilers_workitem_changelist"


def staff(*perms: str) -> User:
    user = User.objects.create_user(f"u{User.objects.count()}", password="pw", is_staff=True)
    for codename in ("view_workitem", "view_reconcilerecord", "view_registeredreconciler",
                     "change_registeredreconciler", "view_watchstream", "view_auditlog",
                     "view_capabilitylevel", *perms):
        user.user_permissions.add(Permission.objects.get(codename=codename))
    return user


def client_for(user: User, csrf: bool = False) -> Client:
    c = Client(enforce_csrf_checks=csrf)
    c.force_login(user)
    return c


@pytest.fixture
def items(redis_client):
    ledger.enqueue([Key(PROBE, "ns", "a"), Key(PROBE, "ns", "b")], "added")
    WorkItem.objects.update(state="idle")
    return list(WorkItem.objects.order_by("name"))


def post_action(c: Client, action: str, items) -> object:
    return c.post(reverse(CHANGELIST), {"action": action,
                                        "_selected_action": [i.pk for i in items]})


def test_resync_without_the_permission_is_403_and_enqueues_nothing(items):
    c = client_for(staff())
    assert post_action(c, "resync_selected", items).status_code == 403
    assert not WorkItem.objects.filter(state="queued").exists()
    assert not AuditLog.objects.exists()
    # and the action is not even offered
    assert b"resync_selected" not in c.get(reverse(CHANGELIST)).content


def test_pause_without_the_permission_is_403(items):
    c = client_for(staff("resync_workitem"))
    assert post_action(c, "pause_selected", items).status_code == 403
    assert not WorkItem.objects.filter(paused=True).exists()


def test_a_forged_post_without_csrf_token_fails(items):
    c = client_for(staff("resync_workitem"), csrf=True)
    assert post_action(c, "resync_selected", items).status_code == 403
    assert not AuditLog.objects.exists()


def test_manual_resync_goes_through_the_ledger_and_its_run_links_to_the_audit_row(items):
    user = staff("resync_workitem")
    c = client_for(user)
    running = ledger.claim(Key(PROBE, "ns", "b"), ledger.enqueue([Key(PROBE, "ns", "b")],
                                                                 "modified")[0].token, "w", 30)
    response = post_action(c, "resync_selected", items)
    assert response.status_code == 302
    (audit,) = AuditLog.objects.all()
    assert (audit.username, audit.action, audit.key_count, audit.ip) == (
        user.username, "resync", 2, "127.0.0.1")
    a, b = WorkItem.objects.order_by("name")
    assert a.state == "queued" and a.pending_triggers[-1] == "manual"
    assert a.pending_audit == [audit.pk]
    assert b.state == "running" and b.dirty  # never a concurrent run: re-run after this one
    ledger.finish(running, Decision("success", 0), 300)

    report = runner.run(str(Key(PROBE, "ns", "a")), a.token)  # gone: no such Probe exists
    record = ReconcileRecord.objects.get(pk=report.record_id)
    assert "manual" in record.triggers and record.audit_ids == [audit.pk]
    page = c.get(reverse("admin:reconcilers_reconcilerecord_change", args=[record.pk]))
    assert reverse("admin:reconcilers_auditlog_change", args=[audit.pk]) in page.content.decode()


def test_the_projects_admin_roles_give_on_call_staff_resync_and_viewers_only_reading(items):
    # The groups come from the project's own migration (top-level migrations/); apply it afresh,
    # as a new installation's migrate does, since transactional tests empty the tables.
    call_command("migrate", "operator_project", "zero", verbosity=0)
    call_command("migrate", "operator_project", verbosity=0)

    def member(role: str) -> Client:
        user = User.objects.create_user(role.replace(" ", ""), password="pw", is_staff=True)
        user.groups.add(Group.objects.get(name=role))
        return client_for(user)

    viewer = member("Operator viewers")
    assert viewer.get(reverse(CHANGELIST)).status_code == 200
    assert viewer.get(reverse("admin:reconcilers_reconcilerecord_changelist")).status_code == 200
    assert post_action(viewer, "resync_selected", items).status_code == 403
    assert not WorkItem.objects.filter(state="queued").exists()

    on_call = member("Operator on-call")
    assert post_action(on_call, "resync_selected", items).status_code == 302
    assert WorkItem.objects.filter(state="queued").count() == 2
    assert post_action(on_call, "pause_selected", items).status_code == 302
    assert WorkItem.objects.filter(paused=True).count() == 2


def test_pause_and_resume_are_audited_and_a_paused_key_waits(items):
    c = client_for(staff("pause_workitem"))
    post_action(c, "pause_selected", items)
    assert WorkItem.objects.filter(paused=True).count() == 2
    ledger.enqueue([Key(PROBE, "ns", "a")], "modified")
    assert WorkItem.objects.get(name="a").state == "idle"
    post_action(c, "resume_selected", items)
    assert WorkItem.objects.get(name="a").state == "queued"
    assert list(AuditLog.objects.order_by("created_at").values_list("action", flat=True)) == [
        "pause", "resume"]


@pytest.mark.parametrize("data, message", [
    ({"reconciler": "nope.example.com", "namespace": "ns", "name": "x"}, "Select a valid choice"),
    ({"reconciler": PROBE, "namespace": "Bad NS", "name": "x"}, "not a valid namespace"),
    ({"reconciler": PROBE, "namespace": "ns", "name": "x/../y"}, "not a valid object name"),
    ({"reconciler": PROBE, "namespace": "", "name": "x"}, "give the object&#x27;s namespace"),
])
def test_the_resync_form_explains_bad_input_and_enqueues_nothing(data, message, redis_client):
    c = client_for(staff("resync_workitem"))
    page = c.post(reverse("admin:reconcilers_resync_object"), data)
    assert page.status_code == 200 and message in page.content.decode()
    assert not WorkItem.objects.exists() and not AuditLog.objects.exists()


def test_the_resync_form_enqueues_one_object(redis_client):
    c = client_for(staff("resync_workitem"))
    page = c.post(reverse("admin:reconcilers_resync_object"),
                  {"reconciler": PROBE, "namespace": "ns", "name": "one"}, follow=True)
    assert "enqueued for a manual resync" in page.content.decode()
    assert WorkItem.objects.get().pending_triggers == ["manual"]


def test_the_resync_form_needs_the_permission(redis_client):
    c = client_for(staff())
    assert c.get(reverse("admin:reconcilers_resync_object")).status_code == 403


def test_object_data_is_redacted_and_escaped(redis_client):
    gvr = registry.get_class(PROBE).primary()
    cache.put_many(gvr, [{"kind": "Probe", "metadata": {
        "namespace": "ns", "name": "evil", "managedFields": [{"manager": "kubectl"}],
        "annotations": {"note": "<script>alert(1)</script>",
                        cache.LAST_APPLIED: '{"secret": "x"}'}}}])
    page = client_for(staff()).get(reverse("admin:reconcilers_timeline"),
                                   {"reconciler": PROBE, "namespace": "ns", "name": "evil"})
    html = page.content.decode()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<script>alert(1)" not in html
    assert "managedFields" not in html and "last-applied-configuration" not in html


def test_every_admin_page_renders_for_staff(items):
    now = timezone.now()
    ReconcileRecord.objects.create(reconciler=PROBE, namespace="ns", name="a", started_at=now,
                                   finished_at=now, duration_ms=2, outcome="error",
                                   error_message="boom", traceback="Traceback...",
                                   triggers=["added"])
    RegisteredReconciler.sync_from([registry.get_class(PROBE)])
    c = client_for(staff())
    for url in [reverse("admin:index"), reverse("admin:reconcilers_dashboard"),
                reverse(CHANGELIST), reverse("admin:reconcilers_reconcilerecord_changelist"),
                reverse("admin:reconcilers_reconcilerecord_changelist") + "?outcome__exact=error",
                reverse("admin:reconcilers_registeredreconciler_changelist"),
                reverse("admin:reconcilers_registeredreconciler_change",
                        args=[RegisteredReconciler.objects.get().pk]),
                reverse("admin:reconcilers_watchstream_changelist"),
                reverse("admin:reconcilers_auditlog_changelist"),
                reverse("admin:reconcilers_capabilitylevel_changelist"),
                reverse("admin:reconcilers_timeline") + f"?reconciler={PROBE}&namespace=ns&name=a"]:
        assert c.get(url).status_code == 200, url


def test_history_changelist_queries_do_not_grow_with_rows(django_assert_max_num_queries):
    now = timezone.now()
    ReconcileRecord.objects.bulk_create([
        ReconcileRecord(reconciler=PROBE, namespace="ns", name=f"o{i}", started_at=now,
                        finished_at=now, duration_ms=1, outcome="success", audit_ids=[1])
        for i in range(60)])
    c = client_for(staff())
    with django_assert_max_num_queries(12):
        assert c.get(reverse("admin:reconcilers_reconcilerecord_changelist")).status_code == 200


def test_the_resync_period_is_editable_and_used(redis_client):
    from reconcilers._queue import resync

    RegisteredReconciler.sync_from([registry.get_class(PROBE)])
    rec = RegisteredReconciler.objects.get(name=PROBE)
    c = client_for(staff())
    c.post(reverse("admin:reconcilers_registeredreconciler_change", args=[rec.pk]),
           {"resync_period": "120"})
    assert resync.period_of(PROBE) == 120.0


def test_the_audit_log_is_append_only():
    row = AuditLog.objects.create(username="x", action="resync", reconciler=PROBE, key_count=1)
    with pytest.raises(TypeError):
        row.save()
    with pytest.raises(TypeError):
        AuditLog.objects.all().delete()


def test_capability_level_is_scored_from_history():
    now = timezone.now()

    evidence._recorded.clear()  # the per-process memo outlives the flushed test database

    def run(outcome, failures_before=0, **kw):
        defaults = dict(reconciler=PROBE, namespace="ns", name="a", started_at=now,
                        finished_at=now, duration_ms=1, outcome=outcome, generation=1)
        defaults.update(kw)
        record = ReconcileRecord.objects.create(**defaults)
        evidence.record_evidence(record, failures_before)
        return record

    assert evidenced_level(score(PROBE)) == 0
    run("success", observed_generation=1, conditions=[{"type": "Ready", "status": "True"}])
    assert evidenced_level(score(PROBE)) == 1
    run("success", generation=2, observed_generation=2, started_at=now + timedelta(seconds=1))
    assert evidenced_level(score(PROBE)) == 1  # a spec change alone is not an upgrade path
    run("success", capabilities=[{"action": "upgrade", "detail": "1.25 -> 1.27"}],
        started_at=now + timedelta(seconds=1))
    assert evidenced_level(score(PROBE)) == 1  # a sentence, with nothing changed in the cluster
    assert "while changing a child" in {c.id: c.why for c in score(PROBE)[1].criteria}[
        "operand-upgrade"]
    upgraded = run("success", capabilities=[{"action": "upgrade", "detail": "1.25 -> 1.27",
                                             "changed": "StatefulSet/db"}],
                   started_at=now + timedelta(seconds=1))
    assert evidenced_level(score(PROBE)) == 2
    assert {c.id: c.record_id for c in score(PROBE)[1].criteria if c.observable}[
        "operand-upgrade"] == upgraded.pk
    level3 = [c for c in score(PROBE)[2].criteria if c.observable]
    assert [c.met for c in level3] == [False, False, False]
    recovered = run("success", failures_before=2, started_at=now + timedelta(seconds=2))
    finalized = run("success", phase="finalize", started_at=now + timedelta(seconds=3))
    assert evidenced_level(score(PROBE)) == 2  # a finalizer is not a lifecycle
    run("error", capabilities=[{"action": "backup", "detail": "x", "changed": "Job/b"}],
        started_at=now + timedelta(seconds=3))
    assert evidenced_level(score(PROBE)) == 2  # a backup that failed proves nothing
    backup = run("success", capabilities=[{"action": "backup", "detail": "snapshot",
                                           "changed": "Job/backup-1"}],
                 started_at=now + timedelta(seconds=3))
    assert {c.id: c.record_id for c in score(PROBE)[2].criteria if c.observable} == {
        "finalizer-cleanup": finalized.pk, "recovers": recovered.pk, "lifecycle": backup.pk}
    assert evidenced_level(score(PROBE)) == 3
    run("error", events=[{"type": "Warning", "reason": "Failed"}],
        started_at=now + timedelta(seconds=4))
    assert not {c.id: c.met for c in score(PROBE)[3].criteria}["events"]  # a failure's event
    run("success", events=[{"type": "Normal", "reason": "Created"}],
        started_at=now + timedelta(seconds=4))
    assert evidenced_level(score(PROBE)) == 3  # Events alone are not deep insight
    assert score(PROBE)[3].why.startswith("not met: no scrape of /metrics")
    evidence.record_scraped(["nobody.example.com"])  # no run to point at: no evidence
    evidence.record_scraped([PROBE])  # a scrape served a family it declares its own
    latest = ReconcileRecord.objects.filter(reconciler=PROBE).latest("id")
    assert {c.id: c.record_id for c in score(PROBE)[3].criteria if c.observable} == {
        "events": latest.pk, "metrics": latest.pk}
    assert evidenced_level(score(PROBE)) == 4
    # Level 5: a child put back after it changed, and an auto-scaling decision.
    run("success", triggers=["owned-child"], started_at=now + timedelta(seconds=5))
    run("success", capabilities=[{"action": "healed", "detail": "Deployment/web"}],
        triggers=["owned-child"], started_at=now + timedelta(seconds=5))
    assert evidenced_level(score(PROBE)) == 4  # healing without an autopilot decision
    run("success", capabilities=[{"action": "auto-scaling", "detail": "3 -> 5 replicas",
                                  "changed": "Deployment/web"}],
        started_at=now + timedelta(seconds=6))
    assert evidenced_level(score(PROBE)) == 5
    assert score(PROBE)[4].why.startswith("met:")


def test_only_a_declared_metric_family_in_a_scrape_is_level_4_evidence():
    body = (b"# HELP controller_runtime_reconcile_total x\n"
            b'controller_runtime_reconcile_total{controller="a",result="success"} 3.0\n'
            b"probe_runs_total 4.0\nprobe_runs_created 1.7e9\n")
    served = evidence.served_families(body)
    assert "probe_runs" in served and "controller_runtime_reconcile" in served
    assert set(registry.get_class(PROBE).metrics) & served
    assert not evidence.served_families(b"# HELP probe_runs x\n# TYPE probe_runs counter\n")


def test_the_date_drill_down_lists_periods_between_the_oldest_and_newest_run():
    from datetime import datetime, timezone as tz

    for day in (3, 5):
        t = datetime(2026, 11, day, 12, tzinfo=tz.utc)
        ReconcileRecord.objects.create(reconciler=PROBE, namespace="ns", name="a",
                                       started_at=t, finished_at=t, duration_ms=1,
                                       outcome="success")
    days = ReconcileRecord.objects.datetimes("started_at", "day")
    assert [d.day for d in days] == [3, 4, 5]
    assert [m.month for m in ReconcileRecord.objects.datetimes("started_at", "month")] == [11]
    assert ReconcileRecord.objects.filter(name="none").datetimes("started_at", "year") == []


def test_a_run_links_to_its_log_lines_and_a_reconciler_to_its_metrics(settings, redis_client):
    now = timezone.now()
    record = ReconcileRecord.objects.create(
        reconciler=PROBE, namespace="ns", name="a", started_at=now, finished_at=now,
        duration_ms=2, outcome="error", triggers=["added"], task_id=f"{PROBE}:ns/a#3")
    RegisteredReconciler.sync_from([registry.get_class(PROBE)])
    registered = RegisteredReconciler.objects.get(name=PROBE)
    c = client_for(staff())
    run_page = reverse("admin:reconcilers_reconcilerecord_change", args=[record.pk])
    reconciler_page = reverse("admin:reconcilers_registeredreconciler_change",
                              args=[registered.pk])

    # No URL configured: the query itself, to paste.
    assert f"task_id=&quot;{PROBE}:ns/a#3&quot;" in c.get(run_page).content.decode()
    assert "controller_runtime_reconcile_total{controller=&quot;" in \
        c.get(reconciler_page).content.decode()

    settings.OPERATOR_LOGS_URL = "https://logs.example/explore?q={query}&run={record_id}"
    settings.OPERATOR_METRICS_URL = "https://prom.example/graph?g0.expr={query}"
    page = c.get(run_page).content.decode()
    assert (f'href="https://logs.example/explore?q=task_id%3D%22probes.test.operator.local'
            f'%3Ans%2Fa%233%22&amp;run={record.pk}"') in page
    assert 'href="https://prom.example/graph?g0.expr=sum%20by%20%28result%29' in \
        c.get(reconciler_page).content.decode()

    settings.OPERATOR_LOGS_URL = "https://logs.example/?q={nonsense}"  # bad admin input
    response = c.get(run_page)
    assert response.status_code == 200
    assert "OPERATOR_LOGS_URL is not a usable template" in response.content.decode()


def test_the_reconcilers_list_leads_to_the_operator_pages_on_any_admin_site(redis_client):
    RegisteredReconciler.sync_from([registry.get_class(PROBE)])
    page = client_for(staff("resync_workitem")).get(
        reverse("admin:reconcilers_registeredreconciler_changelist")).content.decode()
    assert f'href="{reverse("admin:reconcilers_dashboard")}"' in page
    assert f'href="{reverse("admin:reconcilers_resync_object")}"' in page


@pytest.fixture
def second_probe_reconciler():
    """A second reconciler of the Probe kind, under a name of its own, for one test."""
    from reconcilers.api import Reconciler

    class ProbeAuditor(Reconciler):
        name = "probe-auditor"
        group, version, kind = "test.operator.local", "v1", "Probe"

    registry.register(ProbeAuditor)
    yield ProbeAuditor
    registry.unregister("probe-auditor")


def test_two_reconcilers_of_one_kind_each_have_their_own_rows_history_and_resync(
        second_probe_reconciler, redis_client):
    RegisteredReconciler.sync_from([registry.get_class(PROBE), second_probe_reconciler])
    now = timezone.now()
    for reconciler, outcome in ((PROBE, "success"), ("probe-auditor", "error")):
        ReconcileRecord.objects.create(reconciler=reconciler, namespace="ns", name="a",
                                       started_at=now, finished_at=now, duration_ms=1,
                                       outcome=outcome)
    c = client_for(staff("resync_workitem"))
    listed = c.get(reverse("admin:reconcilers_registeredreconciler_changelist")).content.decode()
    assert "probe-auditor" in listed and PROBE in listed
    assert listed.count("test.operator.local/v1/Probe") == 2  # one kind, two reconcilers
    history = c.get(reverse("admin:reconcilers_reconcilerecord_changelist"),
                    {"reconciler": "probe-auditor"}).context["cl"].result_list
    assert [(r.reconciler, r.outcome) for r in history] == [("probe-auditor", "error")]
    page = c.post(reverse("admin:reconcilers_resync_object"),
                  {"reconciler": "probe-auditor", "namespace": "ns", "name": "a"}, follow=True)
    assert "enqueued for a manual resync" in page.content.decode()
    assert list(WorkItem.objects.values_list("reconciler", "namespace", "name")) == [
        ("probe-auditor", "ns", "a")]
    timeline = c.get(reverse("admin:reconcilers_timeline"),
                     {"reconciler": "probe-auditor", "namespace": "ns", "name": "a"})
    assert timeline.status_code == 200
