"""Faults inside a run, on real worker processes: a reconcile that hangs past its deadline, one
that ignores the deadline, a lost worker. The key is never held for ever, never run twice at
once, and every run leaves a record."""

from __future__ import annotations

import re

import pytest

from reconcilers.models import ReconcileRecord, WorkItem
from tests.e2e.test_engine import assert_no_overlapping_runs, converged, create, get, patch
from tests.helpers import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

DEADLINE = "probes.deadline.operator.local"
GROUP = "deadline.operator.local"


def records(name: str):
    return list(ReconcileRecord.objects.filter(reconciler=DEADLINE, name=name).order_by("id"))


# The prefork pool (a process per run) and the thread pool (the default layout: one process,
# deadlines kept by reconcilers._run.deadlines) hold runs to the same deadline.
POOLS = pytest.mark.parametrize("pool", ["prefork", "threads"])


@POOLS
def test_a_reconcile_hanging_past_its_deadline_is_an_error_retried_with_backoff(
        kube, operator, pool):
    operator.start_watcher(DEADLINE)
    worker = operator.start_worker(pool=pool, concurrency=2)
    # prefork interrupts even a blocking sleep (a signal); a pool thread is interrupted
    # between two Python instructions, so there it computes.
    create(kube, operator.namespace, "hangs", group=GROUP, value=1,
           **({"sleep": 30} if pool == "prefork" else {"spin": 30}))

    first = wait_for(lambda: records("hangs"), 30, "the hung run's record")[0]
    assert first.outcome == "error"
    assert first.error_message.startswith("run deadline of 2s exceeded")
    assert 1.5 <= first.duration_ms / 1000 < 4  # interrupted at the soft limit, not the hard
    item = WorkItem.objects.get(reconciler=DEADLINE, name="hangs")
    assert item.state != "running" or item.token > 1  # the key was let go

    patch(kube, operator.namespace, "hangs", group=GROUP, sleep=0, spin=0)
    wait_for(lambda: converged(kube, operator.namespace, ["hangs"], GROUP), 60,
             "convergence once it no longer hangs")
    assert worker.popen.poll() is None
    assert_no_overlapping_runs(DEADLINE)


def test_a_reconcile_ignoring_its_deadline_is_ended_and_its_key_freed(kube, operator,
                                                                      redis_client):
    """Prefork: the pool ends the child running it, as Celery does with any task."""
    operator.start_watcher(DEADLINE)
    worker = operator.start_worker(pool="prefork", concurrency=2)
    # No beat: the leading watcher sends the reaper that frees the key (the default layout).
    create(kube, operator.namespace, "stubborn", group=GROUP, value=1, stubborn=True)

    lost = wait_for(lambda: [r for r in records("stubborn") if r.error_class == "WorkerLost"],
                    60, "the reaper's record of the ended run")
    assert lost[0].outcome == "error"
    starts = wait_for(lambda: [float(t) for t in redis_client.lrange(
        "probe:started:stubborn", 0, -1)] if redis_client.llen("probe:started:stubborn") >= 2
        else None, 60, "the key to run again")
    # Not in a tight loop, and never while the ended run could still act: its hard limit
    # (4 s) passed, then its lease (6 s), before the next run started.
    assert starts[1] - starts[0] >= 6

    patch(kube, operator.namespace, "stubborn", group=GROUP, stubborn=False)
    wait_for(lambda: converged(kube, operator.namespace, ["stubborn"], GROUP), 90,
             "convergence once it respects its deadline")
    assert worker.popen.poll() is None  # Celery replaced the ended pool process
    assert_no_overlapping_runs(DEADLINE)


def _abandoned(name: str) -> list:
    return [r for r in records(name) if "RunAbandoned" in r.error_class]


def test_a_thread_pool_run_blocked_past_its_hard_limit_is_abandoned_not_fatal(
        kube, operator, redis_client):
    """A run blocked in C never sees the soft limit's exception. At the hard limit it is
    recorded as an error and its key retried with backoff; its thread is replaced and left to
    finish on its own, and what it then tries to write is refused. The worker - and every
    other run in it - carries on."""
    operator.start_watcher(DEADLINE)
    worker = operator.start_worker(pool="threads", concurrency=2)
    create(kube, operator.namespace, "blocked", group=GROUP, value=1, sleep=9)

    first = wait_for(lambda: _abandoned("blocked"), 30, "the abandoned run's record")[0]
    assert first.outcome == "error" and "blocked outside Python" in first.error_message
    assert 3.5 <= first.duration_ms / 1000 < 7  # at the hard limit (4 s), not at its end
    # The fix is deployed while the old run still sleeps; its retry converges ...
    patch(kube, operator.namespace, "blocked", group=GROUP, value=2, sleep=0)
    quick = [f"quick-{i}" for i in range(4)]
    for name in quick:
        create(kube, operator.namespace, name, group=GROUP, value=1)
    wait_for(lambda: converged(kube, operator.namespace, ["blocked", *quick], GROUP), 60,
             "the retry and the neighbours converging beside the stuck thread")
    # ... and the abandoned run, waking, may not write its stale value over it.
    wait_for(lambda: "an abandoned run returned" in worker.log(), 30, "the stuck run to wake")
    status = get(kube, operator.namespace, "blocked", GROUP)["status"]
    assert status["value"] == 2, status
    assert worker.popen.poll() is None, worker.log()[-3000:]
    assert_no_overlapping_runs(DEADLINE)


def test_an_abandoned_run_that_wakes_while_its_lease_still_runs_writes_nothing(
        kube, operator, redis_client, stack):
    """The window only the abandonment closes: a thread-pool run abandoned at its hard limit
    (4 s) still has a second of lease on its key (held until 5 s), and its retry starts
    inside it (backoff 0.05 s). Woken there, each kind of write it tries - server-side apply,
    create, a raw POST, an unconditional merge patch, a delete, an Event, none conditional on
    what it read - is refused before it is sent, because its key was released; the worker's
    log says why it stopped, and the api-server's audit log shows none of those writes."""
    from kubernetes import client

    from reconcilers.devstack import controlplane
    from soak import audit

    assert controlplane.audit_enabled(stack), "the api-server runs without its audit log"
    operator.start_watcher(DEADLINE)
    worker = operator.start_worker(pool="threads", concurrency=2)
    core = client.CoreV1Api(kube)
    ns, name = operator.namespace, "lingering"
    core.create_namespaced_config_map(ns, {"metadata": {"name": f"{name}-kept"},
                                           "data": {"from": "the test"}})
    create(kube, ns, name, group=GROUP, value=1, lingerWrites=True)

    wait_for(lambda: _abandoned(name), 30, "the abandoned run's record")
    wait_for(lambda: redis_client.llen(f"probe:started:{name}") >= 2, 30, "its retry to start")
    redis_client.set(f"probe:wake:{name}", 1)
    tried = wait_for(lambda: [t.decode() for t in redis_client.lrange(
        f"probe:lingered:{name}", 0, -1)] if redis_client.llen(f"probe:lingered:{name}") == 6
        else None, 30, "the abandoned run to try its writes")
    for line in tried:
        assert "LeaseLost" in line and "abandoned past its deadline" in line, tried
    wait_for(lambda: "an abandoned run returned" in worker.log(), 30, "the stuck run to end")
    assert re.search(r"an abandoned run returned .*LeaseLost: .*abandoned past its deadline",
                     worker.log()), worker.log()[-3000:]

    # Independent evidence: the objects, the Events, and the api-server's own audit log (read
    # up to a write of the test's made after the abandoned run's, so none can still come).
    assert core.read_namespaced_config_map(f"{name}-kept", ns).data == {"from": "the test"}
    for gone in ("applied", "created", "posted"):
        with pytest.raises(client.ApiException) as missing:
            core.read_namespaced_config_map(f"{name}-{gone}", ns)
        assert missing.value.status == 404
    events = client.EventsV1Api(kube).list_namespaced_event(ns).items
    assert [e for e in events if e.reason == "Stale"] == []
    core.create_namespaced_config_map(ns, {"metadata": {"name": f"{name}-marker"}})
    written = wait_for(lambda: (found := audit.read(stack.audit_log, ns)) and any(
        w.name == f"{name}-marker" for w in found) and found, 30,
        "the test's own write in the audit log")
    by_operator = [f"{w.verb} {w.name} {w.code} by {w.agent}" for w in written
                   if w.resource == "configmaps" and w.name.startswith(name)
                   and w.agent.startswith("django-crd-operator")]
    assert by_operator == []
    assert worker.popen.poll() is None, worker.log()[-3000:]
    assert_no_overlapping_runs(DEADLINE)


def test_a_thread_pool_worker_with_too_many_stuck_threads_drains_and_exits(kube, operator):
    operator.env["RECONCILERS_ABANDONED_RUNS_MAX"] = "1"
    operator.start_watcher(DEADLINE)
    worker = operator.start_worker(pool="threads", concurrency=2)
    for name in ("stuck-a", "stuck-b"):
        create(kube, operator.namespace, name, group=GROUP, value=1, sleep=120)

    wait_for(lambda: worker.popen.poll() is not None, 60, "the worker to drain and exit")
    assert "abandoned run threads still stuck" in worker.log(), worker.log()[-3000:]
    assert _abandoned("stuck-a") and _abandoned("stuck-b")
    # Their keys wait for a retry (backoff), nothing is held by the departed process.
    assert not WorkItem.objects.filter(reconciler=DEADLINE, state="running").exists()


@POOLS
def test_keys_sharing_a_message_each_keep_their_own_deadline_and_record(kube, operator, pool):
    """Objects that exist before the watcher starts are listed and enqueued together, so
    their keys share a message (RECONCILERS_KEYS_PER_MESSAGE): one delivery for all, yet a
    key that hangs is interrupted at its own deadline and recorded alone, and the others run
    and are recorded under their own ids - at once in the thread pool, one after another in
    a prefork child."""
    quick = [f"quick-{i}" for i in range(5)]
    create(kube, operator.namespace, "hangs", group=GROUP, value=1, spin=30)
    for name in quick:
        create(kube, operator.namespace, name, group=GROUP, value=1)
    operator.start_watcher(DEADLINE)
    worker = operator.start_worker(pool=pool, concurrency=2)

    wait_for(lambda: converged(kube, operator.namespace, quick, GROUP), 60, "the quick ones")
    first = wait_for(lambda: records("hangs"), 30, "the hung run's record")[0]
    assert first.error_message.startswith("run deadline of 2s exceeded"), first.traceback
    assert 1.5 <= first.duration_ms / 1000 < 4  # its own soft limit, not the message's
    # The worker got them in shared messages: an id is a first key's and "+<n> more".
    assert re.search(r"\[[^\]]+#1\+[1-5]\] received", worker.log()), worker.log()[-3000:]
    for name in quick:
        runs = records(name)
        assert len(runs) == 1, [(r.outcome, r.traceback or r.error_message) for r in runs]
        assert runs[0].outcome == "success"
        assert runs[0].task_id == f"{DEADLINE}:{operator.namespace}/{name}#1"

    patch(kube, operator.namespace, "hangs", group=GROUP, spin=0)
    wait_for(lambda: converged(kube, operator.namespace, ["hangs"], GROUP), 60,
             "convergence once it no longer hangs")
    assert worker.popen.poll() is None
    assert_no_overlapping_runs(DEADLINE)
