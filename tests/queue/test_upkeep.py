"""The ledger's rows beside the runs, on real PostgreSQL: a paused key is never claimed and
resuming sends what waited; rows of gone objects and of namespaces out of scope are
forgotten, and nothing else."""

from __future__ import annotations

import pytest

from reconcilers._base.reconcile import Key
from reconcilers._queue import ledger, upkeep
from reconcilers.models import WorkItem
from tests.queue.test_ledger import LEASE, R, key, process

pytestmark = pytest.mark.django_db(transaction=True)


def test_paused_keys_are_not_claimed_and_resume_sends_what_waited():
    (d,) = ledger.enqueue([key("a")], "added")
    upkeep.set_paused([key("a")], True)
    assert ledger.claim(key("a"), d.token, "w", LEASE) is None
    assert ledger.enqueue([key("a")], "modified") == []
    (resumed,) = upkeep.set_paused([key("a")], False)
    claim = ledger.claim(key("a"), resumed.token, "w", LEASE)
    assert claim.triggers == ["added", "modified"]


def test_rows_of_objects_long_gone_are_forgotten_but_live_ones_stay():
    (gone,) = ledger.enqueue([key("gone")], "deleted")
    (live,) = ledger.enqueue([key("live")], "added")
    process(key("gone"), gone.token, "gone")
    process(key("live"), live.token, "success")
    assert upkeep.forget_gone(older_than=60) == 0  # not yet: it might come back
    WorkItem.objects.update(last_finished_at="2000-01-01T00:00:00Z")
    assert upkeep.forget_gone(older_than=60) == 1
    assert list(WorkItem.objects.values_list("name", flat=True)) == ["live"]
    (again,) = ledger.enqueue([key("gone")], "added")  # recreated: a fresh row
    assert process(key("gone"), again.token) is None


def test_forgetting_a_scope_drops_its_reconcilers_waiting_keys_there_and_nothing_else():
    """``scopes`` forgets the keys of namespaces nobody watches any more: not a running key
    (its run ends first), not another reconciler's, not a kept namespace's."""
    other = Key("others.test.operator.local", "gone", "x")
    for k in (key("a", "gone"), key("b", "gone"), key("c", "kept"), key("d", "elsewhere"),
              other):
        ledger.enqueue([k], "added")
    (running,) = ledger.enqueue([key("r", "gone")], "added")
    assert ledger.claim(running.key, running.token, "w", LEASE) is not None

    assert upkeep.forget_in(R, ["gone"]) == 2
    assert sorted(WorkItem.objects.values_list("namespace", "name")) == [
        ("elsewhere", "d"), ("gone", "r"), ("gone", "x"), ("kept", "c")]
    assert upkeep.forget_outside(R, ["kept"]) == 1  # "elsewhere"; "r" still runs
    assert sorted(WorkItem.objects.values_list("namespace", "name")) == [
        ("gone", "r"), ("gone", "x"), ("kept", "c")]
