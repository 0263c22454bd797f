"""Leader election on a real Lease: one leader, standby takes over, no flapping, no trust in
another host's clock."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

from reconcilers import kube, leader
from reconcilers.vocab import rfc3339, utcnow


def elector(api, namespace, identity, lease=3.0):
    return leader.LeaderElector(identity, namespace, "lease", lease_seconds=lease, api=api)


def test_one_candidate_wins_and_the_other_waits(api, namespace):
    a, b = elector(api, namespace, "a"), elector(api, namespace, "b")
    a.step()
    b.step()
    assert a.is_leader.is_set() and not b.is_leader.is_set()
    lease = kube.request(api, "GET", kube.LEASES.path(namespace, "lease"))
    assert lease["spec"]["holderIdentity"] == "a"


def test_a_standby_takes_over_once_the_leader_stops_renewing(api, namespace):
    a, b = elector(api, namespace, "a"), elector(api, namespace, "b")
    a.step()
    b.step()
    started = time.monotonic()
    while not b.is_leader.is_set() and time.monotonic() - started < 10:
        b.step()
        time.sleep(0.2)
    assert b.is_leader.is_set()
    assert time.monotonic() - started >= 3.0 - 0.3  # not before the lease ran out


def test_a_clean_release_hands_over_at_once(api, namespace):
    a, b = elector(api, namespace, "a"), elector(api, namespace, "b")
    a.step()
    b.step()
    a.release()
    b.step()
    assert b.is_leader.is_set() and not a.is_leader.is_set()


def test_one_failed_renewal_does_not_drop_leadership(api, namespace, monkeypatch):
    a = elector(api, namespace, "a")
    a.step()
    real = kube.request
    calls = {"n": 0}

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise kube.ApiError(500, "InternalError", "etcd blinked")
        return real(*args, **kwargs)

    monkeypatch.setattr(kube, "request", flaky)
    a.step()  # fails
    assert a.is_leader.is_set()
    a.step()
    assert a.is_leader.is_set() and calls["n"] > 1


def test_the_leader_steps_down_when_renewals_fail_past_the_deadline(api, namespace,
                                                                    monkeypatch):
    a = elector(api, namespace, "a")
    a.step()

    def down(*args, **kwargs):
        raise kube.ApiError(503, "ServiceUnavailable", "api-server down")

    monkeypatch.setattr(kube, "request", down)
    deadline = time.monotonic() + a.renew_deadline + 1
    while a.is_leader.is_set() and time.monotonic() < deadline:
        a.step()
        time.sleep(0.1)
    assert not a.is_leader.is_set()  # before its lease (3 s) could expire for others


def test_a_live_holder_with_a_clock_far_behind_keeps_its_lease(api, namespace):
    """The holder's renewTime is a day old by our clock, but it keeps changing: alive."""
    stop = threading.Event()
    kube.request(api, "POST", kube.LEASES.path(namespace), {
        "metadata": {"name": "lease"},
        "spec": {"holderIdentity": "skewed", "leaseDurationSeconds": 2,
                 "renewTime": rfc3339(utcnow() - timedelta(days=1), micros=True)}})

    def renew_with_old_clock():
        t = utcnow() - timedelta(days=1)
        while not stop.wait(0.3):
            t += timedelta(seconds=0.3)
            lease = kube.request(api, "GET", kube.LEASES.path(namespace, "lease"))
            lease["spec"]["renewTime"] = rfc3339(t, micros=True)
            kube.request(api, "PUT", kube.LEASES.path(namespace, "lease"), lease)

    holder = threading.Thread(target=renew_with_old_clock, daemon=True)
    holder.start()
    try:
        b = elector(api, namespace, "b", lease=2.0)
        end = time.monotonic() + 5
        while time.monotonic() < end:
            b.step()
            assert not b.is_leader.is_set()
            time.sleep(0.2)
    finally:
        stop.set()
        holder.join(5)


def test_a_dead_holder_with_a_clock_far_ahead_is_replaced(api, namespace):
    kube.request(api, "POST", kube.LEASES.path(namespace), {
        "metadata": {"name": "lease"},
        "spec": {"holderIdentity": "dead", "leaseDurationSeconds": 2,
                 "renewTime": rfc3339(utcnow() + timedelta(days=1), micros=True)}})
    b = elector(api, namespace, "b", lease=2.0)
    end = time.monotonic() + 8
    while not b.is_leader.is_set() and time.monotonic() < end:
        b.step()
        time.sleep(0.2)
    assert b.is_leader.is_set()


def _campaign(e: leader.LeaderElector) -> tuple[threading.Thread, threading.Event]:
    stop = threading.Event()
    thread = threading.Thread(target=e.run, args=(stop,), daemon=True)
    thread.start()
    return thread, stop


def test_a_standby_takes_a_released_lease_at_once_not_at_its_next_round(api, namespace):
    """A rolling update: the leader stops cleanly and releases; the standby watching the Lease
    leads well before its next round (8 s away here) would have found it free."""
    a = elector(api, namespace, "a", lease=60.0)
    a.step()
    b = elector(api, namespace, "b", lease=60.0)
    assert b.retry_period == 8.0
    thread, stop = _campaign(b)
    try:
        assert b.watching.wait(10), "the standby never opened its Lease watch"
        time.sleep(0.5)  # its first round is over: it found the Lease held
        assert not b.is_leader.is_set()
        released = time.monotonic()
        a.release()
        assert b.is_leader.wait(4.0), "the standby waited for its next round"
        assert time.monotonic() - released < b.retry_period
        lease = kube.request(api, "GET", kube.LEASES.path(namespace, "lease"))
        assert lease["spec"]["holderIdentity"] == "b"
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive()
    # ... and its own clean stop released the Lease in turn.
    lease = kube.request(api, "GET", kube.LEASES.path(namespace, "lease"))
    assert not lease["spec"].get("holderIdentity")


def test_a_standby_that_may_not_watch_the_lease_still_takes_over_at_its_next_round(
        api, namespace, monkeypatch, caplog):
    def forbidden(self, api, stop):
        raise kube.ApiError(403, "Forbidden", "leases is forbidden: cannot watch")

    monkeypatch.setattr(leader.LeaderElector, "_watch_once", forbidden)
    a = elector(api, namespace, "a")
    a.step()
    b = elector(api, namespace, "b")  # lease 3 s: a round every 0.4 s
    thread, stop = _campaign(b)
    try:
        time.sleep(1.0)
        assert not b.is_leader.is_set()
        a.release()
        assert b.is_leader.wait(5.0)
    finally:
        stop.set()
        thread.join(10)
    warnings = [r for r in caplog.records if "may not watch the Lease" in r.getMessage()]
    assert len(warnings) == 1  # said once, not at every reconnect


def test_a_standby_that_took_over_ignores_its_own_renewals_on_the_watch(api, namespace):
    """Renewals change the Lease every round; they must not make the new leader renew faster."""
    a = elector(api, namespace, "a", lease=3.0)
    a.step()
    b = elector(api, namespace, "b", lease=3.0)  # a round every 0.4 s
    rounds = {"n": 0}
    step = b.step

    def counted():
        rounds["n"] += 1
        step()

    b.step = counted
    thread, stop = _campaign(b)
    try:
        assert b.watching.wait(10)
        a.release()
        assert b.is_leader.wait(5)
        rounds["n"] = 0
        time.sleep(2.0)
        assert b.watching.is_set()  # still watching: its own renewals arrive, and are ignored
    finally:
        stop.set()
        thread.join(10)
    assert rounds["n"] <= 2.0 / b.retry_period + 1


def test_a_watcher_that_leads_at_once_opens_no_lease_watch(api, namespace, monkeypatch):
    """A restarted watcher with no rival: nothing but the rounds on its way to streaming."""
    opened = []
    monkeypatch.setattr(leader.LeaderElector, "_watch", lambda self, stop: opened.append(self))
    a = elector(api, namespace, "a", lease=3.0)
    thread, stop = _campaign(a)
    try:
        assert a.is_leader.wait(5)
        time.sleep(1.0)  # two more rounds, all won
    finally:
        stop.set()
        thread.join(10)
    assert opened == []
    a.step()  # its clean stop released the Lease: it takes it back
    b = elector(api, namespace, "b", lease=3.0)
    thread, stop = _campaign(b)  # b stands by, and watches
    try:
        deadline = time.monotonic() + 5
        while not opened and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        thread.join(10)
    assert opened == [b]
