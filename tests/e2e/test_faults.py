"""Faults inside a run, on real worker processes: a reconcile that hangs past its deadline, one
that ignores the deadline, a lost worker. The key is never held for ever, never run twice at
once, and every run leaves a record."""

from __future__ import annotations

import re

import pytest

from reconcilers.models import ReconcileRecord, WorkItem
from tests.e2e.test_engine import assert_no_overlapping_runs, converged, create, patch
from tests.helpers import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

DEADLINE = "probes.deadline.operator.local"
GROUP = "deadline.operator.local"


def records(name: str):
    return list(ReconcileRecord.objects.filter(reconciler=DEADLINE, name=name).order_by("id"))


# The prefork pool (a process per run) and the thread pool (the default layout: one process,
# deadlines kept by reconcilers.deadlines) hold runs to the same deadline.
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


@POOLS
def test_a_reconcile_ignoring_its_deadline_is_ended_and_its_key_freed(kube, operator,
                                                                      redis_client, pool):
    from reconcilers.deadlines import EXIT_DEADLINE

    operator.start_watcher(DEADLINE)
    worker = operator.start_worker(pool=pool, concurrency=2)
    # No beat: the leading watcher sends the reaper that frees the key (the default layout).
    create(kube, operator.namespace, "stubborn", group=GROUP, value=1, stubborn=True)

    if pool == "threads":
        # No process of its own to end: the worker process goes, and its supervisor (compose,
        # Kubernetes) starts it again - here, the test does.
        wait_for(lambda: worker.popen.poll() is not None, 30, "the worker to end itself")
        assert worker.popen.returncode == EXIT_DEADLINE
        assert "ignored its run deadline" in worker.log()
        # ... and says where the run was stuck, as the process ends.
        assert re.search(r'File ".*operatorapp/reconcilers.py", line \d+ in reconcile',
                         worker.log()), worker.log()[-3000:]
        # Fixed before the restart: a second stubborn run would end this worker too.
        patch(kube, operator.namespace, "stubborn", group=GROUP, stubborn=False)
        worker = operator.start_worker(pool=pool, concurrency=2)
    lost = wait_for(lambda: [r for r in records("stubborn") if r.error_class == "WorkerLost"],
                    60, "the reaper's record of the ended run")
    assert lost[0].outcome == "error"
    starts = wait_for(lambda: [float(t) for t in redis_client.lrange(
        "probe:started:stubborn", 0, -1)] if redis_client.llen("probe:started:stubborn") >= 2
        else None, 60, "the key to run again")
    # Not in a tight loop, and never while the ended run could still act: its hard limit
    # (4 s) passed, then its lease (6 s), before the next run started.
    assert starts[1] - starts[0] >= 6

    if pool == "prefork":
        patch(kube, operator.namespace, "stubborn", group=GROUP, stubborn=False)
    wait_for(lambda: converged(kube, operator.namespace, ["stubborn"], GROUP), 90,
             "convergence once it respects its deadline")
    assert worker.popen.poll() is None  # prefork: Celery replaced the ended pool process
    assert_no_overlapping_runs(DEADLINE)


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
