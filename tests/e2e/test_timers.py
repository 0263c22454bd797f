"""Durable timers on real processes: per object, through the ledger, recorded, kept across a
restart of the whole operator, retried as timers when they fail."""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from reconcilers.models import ReconcileRecord, Timer
from tests.e2e.test_engine import assert_no_overlapping_runs, converged, create, get, patch
from tests.helpers import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

TIMED = "probes.timed.operator.local"
GROUP = "timed.operator.local"


def _beats(kube, namespace: str, name: str) -> int:
    return int(((get(kube, namespace, name, GROUP) or {}).get("status") or {}).get("beats") or 0)


def _timer_runs(name: str) -> list[ReconcileRecord]:
    return list(ReconcileRecord.objects.filter(reconciler=TIMED, name=name,
                                               triggers__contains=["timer:beat"]).order_by("id"))


def test_a_timer_fires_per_object_through_the_ledger_and_survives_a_restart(kube, namespace,
                                                                            operator):
    operator.start_watcher(TIMED)
    operator.start_worker(concurrency=2, pool="threads")
    create(kube, namespace, "a", group=GROUP, value=1)
    create(kube, namespace, "b", group=GROUP, value=1)
    wait_for(lambda: converged(kube, namespace, ["a", "b"], GROUP), 60)
    wait_for(lambda: _beats(kube, namespace, "a") >= 3 and _beats(kube, namespace, "b") >= 3,
             30, "three firings of each object's timer")
    runs = _timer_runs("a")
    assert all(r.phase == "timer" and r.outcome == "success" for r in runs), runs
    # A change is a reconcile, never mistaken for a timer, and the two never overlap.
    patch(kube, namespace, "a", group=GROUP, value=2)
    wait_for(lambda: converged(kube, namespace, ["a"], GROUP), 30)
    assert_no_overlapping_runs(TIMED)

    # The whole operator restarts: the schedule is in PostgreSQL, the firings go on.
    for proc in operator.watchers + operator.workers:
        proc.stop()
    operator.watchers.clear()
    operator.workers.clear()
    before = _beats(kube, namespace, "a")
    time.sleep(2)
    operator.start_watcher(TIMED)
    operator.start_worker(concurrency=2, pool="threads")
    wait_for(lambda: _beats(kube, namespace, "a") >= before + 2, 30,
             "the timer firing again after the restart")

    # A deleted object's timer goes with it.
    client.CustomObjectsApi(kube).delete_namespaced_custom_object(GROUP, "v1", namespace,
                                                                  "probes", "b")
    wait_for(lambda: not Timer.objects.filter(reconciler=TIMED, name="b").exists(), 60,
             "the deleted object's timer row dropped")
    assert Timer.objects.filter(reconciler=TIMED, name="a", timer="beat").count() == 1
    assert_no_overlapping_runs(TIMED)


def test_a_failing_timer_is_retried_as_the_timer(kube, namespace, operator):
    operator.start_watcher(TIMED)
    operator.start_worker(concurrency=2, pool="threads")
    create(kube, namespace, "flaky", group=GROUP, value=1, timerFails=1)
    wait_for(lambda: _beats(kube, namespace, "flaky") >= 2, 30, "the timer succeeding")
    runs = _timer_runs("flaky")
    assert runs[0].outcome == "error" and "scripted timer failure" in runs[0].error_message
    # The retry ran the timer (its trigger says so), not a reconcile.
    retry = runs[1]
    assert retry.outcome == "success" and retry.phase == "timer", (retry.triggers, retry.phase)
