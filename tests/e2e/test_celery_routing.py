"""A user's Celery configuration applies to the work queue's messages: a project routing every
reconcile task to its own queue (``CELERY_TASK_ROUTES``) converges with a worker that consumes
only that queue, and its ``before_task_publish`` handler sees every message."""

from __future__ import annotations

import pytest

from tests.e2e.test_engine import PROBE, converged, create
from tests.helpers import wait_for
from tests.routedproject.apps import PUBLISHED

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_a_project_routing_reconcile_tasks_to_its_own_queue_converges(
        kube, operator, redis_client):
    operator.env["DJANGO_SETTINGS_MODULE"] = "tests.routedproject.settings"
    operator.start_watcher(PROBE)
    operator.celery_worker("widgets", queues="widgets", env=operator.env, pool="threads",
                           concurrency=2)
    names = [f"routed-{i}" for i in range(5)]
    for name in names:
        create(kube, operator.namespace, name, value=name)
    wait_for(lambda: converged(kube, operator.namespace, names), 60,
             "the objects to converge through the routed queue")
    counted = {key.decode().removeprefix(PUBLISHED): int(redis_client.get(key))
               for key in redis_client.scan_iter(f"{PUBLISHED}*")}
    assert set(counted) == {"widgets"} and counted["widgets"] >= 1, counted


RATE_LIMITED = "probes.ratelimited.operator.local"


def _assert_two_a_second(starts: list[float]) -> None:
    """A bucket of one token refilled twice a second: at most three starts in any second
    (the token on hand and two refills), and the whole burst spread accordingly."""
    busiest = max(sum(1 for t in starts if s <= t < s + 1.0) for s in starts)
    assert busiest <= 3, starts
    assert starts[-1] - starts[0] >= (len(starts) - 3) / 2, starts


def _burst(kube, operator, reconciler: str, count: int) -> list:
    """``count`` objects of ``reconciler`` created at once and converged; their runs."""
    from reconcilers.models import ReconcileRecord

    group = reconciler.partition(".")[2]
    names = [f"burst-{i}" for i in range(count)]
    for name in names:
        create(kube, operator.namespace, name, group=group, value=name)
    wait_for(lambda: converged(kube, operator.namespace, names, group), 90,
             f"a burst of {reconciler} to converge")
    return list(ReconcileRecord.objects.filter(reconciler=reconciler,
                                               namespace=operator.namespace))


def test_a_reconcilers_rate_limit_spaces_its_runs_on_real_workers(kube, operator):
    """``rate_limit = "2/s"`` is Celery's token bucket (capacity 1, refilled twice a second):
    the WorkQueue's overall limiter for one worker. A burst of objects on a worker with four
    run threads starts at most three runs in any second and takes its time."""
    operator.start_watcher(RATE_LIMITED)
    operator.start_worker(concurrency=4, pool="threads")
    runs = _burst(kube, operator, RATE_LIMITED, 8)
    assert sorted(r.outcome for r in runs) == ["success"] * 8
    _assert_two_a_second(sorted(r.started_at.timestamp() for r in runs))


SHARED = "probes.sharedrate.operator.local"


def test_a_shared_rate_limit_holds_across_workers(kube, operator):
    """``shared_rate_limit = "2/s"``: one bucket for every worker, as client-go's per
    controller - two worker processes together still start at most three runs in any second
    (Celery's per-worker ``rate_limit`` would let each of them run two)."""
    operator.start_watcher(SHARED)
    operator.start_worker(concurrency=4, pool="threads")
    operator.start_worker(concurrency=4, pool="threads")
    runs = _burst(kube, operator, SHARED, 10)
    assert sorted(r.outcome for r in runs) == ["success"] * 10  # nothing recorded twice
    _assert_two_a_second(sorted(r.started_at.timestamp() for r in runs))
    assert len({r.worker.split(":")[0] for r in runs}) == 2  # both workers took part
