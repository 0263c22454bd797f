"""The stall check judges time by one clock, this worker's: hosts' clocks differ.

The ledger stamps each message with its send time by the database's clock; the worker's host
may be off from it by any amount. Each test skews the wall clock of the worker's health
module (its module's ``time``) by an hour, as on such a host, and drives its monotonic clock
by hand; PostgreSQL, Redis and the message stay real.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from reconcilers._queue import broker, workqueue
from reconcilers._run import health
from reconcilers._base.reconcile import Key

pytestmark = pytest.mark.django_db(transaction=True)

AFTER = 60.0
KEY = Key("widgets.nowhere.example.com", "ns", "waits")


@pytest.fixture
def clock(monkeypatch):
    """The health module's clocks: its wall clock skewed by ``skew`` seconds, its monotonic
    clock moved on only by ``advance``."""
    real = time.time
    state = SimpleNamespace(skew=0.0, passed=0.0, start=time.monotonic())
    fake = SimpleNamespace(**{n: getattr(time, n) for n in dir(time) if not n.startswith("_")})
    fake.time = lambda: real() + state.skew + state.passed
    fake.monotonic = lambda: state.start + state.passed
    monkeypatch.setattr(health, "time", fake)

    def advance(seconds: float) -> None:
        state.passed += seconds

    state.advance = advance
    return state


@pytest.fixture
def idle_worker(clock, redis_client, settings):
    """A worker that received nothing for longer than the bound and runs nothing, its
    consumer stopped (nothing takes from its queue), with its probes' view of its queues."""
    settings.RECONCILERS_WORKER_STALLED_AFTER = AFTER
    consumer = SimpleNamespace(app=broker.app())
    probes = health.WorkerProbes(consumer)
    probes.last_received -= 2 * AFTER
    return probes


def test_a_host_clock_ahead_of_the_databases_sees_no_stall_in_a_message_just_sent(
        clock, idle_worker, redis_client):
    clock.skew = +3600
    workqueue.add([KEY], "test")
    assert redis_client.llen(broker.default_queue()) == 1
    assert idle_worker.stalled() is None


def test_a_host_clock_behind_the_databases_still_sees_a_message_wait(
        clock, idle_worker, redis_client):
    clock.skew = -3600
    workqueue.add([KEY], "test")
    assert idle_worker.stalled() is None  # it has only just been sent
    clock.advance(AFTER + 1)
    why = idle_worker.stalled()
    assert why is not None and "consumer stopped" in why
