"""Metrics and probes, scraped from real processes: a watcher, a prefork worker, web."""

from __future__ import annotations

import json
import time
import urllib.parse

import pytest
from prometheus_client.parser import text_string_to_metric_families

from reconcilers.models import CapabilityEvidence, ReconcileRecord
from tests.helpers import free_port, http_get, https_get

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

PROBE = "probes.test.operator.local"
RESOURCE = "test.operator.local/v1/probes"  # streams are labelled by the resource they watch


def _samples(port: int) -> dict[tuple[str, frozenset], float]:
    status, text = http_get(port, "/metrics")
    assert status == 200
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _value(samples: dict, metric: str, **labels: str) -> float:
    return samples.get((metric, frozenset(labels.items())), 0.0)


def _eventually(check, timeout: float = 60, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            check()
            return
        except AssertionError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.5)


def _probe(api, namespace: str, name: str, spec: dict) -> None:
    api.create_namespaced_custom_object("test.operator.local", "v1", namespace, "probes", {
        "apiVersion": "test.operator.local/v1", "kind": "Probe", "metadata": {"name": name},
        "spec": spec})


def _start(operator) -> tuple[int, int]:
    watcher_port, worker_port = free_port(), free_port()
    operator.env["OPERATOR_WATCHER_HTTP_PORT"] = str(watcher_port)
    operator.start_watcher(PROBE)
    operator.env["OPERATOR_WORKER_HTTP_PORT"] = str(worker_port)
    operator.start_worker(concurrency=2)
    return watcher_port, worker_port


# What kubebuilder's Grafana dashboards query (its grafana plugin's
# controller-runtime-metrics.json and controller-resources-metrics.json), by the label that
# names the controller; process_* name none.
KUBEBUILDER_DASHBOARDS = {
    "controller_runtime_active_workers": "controller",
    "controller_runtime_reconcile_total": "controller",
    "controller_runtime_reconcile_errors_total": "controller",
    "workqueue_depth": "name",
    "workqueue_queue_duration_seconds_bucket": "name",
    "workqueue_adds_total": "name",
    "workqueue_unfinished_work_seconds": "name",
    "workqueue_work_duration_seconds_bucket": "name",
    "workqueue_retries_total": "name",
    "process_cpu_seconds_total": None,
    "process_resident_memory_bytes": None,
}


def test_a_fresh_operator_serves_every_dashboard_series_at_zero(operator):
    """Before any event, every family kubebuilder's dashboards query has a series for every
    registered reconciler (at 0), as a controller-runtime manager's do once its controllers
    start: a rate() of a quiet controller is 0, not "no data"."""
    from reconcilers._authoring.registry import registry

    watcher, worker = _start(operator)
    scraped = {**_samples(watcher), **_samples(worker)}
    for family, label in KUBEBUILDER_DASHBOARDS.items():
        series = {dict(labels).get(label): value for (name, labels), value in scraped.items()
                  if name == family}
        if label is None:
            assert series, family
            continue
        for controller in registry.names():
            assert series.get(controller) == 0, (family, controller, series)
    for result in ("success", "error", "requeue", "requeue_after"):
        assert _value(scraped, "controller_runtime_reconcile_total", controller=PROBE,
                      result=result) == 0
    assert ("controller_runtime_terminal_reconcile_errors_total",
            frozenset({"controller": PROBE}.items())) in scraped


def test_counters_of_a_prefork_worker_agree_with_history(operator, kube):
    from kubernetes import client

    watcher, worker = _start(operator)
    api = client.CustomObjectsApi(kube)
    for i in range(4):
        _probe(api, operator.namespace, f"ok-{i}", {"value": i})
    _probe(api, operator.namespace, "flaky", {"value": 1, "failTimes": 2})
    _probe(api, operator.namespace, "broken", {"value": 1, "permanent": True})

    def all_ran() -> None:
        outcomes = list(ReconcileRecord.objects.filter(reconciler=PROBE)
                        .values_list("outcome", flat=True))
        assert outcomes.count("success") == 5 and outcomes.count("error") == 2, outcomes
        assert outcomes.count("permanent") == 1, outcomes

    _eventually(all_ran, what="every probe ran")
    records = ReconcileRecord.objects.filter(reconciler=PROBE)
    assert not CapabilityEvidence.objects.filter(criterion="metrics_scraped").exists()

    def worker_counts() -> None:
        m = _samples(worker)
        # Counted in two pool processes, summed by the main process's scrape.
        assert _value(m, "controller_runtime_reconcile_total", controller=PROBE,
                      result="success") == records.filter(outcome="success").count()
        assert _value(m, "controller_runtime_reconcile_total", controller=PROBE,
                      result="error") == records.filter(outcome__in=["error", "permanent"]).count()
        assert _value(m, "controller_runtime_reconcile_errors_total", controller=PROBE) == 3
        assert _value(m, "controller_runtime_reconcile_time_seconds_count",
                      controller=PROBE) == records.count()
        assert _value(m, "workqueue_queue_duration_seconds_count", name=PROBE) == records.count()
        assert _value(m, "workqueue_work_duration_seconds_count", name=PROBE) == records.count()
        assert _value(m, "workqueue_retries_total", name=PROBE) == 2  # the flaky one's errors
        assert _value(m, "controller_runtime_max_concurrent_reconciles", controller=PROBE) == 2
        assert _value(m, "controller_runtime_active_workers", controller=PROBE) == 0

    _eventually(worker_counts, timeout=15)
    # Level 4's metrics criterion: a scrape served a family the reconciler declares its own
    # (the Probe's ``probe_runs``; recorded just after the answer).
    _eventually(lambda: CapabilityEvidence.objects.filter(
        reconciler=PROBE, criterion="metrics_scraped").exists() or _fail("no evidence"),
        timeout=10)

    def watcher_counts() -> None:
        m = _samples(watcher)
        assert _value(m, "operator_leader") == 1
        assert _value(m, "workqueue_adds_total", name=PROBE) >= 6
        assert _value(m, "workqueue_depth", name=PROBE) == 0  # drained, and said so
        assert _value(m, "operator_ledger_items", name=PROBE, state="idle") == 6
        assert _value(m, "operator_watch_events_total", resource=RESOURCE,
                      namespace=operator.namespace, type="ADDED") >= 6
        assert _value(m, "operator_relists_total", resource=RESOURCE,
                      namespace=operator.namespace, reason="initial") == 1
        assert _value(m, "operator_cache_objects", resource=RESOURCE,
                      namespace=operator.namespace) == 6
        assert _value(m, "leader_election_master_status", name=operator.env["RECONCILERS_LEASE_NAME"]) == 1

    _eventually(watcher_counts, timeout=15)
    # Api-server calls as client-go counts them: lists and watches (GET) from the watcher,
    # status patches from the worker's pool processes; the host is the api-server's.
    host = urllib.parse.urlsplit(kube.configuration.host).netloc
    for port, method in ((watcher, "GET"), (worker, "PATCH")):
        calls = {dict(labels)["code"]: value for (name, labels), value in _samples(port).items()
                 if name == "rest_client_requests_total"
                 and dict(labels)["method"] == method and dict(labels)["host"] == host}
        assert calls.get("200", 0) > 0, (method, calls)
        assert _value(_samples(port), "rest_client_request_duration_seconds_count",
                      verb=method, host=host) >= calls["200"]
    for port in (watcher, worker):
        assert http_get(port, "/healthz")[0] == 200
        status, body = http_get(port, "/readyz")
        assert status == 200, body
    _the_dashboard_asks_only_for_what_is_exported({n for n, _ in _samples(watcher)}
                                                  | {n for n, _ in _samples(worker)})


def _the_dashboard_asks_only_for_what_is_exported(scraped: set[str]) -> None:
    """Every series deploy/monitoring/grafana-dashboard.json queries exists: scraped here, or
    declared by the metrics module (a counter with no increment yet has no sample)."""
    import re

    from prometheus_client import Counter, Histogram

    from tests.helpers import REPO
    from reconcilers._base import metrics

    declared = set()
    for metric in vars(metrics).values():
        if isinstance(metric, Counter):
            declared |= {metric._name, f"{metric._name}_total"}
        elif isinstance(metric, Histogram):
            declared |= {f"{metric._name}_{s}" for s in ("bucket", "count", "sum")}
    dashboard = json.loads((REPO / "deploy/monitoring/grafana-dashboard.json").read_text())
    queried = {name for panel in dashboard["panels"] for target in panel["targets"]
               for name in re.findall(r"\b(?:controller_runtime|workqueue|operator)_\w+",
                                      target["expr"])}
    assert len(queried) >= 15
    assert queried - scraped - declared == set()


def test_a_thread_pool_worker_counts_the_keys_it_runs_not_the_messages(operator, kube):
    """``controller_runtime_active_workers`` of a thread-pool worker: three objects listed
    together share one message and run at once on three run threads - three workers busy,
    not one - and none once they are done."""
    from kubernetes import client

    api = client.CustomObjectsApi(kube)
    names = [f"slow-{i}" for i in range(3)]
    for name in names:  # before the watcher starts: listed and enqueued together
        _probe(api, operator.namespace, name, {"value": 1, "sleep": 3})
    port = free_port()
    operator.env["OPERATOR_WORKER_HTTP_PORT"] = str(port)
    operator.start_watcher(PROBE)
    worker = operator.start_worker(concurrency=4, pool="threads")
    seen: list[float] = []

    def three_at_once() -> None:
        seen.append(_value(_samples(port), "controller_runtime_active_workers",
                           controller=PROBE))
        assert seen[-1] == 3, seen

    _eventually(three_at_once, timeout=30)
    assert "+2] received" in worker.log()  # one message carried the three keys

    def done() -> None:
        assert ReconcileRecord.objects.filter(name__in=names, outcome="success").count() == 3
        assert _value(_samples(port), "controller_runtime_active_workers",
                      controller=PROBE) == 0

    _eventually(done, timeout=30)


def test_probes_turn_unready_while_postgres_or_redis_is_down_and_back_after(operator, stack):
    from django.db import connections

    from reconcilers.devstack import services

    watcher, worker = _start(operator)

    def readiness(expected: int, failing: str = "") -> None:
        for port in (watcher, worker):
            status, body = http_get(port, "/readyz")
            assert status == expected, body
            if failing:
                assert json.loads(body)["checks"][failing] is False, body
            assert http_get(port, "/healthz")[0] == 200  # alive throughout: no restart wanted

    _eventually(lambda: readiness(200), timeout=30)
    connections.close_all()
    for stop, start, name in ((services.stop_redis, services.start_redis, None),
                              (services.stop_postgres, services.start_postgres, "database")):
        stop(stack)
        try:
            _eventually(lambda: readiness(503, name or ""), timeout=30)
        finally:
            start(stack)
        _eventually(lambda: readiness(200), timeout=60)
    connections.close_all()


def test_web_serves_the_metrics_of_what_it_did(client, redis_client):
    from reconcilers._queue import workqueue
    from reconcilers._base.reconcile import Key

    workqueue.add([Key(PROBE, "ns", "from-the-admin")], "manual")
    response = client.get("/metrics")
    assert response.status_code == 200
    samples = {(s.name, frozenset(s.labels.items())): s.value
               for f in text_string_to_metric_families(response.content.decode())
               for s in f.samples}
    assert _value(samples, "workqueue_adds_total", name=PROBE) >= 1
    assert _value(samples, "operator_messages_sent_total", name=PROBE) >= 1
    # Its other reconcilers are there too, at 0, and its own process figures.
    quiet = "probes.finalizing.operator.local"
    assert ("workqueue_adds_total", frozenset({"name": quiet}.items())) in samples
    assert _value(samples, "workqueue_adds_total", name=quiet) == 0
    assert ("process_resident_memory_bytes", frozenset()) in samples


def test_a_workers_json_log_lines_join_the_history_record(operator, kube):
    from kubernetes import client

    operator.env["LOG_FORMAT"] = "json"
    operator.start_watcher(PROBE)
    worker = operator.start_worker(concurrency=2)
    _probe(client.CustomObjectsApi(kube), operator.namespace, "broken",
           {"value": 1, "permanent": True})
    def recorded() -> None:
        assert ReconcileRecord.objects.filter(reconciler=PROBE, name="broken").exists()

    _eventually(recorded)
    record = ReconcileRecord.objects.get(reconciler=PROBE, name="broken")

    def logged() -> dict:
        lines = [json.loads(line) for line in worker.log().splitlines()
                 if line.startswith("{")]
        matching = [line for line in lines if line.get("record_id") == record.pk]
        assert matching, worker.log()[-3000:]
        return matching[0]

    _eventually(logged, timeout=10)
    line = logged()
    assert line["level"] == "warning" and "this probe can never work" in line["message"]
    assert (line["reconciler"], line["namespace"], line["name"]) == (
        PROBE, operator.namespace, "broken")
    assert line["task_id"] == record.task_id and line["attempt"] == 1
    assert line["trigger"] == ",".join(record.triggers)
    # Celery's own lines are JSON too: it does not take the root logger over.
    assert any(json.loads(l).get("logger", "").startswith("celery")
               for l in worker.log().splitlines() if l.startswith("{"))


def test_the_compose_healthchecks_ask_the_processes_own_endpoints(operator):
    """docker-compose.yml's watcher and worker healthchecks, run as compose runs them (a shell
    in the container), against real processes: healthy while ready, failing once gone."""
    import os
    import subprocess

    import yaml

    from tests.helpers import REPO

    services = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]

    def healthcheck(role: str, port: int) -> int:
        kind, command = services[role]["healthcheck"]["test"]
        assert kind == "CMD-SHELL"
        env = {"PATH": os.environ["PATH"], f"OPERATOR_{role.upper()}_HTTP_PORT": str(port)}
        return subprocess.run(["sh", "-c", command.replace("$$", "$")], env=env,
                              capture_output=True, timeout=30).returncode

    ports = dict(zip(("watcher", "worker"), _start(operator)))
    for role, port in ports.items():
        _eventually(lambda: healthcheck(role, port) == 0 or _fail(role), timeout=30)
    for proc in operator.watchers + operator.workers:
        proc.kill()
    assert all(healthcheck(role, port) != 0 for role, port in ports.items())


def _fail(what: str) -> None:
    raise AssertionError(f"{what} is not healthy yet")


def test_a_worker_whose_consumer_stopped_answers_its_liveness_probe_with_503(operator):
    """Celery's Redis consumer can stop consuming after a broker connection reset and never
    exit (``reconcilers._run.stall``). Celery's own ``cancel_consumer`` stands in for that:
    the process lives and serves its probes, but a message in its queue waits. Once it has
    waited ``RECONCILERS_WORKER_STALLED_AFTER`` with the worker idle, ``/healthz`` answers 503
    (an orchestrator restarts the worker); consuming again, it is live again and runs the key."""
    from reconcilers._base.reconcile import Key
    from reconcilers._queue import broker, workqueue

    port = free_port()
    operator.env.update({"OPERATOR_WORKER_HTTP_PORT": str(port),
                         "RECONCILERS_WORKER_STALLED_AFTER": "5"})
    operator.start_worker(concurrency=2, pool="threads")
    queue = broker.default_queue()
    control = broker.app().control

    def live(expected: int) -> None:
        status, body = http_get(port, "/healthz")
        assert status == expected, body
        assert json.loads(body)["checks"]["consuming"] is (expected == 200), body

    _eventually(lambda: live(200), timeout=60, what="the worker's probes")
    assert control.cancel_consumer(queue, reply=True, timeout=10), "no worker answered"
    workqueue.add([Key(PROBE, operator.namespace, "waits")], "test")
    time.sleep(3)
    live(200)  # waited less than the bound: not yet a stall
    _eventually(lambda: live(503), timeout=30, what="liveness to fail while the key waits")

    assert control.add_consumer(queue, reply=True, timeout=10), "no worker answered"
    _eventually(lambda: live(200), timeout=30, what="liveness back once it consumes")
    _eventually(lambda: _assert(ReconcileRecord.objects.filter(name="waits").exists()),
                timeout=30, what="the waiting key run")


def _assert(condition: bool) -> None:
    assert condition


def test_a_worker_that_stays_stalled_ends_itself_and_its_successor_runs_the_key(operator):
    """Compose restarts a process that exits, never one that fails its health check: a worker
    whose consumer stays stopped ``RECONCILERS_WORKER_STALLED_AFTER`` after its probe first
    said so ends itself, naming why in its log; the key that waited runs on the worker
    started in its place."""
    from reconcilers._base.reconcile import Key
    from reconcilers._queue import broker, workqueue

    operator.env["RECONCILERS_WORKER_STALLED_AFTER"] = "2"
    worker = operator.start_worker(concurrency=2, pool="threads")
    assert broker.app().control.cancel_consumer(broker.default_queue(), reply=True,
                                                timeout=10), "no worker answered"
    workqueue.add([Key(PROBE, operator.namespace, "outlived")], "test")
    _eventually(lambda: _assert(worker.popen.poll() is not None), timeout=60,
                what="the stalled worker to end itself")
    assert "stalled worker process" in worker.log() and "ends itself" in worker.log()
    assert not ReconcileRecord.objects.filter(name="outlived").exists()

    operator.start_worker(concurrency=2, pool="threads")  # what compose's restart does
    _eventually(lambda: _assert(ReconcileRecord.objects.filter(name="outlived").exists()),
                timeout=60, what="the waiting key run by the new worker")


def test_secure_metrics_are_served_over_https_to_allowed_tokens_only(operator, metrics_tokens):
    """``RECONCILERS_METRICS_SECURE``: the watcher's and the worker's ``/metrics`` move to an
    HTTPS port of their own and answer a bearer token the api-server authenticates and allows
    ``get`` on ``/metrics``, as controller-runtime's secure metrics; their probes stay plain,
    and the probe port no longer gives ``/metrics`` away."""
    ports = {role: (free_port(), free_port()) for role in ("watcher", "worker")}
    operator.env["RECONCILERS_METRICS_SECURE"] = "1"
    for role, (probe, secure) in ports.items():
        operator.env[f"OPERATOR_{role.upper()}_HTTP_PORT"] = str(probe)
        operator.env[f"OPERATOR_{role.upper()}_METRICS_PORT"] = str(secure)
    watcher = operator.start_watcher(PROBE)
    operator.start_worker(concurrency=2, pool="threads")
    scraper, stranger = metrics_tokens["scraper"], metrics_tokens["stranger"]
    families = {}
    for role, (probe, secure) in ports.items():
        def scraped() -> None:
            status, body, _ = https_get(secure, "/metrics", scraper)
            assert status == 200, (role, status, body)
            families[role] = {f.name for f in text_string_to_metric_families(body)}

        _eventually(scraped, timeout=30, what=f"the {role}'s secure /metrics")
        status, body, _ = https_get(secure, "/metrics", stranger)
        assert status == 403 and "may not get /metrics" in body, (role, body)
        for token in (None, "not-a-token"):
            status, _, headers = https_get(secure, "/metrics", token)
            assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer"), role
        status, body = http_get(probe, "/metrics")
        assert status == 404 and f"HTTPS on port {secure}" in body, (role, body)
        assert http_get(probe, "/healthz")[0] == 200, role
        _eventually(lambda: _assert(http_get(probe, "/readyz")[0] == 200), timeout=30,
                    what=f"the {role}'s readiness")
    assert {"operator_leader", "workqueue_depth"} <= families["watcher"]
    assert "controller_runtime_active_workers" in families["worker"]
    assert "watcher: refused a scrape from 127.0.0.1 (403)" in watcher.log()
