"""The reaper judges time by one clock, the database's: hosts' clocks differ.

Each test skews Python's clock in the reaper only (its module's ``time``), as on a host whose
clock is off by an hour; PostgreSQL, Redis and the messages stay real.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from reconcilers._run import tasks
from reconcilers._queue import workqueue
from reconcilers._base.reconcile import Key

pytestmark = pytest.mark.django_db(transaction=True)

KEYS = [Key("widgets.nowhere.example.com", "ns", f"k{i}") for i in range(30)]


@pytest.fixture
def reaper_clock(monkeypatch):
    """Skew the reaper's wall clock by the given seconds."""
    real = time.time

    def skew(seconds: float) -> None:
        clock = SimpleNamespace(**{n: getattr(time, n) for n in dir(time)
                                   if not n.startswith("_")})
        clock.time = lambda: real() + seconds
        monkeypatch.setattr(tasks, "time", clock, raising=False)

    return skew


@pytest.fixture
def waiting(redis_client, settings):
    """30 messages waiting in Redis for a second (no worker runs)."""
    settings.RECONCILERS_REDISPATCH_AFTER = 0.5
    workqueue.add(KEYS, "manual")
    time.sleep(1.0)
    assert redis_client.llen("celery") == 30


def test_a_reaper_whose_clock_runs_ahead_still_resends_lost_messages(
        waiting, redis_client, reaper_clock):
    """Messages a worker took and died with, while newer ones still wait behind them."""
    for _ in KEYS:
        assert redis_client.rpop("celery") is not None
    behind = [Key("widgets.nowhere.example.com", "ns", f"behind{i}") for i in range(5)]
    workqueue.add(behind, "manual")
    reaper_clock(+3600)
    assert tasks.reap() == 30
    assert redis_client.llen("celery") == 5 + 30


def test_a_reaper_whose_clock_runs_behind_does_not_multiply_a_waiting_backlog(
        waiting, redis_client, reaper_clock):
    reaper_clock(-3600)
    assert tasks.reap() == 0
    assert redis_client.llen("celery") == 30
