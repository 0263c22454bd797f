"""The leading watcher's periodic tasks: beat's schedule, sent on its intervals, until told to
stop, through broker failures."""

from __future__ import annotations

import threading
import time

from reconcilers._queue import periodic


def test_each_task_is_sent_on_its_interval_until_leading_ends(monkeypatch):
    monkeypatch.setattr(periodic, "FIRST_AFTER", {"prune": 0.05})
    sent: list[tuple[str, float]] = []
    stop = threading.Event()
    failures = {"reap": 1}

    def send(name: str) -> None:
        sent.append((name, time.monotonic()))
        if failures.get(name):
            failures[name] -= 1
            raise ConnectionError("broker down")  # logged; the next interval sends again

    schedule = {"r": {"task": "reap", "schedule": 0.1}, "p": {"task": "prune", "schedule": 10}}
    started = time.monotonic()
    sender = periodic.Sender(schedule, send, until=stop.is_set)
    sender.start()
    time.sleep(0.75)
    stop.set()
    sender.join(2)
    assert not sender.is_alive()
    reaps = [t - started for name, t in sent if name == "reap"]
    prunes = [t - started for name, t in sent if name == "prune"]
    assert 5 <= len(reaps) <= 8, reaps  # every 0.1 s, the first after one interval
    assert reaps[0] >= 0.09
    assert len(prunes) == 1 and prunes[0] < 0.3  # soon after leading begins, then hourly
    count = len(sent)
    time.sleep(0.3)
    assert len(sent) == count  # nothing after leading ended
