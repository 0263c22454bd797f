"""The runner, in process (no Celery): one message in, one outcome and one record out.

Real api-server, PostgreSQL and Redis; the reconcilers are registered in a private registry.
"""

from __future__ import annotations

import pytest
from kubernetes import client

from reconcilers._queue import ledger
from reconcilers._run import runner
from reconcilers._base.reconcile import Claim, Key
from reconcilers.api import Reconciler, ReconcilerRegistry, register
from reconcilers.models import ReconcileRecord, WorkItem

pytestmark = pytest.mark.django_db(transaction=True)

GROUP, VERSION, PLURAL = "test.operator.local", "v1", "probes"


@pytest.fixture
def reg():
    return ReconcilerRegistry()


def enqueue(name: str, reconciler: str, ns: str):
    (d,) = ledger.enqueue([Key(reconciler, ns, name)], "added")
    return str(d.key), d.token


def make_probe(kube, ns, name, **spec):
    return client.CustomObjectsApi(kube).create_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Probe",
                                     "metadata": {"name": name}, "spec": spec})


def test_a_key_of_an_unknown_reconciler_is_recorded_as_permanent(redis_client):
    key, token = enqueue("x", "widgets.nowhere.example.com", "ns")
    report = runner.run(key, token, registry=ReconcilerRegistry())
    assert report.outcome == "permanent" and report.follow_up is None
    record = ReconcileRecord.objects.get()
    assert "no reconciler named 'widgets.nowhere.example.com'" in record.error_message
    assert WorkItem.objects.get().state == "idle"


def test_an_object_that_no_longer_exists_is_gone(kube, namespace, probe_crds, reg, redis_client):
    @register(registry=reg)
    class Probe(Reconciler):
        group, version, kind = GROUP, VERSION, "Probe"

        def reconcile(self, obj, ctx):
            raise AssertionError("must not be called for a deleted object")

    key, token = enqueue("never-existed", Probe.name(), namespace)
    assert runner.run(key, token, registry=reg).outcome == "gone"


def test_a_miss_in_a_synced_cache_is_asked_of_the_api_server_before_the_run_is_gone(
        kube, namespace, probe_crds, reg, redis_client):
    """Redis gone back to an older snapshot holds a live synced marker over a cache without
    what was created since, until the watcher notices: the run reconciles the object the
    api-server has, and only what the api-server lacks too is gone."""
    from reconcilers._kube import cache

    reconciled = []

    @register(registry=reg)
    class Probe(Reconciler):
        group, version, kind = GROUP, VERSION, "Probe"

        def reconcile(self, obj, ctx):
            reconciled.append(obj["metadata"]["name"])

    cache.mark_synced(Probe.primary(), namespace, "1")  # no object cached in that scope
    make_probe(kube, namespace, "created-in-the-gap")

    key, token = enqueue("created-in-the-gap", Probe.name(), namespace)
    assert runner.run(key, token, registry=reg).outcome == "success"
    assert reconciled == ["created-in-the-gap"]
    key, token = enqueue("never-existed", Probe.name(), namespace)
    assert runner.run(key, token, registry=reg).outcome == "gone"


def test_a_malformed_object_gets_an_error_record_with_traceback_and_a_retry(
        kube, namespace, probe_crds, reg, redis_client):
    @register(registry=reg)
    class Strict(Reconciler):
        group, version, kind = GROUP, VERSION, "Probe"

        def reconcile(self, obj, ctx):
            return int(obj["spec"]["replicas"])  # KeyError on a spec without replicas

    make_probe(kube, namespace, "malformed", value=1)
    key, token = enqueue("malformed", Strict.name(), namespace)
    report = runner.run(key, token, registry=reg)
    assert report.outcome == "error"
    assert report.follow_up is not None and report.follow_up.countdown == 0.005
    record = ReconcileRecord.objects.get()
    assert record.error_class == "builtins.KeyError"
    assert "obj[\"spec\"][\"replicas\"]" in record.traceback
    assert record.generation == 1 and record.resource_version
    assert WorkItem.objects.get().state == "backoff"


def test_a_stale_message_runs_nothing(reg, redis_client):
    key, token = enqueue("p", "probes.test.operator.local", "ns")
    assert runner.run(key, token + 5, registry=reg).dropped is True
    assert not ReconcileRecord.objects.exists()


def test_a_reconciler_that_exits_the_process_gets_an_error_record_not_a_dead_worker(
        kube, namespace, probe_crds, reg, redis_client):
    @register(registry=reg)
    class Quitter(Reconciler):
        group, version, kind = GROUP, VERSION, "Probe"

        def reconcile(self, obj, ctx):
            raise SystemExit(3)

    make_probe(kube, namespace, "quits", value=1)
    key, token = enqueue("quits", Quitter.name(), namespace)
    report = runner.run(key, token, registry=reg)  # returns: this process is still here
    assert report.outcome == "error" and report.follow_up is not None
    record = ReconcileRecord.objects.get()
    assert record.error_class == "builtins.SystemExit"
    assert WorkItem.objects.get().state == "backoff"


def test_a_run_that_lost_its_key_leaves_no_record_of_its_own(kube, namespace, probe_crds, reg,
                                                             redis_client):
    from django.db.models import F

    @register(registry=reg)
    class Slow(Reconciler):
        group, version, kind = GROUP, VERSION, "Probe"

        def reconcile(self, obj, ctx):
            # Meanwhile the reaper gave the key to another run (as after a SIGSTOP).
            WorkItem.objects.update(token=F("token") + 1, state="queued")

    make_probe(kube, namespace, "slow", value=1)
    key, token = enqueue("slow", Slow.name(), namespace)
    report = runner.run(key, token, registry=reg)
    assert report.record_id is None
    assert not ReconcileRecord.objects.exists()  # history never shows two holders at once


def test_the_one_statement_finish_writes_the_record_save_would(redis_client):
    """A run's record and its finish go in one statement (history.as_row): the row must be
    exactly what the ORM writes of the same values - JSON, arrays, NULLs, times included."""
    from datetime import datetime, timezone

    from django.forms.models import model_to_dict

    from reconcilers._run import history
    from reconcilers._base.reconcile import Decision

    def run_once(name: str) -> tuple[Claim, Decision, history.RunFacts]:
        (d,) = ledger.enqueue([Key("probes.test.operator.local", "ns", name)], "added")
        claim = ledger.claim(d.key, d.token, "w", 30)
        facts = history.RunFacts(
            started=datetime(2026, 12, 3, 1, 2, 3, 456789, tzinfo=timezone.utc), duration=0.25,
            worker="host:1", task_id="t#1",
            obj={"metadata": {"uid": "u-1", "resourceVersion": "42", "generation": None},
                 "status": {"conditions": [{"type": "Ready", "status": "True"}]}},
            events=[{"reason": "Created", "message": "ünïcode \"quoted\""}], phase="reconcile",
            capabilities=[{"action": "upgrade", "detail": "1 -> 2"}])
        return claim, Decision("error", 2, 0.5, "retry", error_class="boom.Boom",
                               error_message="it broke", traceback="Traceback ..."), facts

    claim, decision, facts = run_once("fast")
    _, record_id, _ = ledger.finish(claim, decision, 300, 0.0,
                                    history.as_row(history.new_values(claim, decision, facts)))
    claim2, decision2, facts2 = run_once("orm")
    saved = history.new_record(claim2, decision2, facts2)  # what the ORM would write
    saved.save(force_insert=True)

    fast = model_to_dict(ReconcileRecord.objects.get(pk=record_id))
    orm = model_to_dict(ReconcileRecord.objects.get(pk=saved.pk))
    for row in (fast, orm):
        row.pop("id"), row.pop("name")
    assert fast == orm
    assert fast["events"][0]["message"] == 'ünïcode "quoted"' and fast["generation"] is None
    assert WorkItem.objects.get(name="fast").state == "backoff"


def test_keys_sharing_a_message_are_each_claimed_run_and_recorded_on_their_own(
        kube, namespace, probe_crds, reg, redis_client):
    """One message, several keys: a stale one is dropped, a failing one is retried alone,
    and each run's record carries the id its own message would have had."""
    @register(registry=reg)
    class Probe(Reconciler):
        group, version, kind = GROUP, VERSION, "Probe"

        def reconcile(self, obj, ctx):
            if obj["spec"].get("fail"):
                raise RuntimeError("this one fails")

    for name in ("a", "b"):
        make_probe(kube, namespace, name, value=1)
    make_probe(kube, namespace, "bad", value=1, fail=True)
    items = [enqueue(n, Probe.name(), namespace) for n in ("a", "bad", "b")]
    stale = (items[0][0], items[0][1] + 1)  # a duplicate with a token the ledger never sent
    reports = runner.run_many([*items, stale], registry=reg)
    assert [r.outcome for r in reports] == ["success", "error", "success", ""]
    assert reports[3].dropped
    assert reports[1].follow_up is not None  # the failing key's retry, its own message
    records = {r.name: r for r in ReconcileRecord.objects.all()}
    assert set(records) == {"a", "bad", "b"}
    assert {r.task_id for r in records.values()} == {f"{k}#{t}" for k, t in items}
    assert {w.name: w.state for w in WorkItem.objects.all()} == {
        "a": "idle", "b": "idle", "bad": "backoff"}


def test_keys_waiting_for_a_run_thread_cost_one_statement_each_not_two(
        kube, namespace, probe_crds, reg, redis_client):
    """A run thread with keys waiting ends each run and claims the next key in one statement
    (client-go's Done then Get): four keys, five statements on the ledger - and each key is
    still claimed, run and recorded on its own, a stale message among them still dropped."""
    from django.db import connection

    @register(registry=reg)
    class Probe(Reconciler):
        group, version, kind = GROUP, VERSION, "Probe"

        def reconcile(self, obj, ctx):
            ctx.patch_status({"seen": obj["spec"]["value"]})

    statements: list[str] = []

    def seen(execute, sql, params, many, context):
        statements.append(sql)
        return execute(sql, params, many, context)

    names = ["a", "b", "c", "d"]
    for name in ["first", *names]:
        make_probe(kube, namespace, name, value=1)
    # The reconciler's first run writes its capability evidence in a transaction of its own.
    first = runner.run(*enqueue("first", Probe.name(), namespace), registry=reg)
    assert first.outcome == "success"
    items = [enqueue(n, Probe.name(), namespace) for n in names]
    stale = (items[0][0], items[0][1] + 1)  # a duplicate with a token the ledger never sent
    with connection.execute_wrapper(seen):
        reports = runner.run_many([*items, stale], registry=reg)
    assert [r.outcome for r in reports] == ["success", "success", "success", "success", ""]
    assert reports[4].dropped
    assert len([sql for sql in statements if "reconcilers_workitem" in sql]) == 1 + len(names)
    assert {r.name: r.outcome for r in ReconcileRecord.objects.all()} == dict.fromkeys(
        ["first", *names], "success")
    assert {w.name: w.state for w in WorkItem.objects.all()} == dict.fromkeys(
        ["first", *names], "idle")
    for name in names:
        got = client.CustomObjectsApi(kube).get_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name)
        assert got["status"]["seen"] == 1


def test_a_run_thread_claims_each_waiting_key_in_the_statement_ending_the_run_before(
        kube, namespace, probe_crds, reg, redis_client, monkeypatch):
    """The thread pool's run loop (``runner.work``): of a message's keys waiting for the one
    run thread, only the first is claimed on its own; each other one by the statement that
    ends the run before it, and all of them run on that thread."""
    import threading

    from django.db import connection

    from reconcilers._queue import workqueue
    from reconcilers._run import pool

    ran: set[str] = set()

    @register(registry=reg)
    class Probe(Reconciler):
        group, version, kind = GROUP, VERSION, "Probe"

        def reconcile(self, obj, ctx):
            ran.add(threading.current_thread().name)

    names = ["a", "b", "c"]
    for name in ["first", *names]:
        make_probe(kube, namespace, name, value=1)
    # The reconciler's first run writes its capability evidence in a transaction of its own.
    assert runner.run(*enqueue("first", Probe.name(), namespace), registry=reg).outcome == (
        "success")
    ran.clear()
    claimed: list[Key] = []
    own_claim = workqueue.claim
    monkeypatch.setattr(workqueue, "claim", lambda *a: claimed.append(a[0]) or own_claim(*a))
    items = [enqueue(n, Probe.name(), namespace) for n in names]
    reports: list = []

    def message() -> None:  # a Celery pool thread
        reports.extend(runner.run_many(items, registry=reg))
        pool.run_all(lambda entry, lane: entry.settle(connection.close()), [None])

    pool.configure(1)
    try:
        celery_thread = threading.Thread(target=message)
        celery_thread.start()
        celery_thread.join(60)
    finally:
        pool._line.stop()
        pool._line = None
    assert [r.outcome for r in reports] == ["success"] * 3
    assert [k.name for k in claimed] == ["a"]
    assert ran == {"run-0"}
    assert {w.name: w.state for w in WorkItem.objects.all()} == dict.fromkeys(
        ["first", *names], "idle")


def test_a_busy_run_thread_still_retires_old_connections_before_each_claim(
        kube, namespace, probe_crds, reg, redis_client, monkeypatch):
    """Claims made by the statement that ends the previous run are claims too: the thread
    checks its connection before them (at most once a second), as before a claim of its own,
    so a worker that never runs out of keys still retires connections past their age."""
    @register(registry=reg)
    class Probe(Reconciler):
        group, version, kind = GROUP, VERSION, "Probe"

        def reconcile(self, obj, ctx):
            pass

    names = ["first", "a", "b", "c"]
    for name in names:
        make_probe(kube, namespace, name, value=1)
    assert runner.run(*enqueue("first", Probe.name(), namespace), registry=reg).outcome == (
        "success")  # its capability evidence is written in a transaction of its own
    from reconcilers._base import connections

    checks = []
    monkeypatch.setattr(connections, "CHECK_EVERY", 0)
    monkeypatch.setattr(connections, "close_old_connections", lambda: checks.append(1))
    reports = runner.run_many([enqueue(n, Probe.name(), namespace) for n in names[1:]],
                              registry=reg)
    assert [r.outcome for r in reports] == ["success"] * 3
    assert len(checks) == 3  # one claim of its own, then two made by ending a run


def test_a_run_on_a_connection_the_database_dropped_claims_on_a_new_one(redis_client, caplog,
                                                                       monkeypatch):
    """Connections outlive runs and are checked at most once a second per thread; one that
    PostgreSQL dropped in between (a restart) fails the claim, which is retried on a new
    connection - the key runs now, not after the reaper's re-send."""
    import psycopg
    from django.db import connection

    from reconcilers._base import connections

    monkeypatch.setattr(connections, "CHECK_EVERY", 3600)  # however slow this machine
    first = enqueue("before", "widgets.nowhere.example.com", "ns")
    key, token = enqueue("after", "widgets.nowhere.example.com", "ns")
    connections.forget_last_check()
    # its connection checked just now
    assert runner.run(*first, registry=ReconcilerRegistry()).outcome == "permanent"
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    params = connection.get_connection_params()
    with psycopg.connect(**{k: v for k, v in params.items() if k != "cursor_factory"},
                         autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])
    report = runner.run(key, token, registry=ReconcilerRegistry())
    assert report.outcome == "permanent" and not report.dropped
    assert "retrying on a new one" in caplog.text


def test_a_runs_record_takes_values_as_its_columns_store_them():
    """The finishing statement reads the record as the table's row type: a float
    observedGeneration (3.0, as some clients write it) is stored as 3, as save() would."""
    import json
    from datetime import datetime, timezone

    from reconcilers._run import history
    from reconcilers._base.reconcile import Decision
    from reconcilers._base.reconcile import Claim

    claim = Claim(id=1, key=Key("probes.test.operator.local", "ns", "x"), token=1, attempts=0,
                  triggers=["added"], audit_ids=[])
    facts = history.RunFacts(started=datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=timezone.utc),
                             duration=0.5, obj={"metadata": {"generation": 3}},
                             final={"status": {"observedGeneration": 3.0}})
    row = json.loads(history.as_row(history.new_values(claim, Decision("success"), facts)).document)
    assert row["observed_generation"] == 3 and isinstance(row["observed_generation"], int)
    assert row["started_at"] == "2026-01-02T03:04:05.678901+00:00"  # microseconds kept


def test_a_generation_that_is_no_integer_is_recorded_as_none_not_a_failed_finish():
    """A malformed object's status must not stop its run from being recorded."""
    from datetime import datetime, timezone

    from reconcilers._run import history
    from reconcilers._base.reconcile import Decision
    from reconcilers._base.reconcile import Claim

    claim = Claim(id=1, key=Key("probes.test.operator.local", "ns", "x"), token=1, attempts=0,
                  triggers=["added"], audit_ids=[])
    facts = history.RunFacts(started=datetime(2026, 1, 2, tzinfo=timezone.utc), duration=0.1,
                             obj={"metadata": {"generation": "two"}},
                             final={"status": {"observedGeneration": {"not": "a number"}}})
    values = history.new_values(claim, Decision("success"), facts)
    assert (values["generation"], values["observed_generation"]) == (None, None)
    assert history.new_record(claim, Decision("success"), facts).generation is None
