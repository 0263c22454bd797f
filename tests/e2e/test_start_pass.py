"""An upgrade reaches every object: a new leader reconciles what it knows when the code or the
settings changed since the last leader's pass (``reconcilers._watch.onstart``)."""

from __future__ import annotations

import pytest

from reconcilers.models import ReconcileRecord, RegisteredReconciler, WatchStream, WorkItem
from reconcilers._base.reconcile import State
from tests.e2e.test_engine import PROBE, create, get
from tests.helpers import free_port, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

NAMES = [f"p{i}" for i in range(5)]


def _notes(kube, namespace: str) -> set:
    return {((get(kube, namespace, n) or {}).get("status") or {}).get("note") for n in NAMES}


def _start_runs() -> int:
    return ReconcileRecord.objects.filter(reconciler=PROBE, triggers__contains=["start"]).count()


def _settled() -> bool:
    recorded = RegisteredReconciler.objects.filter(name=PROBE).exclude(start_fingerprint="")
    busy = WorkItem.objects.filter(reconciler=PROBE).exclude(state=State.IDLE)
    return recorded.exists() and not busy.exists() and ReconcileRecord.objects.filter(
        reconciler=PROBE).count() >= len(NAMES)


def _restart(operator, **env: str) -> None:
    for proc in operator.watchers + operator.workers:
        proc.stop()
    operator.watchers.clear()
    operator.workers.clear()
    operator.env.update(env)
    operator.start_watcher(PROBE)
    operator.start_worker(concurrency=4, pool="threads")


def test_a_restart_with_changed_settings_reconciles_every_existing_object(kube, namespace,
                                                                          operator):
    operator.env["PROBE_NOTE"] = "v1"
    operator.start_watcher(PROBE)
    operator.start_worker(concurrency=4, pool="threads")
    for name in NAMES:
        create(kube, namespace, name, value=1)
    wait_for(lambda: _notes(kube, namespace) == {"v1"}, 60, "every probe reconciled by v1")

    # The deployed "fix": nothing in the cluster changes, only what the reconciler does.
    _restart(operator, PROBE_NOTE="v2")
    wait_for(lambda: _notes(kube, namespace) == {"v2"}, 60,
             "every existing probe reconciled by the new settings")
    assert _start_runs() >= len(NAMES)


def test_a_restart_that_changed_nothing_makes_no_start_pass_unless_always(kube, namespace,
                                                                         operator):
    operator.env["PROBE_NOTE"] = "same"
    operator.start_watcher(PROBE)
    operator.start_worker(concurrency=4, pool="threads")
    for name in NAMES:
        create(kube, namespace, name, value=1)
    wait_for(lambda: _notes(kube, namespace) == {"same"}, 60, "every probe reconciled")
    # The first leader of these settings made its pass; let it be recorded as done, and let
    # every run end: a start key merged into a running one re-runs once it finishes.
    wait_for(_settled, 30, "the first pass recorded and every key idle")
    passes = _start_runs()

    # SIGTERM: the stopping watcher records its stream disconnected. The new one differs only
    # in what is its own, as a hot standby does: its probe port.
    _restart(operator, OPERATOR_WATCHER_HTTP_PORT=str(free_port()))
    operator.watchers[0].wait_for_log(f"start pass: none for {PROBE}", 30)
    wait_for(lambda: WatchStream.objects.filter(reconciler=PROBE, connected=True).exists(), 30,
             "the restarted watcher's stream")
    assert _start_runs() == passes, "nothing changed, yet every object was reconciled"

    _restart(operator, RECONCILERS_RECONCILE_ON_START="always")
    wait_for(lambda: _start_runs() >= passes + len(NAMES), 60,
             "every object reconciled at start in the `always` mode")


def test_a_first_leader_runs_each_existing_object_once(kube, namespace, operator):
    """Its relist enqueues every object already; the start pass must not add a second run."""
    for name in NAMES:
        create(kube, namespace, name, value=1)
    operator.start_watcher(PROBE)
    operator.start_worker(concurrency=4, pool="threads")
    # The pass is made (its keys, if any, in the ledger) and every run has ended: a second
    # run of an object, had the pass enqueued one, is recorded by then.
    operator.watchers[0].wait_for_log(f"objects of {PROBE} enqueued", 60)
    wait_for(_settled, 60, "the pass recorded and every key idle")
    runs = sorted(ReconcileRecord.objects.filter(reconciler=PROBE).values_list("name", flat=True))
    assert runs == sorted(NAMES), runs
