"""The engine under real failure: worker processes, the watcher, Redis and the api-server.

Every scenario ends with the invariant the architecture promises, checked from the cluster and
from history alone: every object converges to its latest spec, and for one key runs never
overlap in time.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from itertools import combinations

import pytest
from kubernetes import client

from reconcilers.models import ReconcileRecord, WorkItem
from tests.helpers import at_rest, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

PROBE = "probes.test.operator.local"
GROUP, VERSION, PLURAL = "test.operator.local", "v1", "probes"


def create(kube, ns: str, name: str, group: str = GROUP, **spec) -> dict:
    return client.CustomObjectsApi(kube).create_namespaced_custom_object(
        group, VERSION, ns, PLURAL, {"apiVersion": f"{group}/{VERSION}", "kind": "Probe",
                                     "metadata": {"name": name}, "spec": spec})


def patch(kube, ns: str, name: str, group: str = GROUP, **spec) -> dict:
    return client.CustomObjectsApi(kube).patch_namespaced_custom_object(
        group, VERSION, ns, PLURAL, name, {"spec": spec})


def get(kube, ns: str, name: str, group: str = GROUP) -> dict | None:
    try:
        return client.CustomObjectsApi(kube).get_namespaced_custom_object(
            group, VERSION, ns, PLURAL, name)
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise


def converged(kube, ns: str, names, group: str = GROUP) -> bool:
    """Each object's status reports its latest spec and no run of it is queued or in flight.

    The status is written during a run and its history row at the run's end, so a status alone
    does not mean the run that wrote it is recorded yet."""
    for name in names:
        obj = get(kube, ns, name, group)
        status = (obj or {}).get("status") or {}
        if obj is None or status.get("value") != obj["spec"].get("value") or \
                status.get("observedGeneration") != obj["metadata"]["generation"]:
            return False
    # Read after the statuses: a run that wrote one of them has ended if none is in flight now.
    return not WorkItem.objects.filter(reconciler=f"{PLURAL}.{group}", namespace=ns,
                                       name__in=names, state__in=["queued", "running"]).exists()


def assert_no_overlapping_runs(reconciler: str = PROBE) -> int:
    runs: dict[tuple, list] = {}
    for r in ReconcileRecord.objects.filter(reconciler=reconciler).exclude(error_class="WorkerLost"):
        runs.setdefault((r.namespace, r.name), []).append((r.started_at, r.finished_at))
    for key, intervals in runs.items():
        for (s1, e1), (s2, e2) in combinations(sorted(intervals), 2):
            assert e1 <= s2, f"runs of {key} overlap: {s1}-{e1} and {s2}-{e2}"
    return sum(len(v) for v in runs.values())


def test_a_failing_reconciler_backs_off_records_the_error_and_others_keep_running(
        kube, namespace, operator):
    operator.start_watcher(PROBE)
    operator.start_worker()
    operator.start_beat(operator.schedule)
    create(kube, namespace, "flaky", value=1, failTimes=3)
    create(kube, namespace, "broken", value=1, permanent=True)
    create(kube, namespace, "healthy", value=1)

    wait_for(lambda: converged(kube, namespace, ["healthy", "flaky"]), 60, "convergence")
    flaky = list(ReconcileRecord.objects.filter(name="flaky").order_by("started_at"))
    assert [r.outcome for r in flaky] == ["error", "error", "error", "success"]
    assert [r.attempt for r in flaky] == [1, 2, 3, 4]
    assert "RuntimeError: scripted failure for flaky" in flaky[0].traceback
    assert flaky[0].error_class == "builtins.RuntimeError"
    # Per-key exponential backoff (FAST_SETTINGS: 50 ms doubling), and no retry comes early.
    assert [r.requeue_after for r in flaky[:3]] == [0.05, 0.1, 0.2]
    gaps = [(b.started_at - a.finished_at).total_seconds() for a, b in zip(flaky, flaky[1:])]
    assert all(gap >= r.requeue_after * 0.9 for gap, r in zip(gaps, flaky)), gaps
    assert flaky[2].triggers == ["retry"]
    assert WorkItem.objects.get(name="flaky").attempts == 0  # forgotten after success

    broken = wait_for(lambda: ReconcileRecord.objects.filter(name="broken").first(), 30)
    assert broken.outcome == "permanent"
    # No retry is owed (a permanent error waits for a change), so none can come.
    wait_for(lambda: at_rest(PROBE, namespace, "broken", horizon=3600), 30, "no retry owed")
    assert ReconcileRecord.objects.filter(name="broken").count() == 1
    assert WorkItem.objects.get(name="broken").state == "idle"
    # A permanent error waits for a change to the object, and then runs again.
    patch(kube, namespace, "broken", permanent=False)
    wait_for(lambda: converged(kube, namespace, ["broken"]), 30, "broken to recover")


def test_requeue_after_and_temporary_error_delay_are_honoured(kube, namespace, operator):
    operator.start_watcher(PROBE)
    operator.start_worker()
    operator.start_beat(operator.schedule)
    create(kube, namespace, "poll", value=1, requeueAfter=1.0)
    create(kube, namespace, "later", value=1, temporaryDelay=1.0)
    wait_for(lambda: converged(kube, namespace, ["poll", "later"]), 30, "convergence")
    poll = list(ReconcileRecord.objects.filter(name="poll").order_by("started_at"))
    assert [r.outcome for r in poll] == ["requeue_after", "success"]
    assert poll[0].requeue_after == 1.0
    assert (poll[1].started_at - poll[0].finished_at).total_seconds() >= 0.9
    later = list(ReconcileRecord.objects.filter(name="later").order_by("started_at"))
    assert [r.outcome for r in later] == ["error", "success"]
    assert (later[1].started_at - later[0].finished_at).total_seconds() >= 0.9


def test_a_burst_of_updates_collapses_into_a_few_runs_that_end_on_the_final_generation(
        kube, namespace, operator):
    operator.start_watcher(PROBE)
    operator.start_worker()
    create(kube, namespace, "busy", value=0, sleep=0.05)
    wait_for(lambda: converged(kube, namespace, ["busy"]), 30)
    before = ReconcileRecord.objects.filter(name="busy").count()
    started = time.monotonic()

    def burst(offset: int) -> None:  # 10 clients x 10 updates: the burst lands within ~1 s
        for i in range(10):
            patch(kube, namespace, "busy", value=offset * 10 + i + 1)

    clients = [threading.Thread(target=burst, args=(n,)) for n in range(10)]
    for t in clients:
        t.start()
    for t in clients:
        t.join()
    burst_seconds = time.monotonic() - started
    final = get(kube, namespace, "busy")
    wait_for(lambda: converged(kube, namespace, ["busy"]), 60, "convergence after the burst")
    runs = list(ReconcileRecord.objects.filter(name="busy").order_by("started_at"))[before:]
    print(f"\n100 updates in {burst_seconds:.2f}s -> {len(runs)} reconciles")
    # Runs of 50 ms cannot overlap, so at most burst/50 ms + 2 start during and after a burst;
    # without dedup there would be one per update (100).
    assert len(runs) <= max(10, burst_seconds / 0.05 + 2), f"{len(runs)} runs for 100 updates"
    assert len(runs) < 50
    assert runs[-1].generation == final["metadata"]["generation"]
    assert runs[-1].outcome == "success"
    # Its own status writes were filtered by the generation predicate, and that is visible.
    from reconcilers.models import WatchStream

    wait_for(lambda: WatchStream.objects.get(reconciler=PROBE).skipped > 0, 15,
             "skipped events counted on the stream")


def test_runs_of_one_key_never_overlap_across_worker_processes(kube, namespace, operator):
    operator.start_watcher(PROBE)
    operator.start_worker(concurrency=2)
    operator.start_worker(concurrency=2)
    names = [f"p{i}" for i in range(6)]
    for name in names:
        create(kube, namespace, name, value=0, sleep=0.02)

    def churn(name: str) -> None:
        for i in range(1, 16):
            patch(kube, namespace, name, value=i)
            time.sleep(0.01)

    threads = [threading.Thread(target=churn, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wait_for(lambda: converged(kube, namespace, names), 90, "convergence")
    assert assert_no_overlapping_runs() >= len(names)
    workers = set(ReconcileRecord.objects.values_list("worker", flat=True))
    assert len({w.split("@")[0] for w in workers}) == 2, workers  # both processes worked


def test_a_worker_killed_mid_reconcile_loses_nothing(kube, namespace, operator):
    operator.start_watcher(PROBE)
    doomed = operator.start_worker()
    operator.start_beat(operator.schedule)
    create(kube, namespace, "slow", value=1, sleep=3)
    wait_for(lambda: WorkItem.objects.filter(name="slow", state="running").exists(), 30,
             "the run to start")
    doomed.kill(signal.SIGKILL)
    doomed.popen.wait(10)
    operator.start_worker()
    wait_for(lambda: converged(kube, namespace, ["slow"]), 60, "convergence after the kill")
    lost = ReconcileRecord.objects.get(name="slow", error_class="WorkerLost")
    assert lost.outcome == "error"
    assert ReconcileRecord.objects.filter(name="slow", outcome="success").count() == 1
    assert_no_overlapping_runs()


def test_redis_restarted_empty_loses_no_work(kube, namespace, operator, stack, redis_client):
    from reconcilers.devstack import services

    operator.start_watcher(PROBE)
    operator.start_beat(operator.schedule)
    create(kube, namespace, "a", value=1)
    create(kube, namespace, "b", value=1)
    wait_for(lambda: WorkItem.objects.filter(state="queued").count() == 2, 30,
             "both keys queued (no worker yet)")
    # Redis goes away with every message in it, and comes back empty.
    import redis

    with pytest.raises(redis.ConnectionError):  # the server hangs up on SHUTDOWN
        redis_client.execute_command("SHUTDOWN", "NOSAVE")
    wait_for(lambda: services.read_pid(stack.run_dir / "redis.pid") is None, 10, "redis down")
    services.start_redis(stack)
    operator.start_worker()
    wait_for(lambda: converged(kube, namespace, ["a", "b"]), 60, "convergence after the restart")


def test_redis_restored_from_an_older_snapshot_loses_no_object_created_since(
        kube, namespace, operator, private_redis, settings):
    """Redis comes back from a snapshot older than an object's creation, with the synced
    marker alive in it: the object is reconciled, never recorded ``gone``, and the cache
    holds it again."""
    from reconcilers._base.vocab import GVR
    from reconcilers._kube import cache

    operator.env["REDIS_URL"] = settings.REDIS_URL = private_redis.url  # cache and broker
    operator.start_watcher(PROBE)
    worker = operator.start_worker()
    create(kube, namespace, "before", value=1)
    wait_for(lambda: converged(kube, namespace, ["before"]), 60, "the first object converged")
    worker.stop()  # the gap's object waits in the ledger, not run before Redis goes back

    snapshot = private_redis.save()
    create(kube, namespace, "gap", value=1)
    probes = GVR.of(f"{GROUP}/{VERSION}", "Probe")
    wait_for(lambda: cache.get(probes, namespace, "gap"), 30, "the new object cached")
    wait_for(lambda: WorkItem.objects.filter(name="gap", state="queued").exists(), 30,
             "its key queued")
    private_redis.restart(snapshot)  # its message, its cache entry: gone back before them

    operator.start_worker()
    wait_for(lambda: converged(kube, namespace, ["gap"]), 60, "the gap's object reconciled")
    assert not ReconcileRecord.objects.filter(name="gap", outcome="gone").exists()
    assert cache.get(probes, namespace, "gap") is not None


def test_changes_while_the_watcher_is_down_converge_and_deletions_are_finalized_once(
        kube, namespace, operator, redis_client):
    fin = "probes.finalizing.operator.local"
    fgroup = "finalizing.operator.local"
    watcher = operator.start_watcher(PROBE, fin)
    operator.start_worker()
    operator.start_beat(operator.schedule)
    create(kube, namespace, "keep", value=1)
    create(kube, namespace, "drop", value=1)
    create(kube, namespace, "tidy", group=fgroup, value=1)
    wait_for(lambda: converged(kube, namespace, ["keep", "drop"]), 30)
    wait_for(lambda: converged(kube, namespace, ["tidy"], fgroup), 30)
    assert get(kube, namespace, "tidy", fgroup)["metadata"]["finalizers"] == [
        "probes.finalizing.operator.local/finalizer"]

    watcher.kill(signal.SIGKILL)
    watcher.popen.wait(10)
    patch(kube, namespace, "keep", value=2)
    create(kube, namespace, "new", value=5)
    client.CustomObjectsApi(kube).delete_namespaced_custom_object(GROUP, VERSION, namespace,
                                                                  PLURAL, "drop")
    client.CustomObjectsApi(kube).delete_namespaced_custom_object(fgroup, VERSION, namespace,
                                                                  PLURAL, "tidy")
    held = get(kube, namespace, "tidy", fgroup)  # held by its finalizer
    assert held is not None and held["metadata"].get("deletionTimestamp")

    operator.start_watcher(PROBE, fin)
    wait_for(lambda: converged(kube, namespace, ["keep", "new"]), 60, "convergence after restart")
    wait_for(lambda: get(kube, namespace, "tidy", fgroup) is None, 60, "finalized deletion")
    wait_for(lambda: ReconcileRecord.objects.filter(name="drop", outcome="gone").exists(), 30,
             "the deletion missed while down to be reconciled")
    # Cleanup is counted before the finalizer comes off, so a second one would be counted by
    # the time the object is gone.
    assert redis_client.lrange("probe:finalized", 0, -1) == [b"tidy"]


def test_an_expired_resource_version_relists_and_emits_what_changed(kube, namespace, probe_crds,
                                                                    redis_client):
    """A real 410 Gone from the api-server, handled by the real stream code in-process."""
    from reconcilers._watch.enqueuer import Enqueuer
    from reconcilers._watch.streams import Stream
    from reconcilers._watch.handlers import PRIMARY, Handler
    from reconcilers._watch.reflector import Gone
    from reconcilers._authoring.registry import registry

    create(kube, namespace, "stays", value=1)
    create(kube, namespace, "goes", value=1)
    stop = threading.Event()
    enq = Enqueuer(stop)
    cls = registry.get_class(PROBE)
    stream = Stream(cls.primary(), [Handler(cls, PRIMARY)], enq, stop,
                    namespace=namespace).reflector
    from reconcilers._kube import kube as kube_mod

    api = kube_mod.new_api_client()
    stream.list(api, initial=True)
    assert set(stream.known) == {f"{namespace}/stays", f"{namespace}/goes"}

    client.CustomObjectsApi(kube).delete_namespaced_custom_object(GROUP, VERSION, namespace,
                                                                  PLURAL, "goes")
    patch(kube, namespace, "stays", value=2)
    stream.resource_version = "1"  # long compacted away: the api-server answers 410
    with pytest.raises(Gone):
        stream.watch(api)
    stream.list(api)
    enq.start()
    enq.drain()
    stop.set()
    enq.join(5)
    items = {w.name: w.pending_triggers for w in WorkItem.objects.filter(namespace=namespace)}
    assert items["goes"][-1] == "deleted"
    assert items["stays"][-1] == "relist"
    assert set(stream.known) == {f"{namespace}/stays"}


def test_two_watchers_elect_one_leader_and_the_standby_takes_over(kube, namespace, operator):
    first = operator.start_watcher(PROBE)
    second = operator.start_process(
        "standby", [sys.executable, "manage.py", "watch", PROBE], operator.env)
    second.wait_for_log(f"watching {PROBE}", timeout=60)
    operator.start_worker()
    create(kube, namespace, "before", value=1)
    wait_for(lambda: converged(kube, namespace, ["before"]), 30)
    assert "leading: starting streams" not in second.log()

    first.kill(signal.SIGKILL)  # no clean release: the standby must wait out the lease
    second.wait_for_log("leading: starting streams", timeout=30)
    create(kube, namespace, "after", value=2)
    wait_for(lambda: converged(kube, namespace, ["after"]), 30, "the new leader to serve")


def test_a_database_outage_loses_no_events(kube, namespace, operator, stack):
    """PostgreSQL goes away (fast shutdown) while objects change, and comes back."""
    import os as _os

    from django.db import connection

    from reconcilers.devstack import services

    operator.start_watcher(PROBE)
    operator.start_worker()
    operator.start_beat(operator.schedule)
    create(kube, namespace, "before", value=1)
    wait_for(lambda: converged(kube, namespace, ["before"]), 30)

    connection.close()
    pid = services.read_pid(stack.run_dir / "postgres.pid")
    _os.killpg(pid, signal.SIGINT)  # fast shutdown: clients are cut off, nothing is corrupted
    wait_for(lambda: not services.port_open(stack.postgres_port), 30, "PostgreSQL down")
    try:
        patch(kube, namespace, "before", value=2)
        create(kube, namespace, "during", value=3)
        time.sleep(3)  # the watcher sees both events while the ledger is unreachable
    finally:
        services.start_postgres(stack)
    wait_for(lambda: converged(kube, namespace, ["before", "during"]), 90,
             "convergence after the database came back")
    for proc in operator.watchers + operator.workers:
        assert proc.popen.poll() is None, f"{proc.name} died during the outage"


def test_a_thread_pool_worker_holds_no_more_database_connections_than_its_concurrency(
        kube, namespace, operator):
    """Messages of one key and messages of several both run on the worker's run threads, so
    only those hold connections: at most its concurrency (and one for the main thread's
    start-up work), not one per Celery thread on top."""
    from django.db import connection

    from bench.probes import established_ports

    for name in ("listed-0", "listed-1"):  # listed together: one message of two keys
        create(kube, namespace, name, value=1, sleep=0.5)
    operator.start_watcher(PROBE)
    worker = operator.start_worker(concurrency=2, pool="threads")
    wait_for(lambda: converged(kube, namespace, ["listed-0", "listed-1"]), 60)
    for name in ("single-0", "single-1"):  # each its own message, running side by side
        create(kube, namespace, name, value=1, sleep=0.5)
        time.sleep(0.1)  # past the watcher's 20 ms gathering window
    wait_for(lambda: converged(kube, namespace, ["single-0", "single-1"]), 60)
    assert "+1] received" in worker.log()  # the listed two shared a message
    port = int(connection.settings_dict["PORT"])
    # The reaper runs every second here, each run on a connection it closes when done: the
    # fewest seen over half a second is what the worker holds between them.
    samples = []
    for _ in range(5):
        samples.append(len(established_ports([worker.pid], port)))
        time.sleep(0.1)
    held = min(samples)
    assert 1 <= held <= 2 + 1, f"{held} connections for a concurrency of 2"
