"""Leader election on a real Lease: one leader, standby takes over, no flapping, no trust in
another host's clock."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

from reconcilers._kube import kube
from reconcilers._watch import leader
from reconcilers._base.vocab import rfc3339, utcnow


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


# --- the renew deadline and the term ---------------------------------------------------------

def test_the_leader_steps_down_at_its_renew_deadline_while_a_renewal_still_hangs(
        api, namespace, monkeypatch):
    """A slow api-server: the renewal is sent and no answer comes. client-go's leader stops at
    RenewDeadline whatever its renew call is doing; stepping down only after the round ended
    led for seconds past the lease others judge by."""
    a = elector(api, namespace, "a", lease=3.0)  # renew deadline 2 s, a round every 0.4 s
    hanging, answer = threading.Event(), threading.Event()
    slow_renewals = {"on": False, "sent": 0.0}
    real = kube.request

    def renew_slowly(api_, method, path, *args, **kwargs):
        if method == "PUT" and slow_renewals["on"]:
            slow_renewals["sent"] = time.monotonic()
            hanging.set()
            answer.wait(30)
        return real(api_, method, path, *args, **kwargs)

    monkeypatch.setattr(kube, "request", renew_slowly)
    rounds = threading.Semaphore(0)
    step = a.step

    def counted():
        step()
        rounds.release()

    a.step = counted
    thread, stop = _campaign(a)
    try:
        assert a.is_leader.wait(5)
        slow_renewals["on"] = True
        since = time.monotonic()  # no renewal can succeed after this
        assert hanging.wait(5), "no renewal was sent"
        while a.is_leader.is_set() and time.monotonic() - since < a.renew_deadline + 2:
            time.sleep(0.01)
        stepped_down = time.monotonic() - since
        assert not a.is_leader.is_set(), "still leading with its renewal in flight"
        assert not answer.is_set()
        assert stepped_down <= a.renew_deadline + 0.5  # inside the lease (3 s) others judge by
        # A renewal answered more than the deadline after it was sent proves nothing about
        # now: no leadership from it ...
        late = slow_renewals["sent"] + a.renew_deadline + 0.1 - time.monotonic()
        if late > 0:
            time.sleep(late)  # what is under test: how late the answer comes
        while rounds.acquire(blocking=False):
            pass
        slow_renewals["on"] = False
        answer.set()
        assert rounds.acquire(timeout=5)
        assert not a.is_leader.is_set()
        # ... but the next, prompt one leads again: the Lease is still its own.
        assert a.is_leader.wait(5)
    finally:
        answer.set()
        stop.set()
        thread.join(10)


def fenced(api, namespace, identity, clock=time.monotonic):
    from reconcilers._kube import fence

    return leader.LeaderElector(
        identity, namespace, "lease", lease_seconds=3.0, api=api, clock=clock,
        fence=lambda n: fence.raise_fence(fence.Term(f"{namespace}/lease", n)))


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_each_leader_has_a_higher_term_and_raises_the_fence_before_leading(
        api, namespace, redis_client):
    from reconcilers._kube import fence

    a = fenced(api, namespace, "a")
    a.step()
    assert a.is_leader.is_set() and a.term == 0
    clock = Clock()
    b = fenced(api, namespace, "b", clock)
    b.step()
    clock.now += 3.5  # a paused past its lease
    b.step()
    assert b.is_leader.is_set() and b.term == 1
    assert fence.raise_fence(fence.Term(f"{namespace}/lease", 0)) == 1
    a.step()  # a wakes: its renewal meets b's Lease, and its term stays what it was
    assert a.term == 0


def test_a_lease_made_again_continues_its_terms_above_the_fence(api, namespace, redis_client):
    """A deleted Lease comes back with leaseTransitions 0: the fence (1) would refuse every
    write of its new holder for ever, so the holder moves the term above it."""
    from reconcilers._kube import fence

    a = fenced(api, namespace, "a")
    a.step()
    clock = Clock()
    b = fenced(api, namespace, "b", clock)
    b.step()
    clock.now += 3.5
    b.step()
    assert b.term == 1
    kube.request(api, "DELETE", kube.LEASES.path(namespace, "lease"))
    c = fenced(api, namespace, "c")
    c.step()
    assert c.is_leader.is_set() and c.term == 2
    lease = kube.request(api, "GET", kube.LEASES.path(namespace, "lease"))
    assert lease["spec"]["leaseTransitions"] == 2 and lease["spec"]["holderIdentity"] == "c"
    assert fence.raise_fence(fence.Term(f"{namespace}/lease", 0)) == 2


def test_a_predecessor_cannot_move_the_term_of_a_lease_it_lost(api, namespace, redis_client,
                                                               monkeypatch):
    """The predecessor's renewal landed, then it paused before raising the fence; meanwhile a
    successor took the Lease (term 1). Waking, it finds the fence above its term - as after a
    Lease made again - but its move is conditional on the Lease it wrote: 409, not leading."""
    from reconcilers._kube import fence

    a = fenced(api, namespace, "a")
    a.step()
    clock = Clock()
    b = fenced(api, namespace, "b", clock)
    b.step()
    a._fenced = None  # a's next renewal raises the fence again, as after a Redis outage
    raise_fence = a.fence

    def paused_then_raise(number):
        b.step()  # the successor sees a's renewal ...
        clock.now += 3.5
        b.step()  # ... and takes over once it is a lease old, while a is paused
        assert b.is_leader.is_set()
        return raise_fence(number)

    a.fence = paused_then_raise
    a.is_leader.clear()
    a.step()
    assert not a.is_leader.is_set() and a.term == 0
    lease = kube.request(api, "GET", kube.LEASES.path(namespace, "lease"))
    assert lease["spec"]["holderIdentity"] == "b" and lease["spec"]["leaseTransitions"] == 1
    assert fence.raise_fence(fence.Term(f"{namespace}/lease", 0)) == 1


def test_a_black_holed_redis_does_not_hold_the_round_that_takes_the_lease(api, namespace,
                                                                         settings):
    """Raising the fence is part of the round that takes the Lease: against a Redis that
    accepts and never answers it gives up in 2 s and the candidate leads (its writes raise
    the fence once Redis answers), instead of timing out after 10 s, past its deadline."""
    import socket

    from reconcilers._kube import fence

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # connections complete in the backlog; nothing ever answers
    try:
        settings.REDIS_URL = f"redis://127.0.0.1:{silent.getsockname()[1]}/0"
        a = leader.LeaderElector(
            "a", namespace, "lease", lease_seconds=15.0, api=api,
            fence=lambda n: fence.raise_fence(fence.Term(f"{namespace}/lease", n)))
        started = time.monotonic()
        a.step()
        assert time.monotonic() - started < 3
        assert a.is_leader.is_set() and a.term == 0
    finally:
        silent.close()
