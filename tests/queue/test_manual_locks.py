"""Manual actions lock the ledger's rows in its one order, even across reconcilers.

A resync or pause of keys of several reconcilers is one transaction, a statement per
reconciler: taken in the order the keys came (an admin's selection), the rows of the second
reconciler could be locked after the first's while an enqueue of both (key order) held one
and waited for the other.
"""

from __future__ import annotations

import threading
import time

import pytest

from reconcilers._queue import ledger, manual
from reconcilers._base.reconcile import Key

from .test_ledger import _race

pytestmark = pytest.mark.django_db(transaction=True)

FIRST, SECOND = Key("a.nowhere.example.com", "ns", "x"), Key("b.nowhere.example.com", "ns", "x")


@pytest.mark.parametrize("action", ["resync", "pause"])
def test_an_action_over_several_reconcilers_never_deadlocks_with_an_enqueue(
        action, monkeypatch, redis_client):
    ledger.enqueue([FIRST, SECOND], "added")
    audit, audits = manual._audit, []
    holds_one = threading.Event()

    def audit_slowly(*args, **kwargs):
        audits.append(args)
        if len(audits) == 2:  # the first reconciler's rows are locked by now
            holds_one.set()
            time.sleep(0.3)
        return audit(*args, **kwargs)

    monkeypatch.setattr(manual, "_audit", audit_slowly)
    selected = [SECOND, FIRST]  # as an admin's list may hold them

    def act() -> None:
        if action == "resync":
            manual.resync(None, selected)
        else:
            manual.set_paused(None, selected, True)

    def enqueue_both() -> None:
        assert holds_one.wait(5)
        ledger.enqueue([FIRST, SECOND], "modified")

    assert _race(act, enqueue_both) == []
