"""Leader election through a ``coordination.k8s.io/v1`` Lease, as client-go's leaderelection.

Only the holder of the Lease runs watch streams; the others wait and take over when the holder
stops renewing. The rules, each from client-go:

- Expiry is judged by the *local* clock of the observer: a candidate notes when it last saw the
  Lease's record change and treats it as expired ``leaseDurationSeconds`` after that. Another
  host's ``renewTime`` is never compared with this host's clock, so clock skew cannot make two
  leaders.
- The leader keeps leading through failed renewals (an error, a 409, a slow api-server) until
  ``renew_deadline`` has passed since the start of its last successful round; then it steps
  down at once, even while a renewal is still waiting for an answer (a guard thread watches
  the deadline, as client-go's renew loop runs under a context that ends at RenewDeadline).
  Every call is bounded by a timeout well inside that deadline, so a round ends too. A round
  counts from its start, not its answer: others see the renewal no earlier than it was sent.
- Updates carry the Lease's resourceVersion, so two candidates can never both win the same
  term (the api-server rejects the stale write with 409).

Each acquisition is a term: the Lease's ``leaseTransitions`` after it (``term``), which the
api-server's ordering of conditional updates makes higher for every successor. ``fence``
raises the shared cache's write fence to it (``fence.raise_fence``) before ``is_leader`` is
set, so a paused predecessor's cache writes are refused from then on. A fence already above
the term while this process holds the Lease means the Lease was deleted and made again (its
count restarted): the term is moved above the fence by one more conditional update.

The ledger dedups anyway, so a brief overlap while leadership moves costs nothing but work
(an extra run); the cache, which a run reads, is what the term fences.

One departure, for speed only: a standby also *watches* the Lease, so one released by a clean
stop (a rolling update) is taken at once instead of at its next round - client-go polls, and
its retry period (2 s) is then time with no leader at all. The rounds still decide everything;
the watch only starts one early. Without it (say, RBAC without ``watch`` on the Lease), polling
goes on as before.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta
from typing import Callable

from reconcilers._kube import kube
from reconcilers._base import metrics
from reconcilers._base.vocab import rfc3339, utcnow

log = logging.getLogger(__name__)


class LeaderElector:
    """Campaigns for one Lease; ``is_leader`` is set while this process may stream."""

    def __init__(self, identity: str, namespace: str, name: str, lease_seconds: float = 15,
                 api=None, renew_deadline: float | None = None,
                 retry_period: float | None = None, clock=time.monotonic,
                 fence: Callable[[int], int] | None = None):
        """``fence(term)``: raise the write fence to ``term``, return the highest term it has
        seen (``fence.raise_fence``); None: no fence (tests of the election alone)."""
        self.identity, self.namespace, self.name = identity, namespace, name
        self.lease_seconds = lease_seconds
        # client-go's defaults are 15 s / 10 s / 2 s: keep the same proportions.
        self.renew_deadline = renew_deadline or lease_seconds * 2 / 3
        self.retry_period = retry_period or max(0.2, lease_seconds * 2 / 15)
        if not self.retry_period < self.renew_deadline < self.lease_seconds:
            raise ValueError("leader election needs retry_period < renew_deadline < lease")
        self.api = api or kube.new_api_client()
        self.is_leader = threading.Event()
        self._clock = clock
        self._observed: tuple | None = None  # the Lease record last seen
        self._observed_at = 0.0  # local clock when it last changed
        self._renewed_at = 0.0  # local clock at the start of our last successful round
        self.fence = fence
        # The Lease's ``leaseTransitions`` when this process last acquired it; set before
        # ``is_leader`` and changed only by an acquisition.
        self.term: int | None = None
        self._fenced: int | None = None  # the term the fence is known to have reached
        self._lock = threading.Lock()  # ``is_leader`` is decided by the round or the guard
        self._answered_at: float | None = None  # local clock of the last round that got answers
        # Every call returns (or fails) well inside the renew deadline.
        self._timeout = (min(2.0, self.renew_deadline / 4), self.renew_deadline / 3)
        self._wake = threading.Event()  # a round is due now: the Lease was released, or stop
        self.watching = threading.Event()  # the Lease watch is open (standby takeover is fast)
        self._watch_resp = None
        metrics.leader_status(name, False)

    @property
    def _path(self) -> str:
        return kube.LEASES.path(self.namespace, self.name)

    def _observe(self, spec: dict) -> None:
        record = (spec.get("holderIdentity"), spec.get("renewTime"),
                  spec.get("leaseTransitions"), spec.get("leaseDurationSeconds"))
        if record != self._observed:
            self._observed, self._observed_at = record, self._clock()

    def try_acquire_or_renew(self) -> bool:
        """One round: True when this process holds the Lease afterwards."""
        started = self._clock()
        now = utcnow()
        spec = {"holderIdentity": self.identity,
                "leaseDurationSeconds": int(round(self.lease_seconds)),
                "renewTime": rfc3339(now, micros=True)}
        lease = kube.get_or_none(self.api, self._path, timeout=self._timeout)
        if lease is None:
            try:
                lease = kube.request(self.api, "POST", kube.LEASES.path(self.namespace), {
                    "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": {**spec, "acquireTime": spec["renewTime"], "leaseTransitions": 0}},
                    timeout=self._timeout)
            except kube.ApiError as e:
                if e.conflict:
                    return False
                raise
            return self._held(lease, started)
        current = lease.get("spec") or {}
        self._observe(current)
        holder = current.get("holderIdentity")
        duration = float(current.get("leaseDurationSeconds") or self.lease_seconds)
        held_by_other = holder and holder != self.identity
        if held_by_other and self._clock() < self._observed_at + duration:
            return False
        new_spec = {**current, **spec}
        if holder != self.identity:
            new_spec["acquireTime"] = spec["renewTime"]
            new_spec["leaseTransitions"] = int(current.get("leaseTransitions") or 0) + 1
        lease["spec"] = new_spec
        try:
            lease = kube.request(self.api, "PUT", self._path, lease, timeout=self._timeout)
        except kube.ApiError as e:
            if e.conflict:  # someone else renewed or took it first
                return False
            raise
        self._observe(new_spec)
        return self._held(lease, started)

    def _held(self, lease: dict, started: float) -> bool:
        """This round wrote ``lease``: take its term, fenced, and count the renewal from the
        round's start. False when the Lease was lost meanwhile."""
        term = int(lease["spec"].get("leaseTransitions") or 0)
        if self.fence is not None and self._fenced != term:
            try:
                seen = self.fence(term)
            except Exception as exc:  # its writes raise the fence once Redis answers
                log.warning("leader election: could not raise the write fence to term %d "
                            "(retried next round): %s", term, exc)
                seen = None
            if seen is not None and seen > term:
                # Holding the Lease with a term the fence has passed: the Lease was made
                # again. Continue its count above the fence - conditional on the Lease this
                # round wrote, so a predecessor that woke up here gets 409 instead.
                log.warning("leader election: Lease term %d is below the write fence (%d); "
                            "moving it to %d", term, seen, seen + 1)
                lease["spec"]["leaseTransitions"] = seen + 1
                try:
                    lease = kube.request(self.api, "PUT", self._path, lease,
                                         timeout=self._timeout)
                except kube.ApiError as e:
                    if e.conflict:
                        return False
                    raise
                self._observe(lease["spec"])
                return self._held(lease, started)
            if seen is not None:
                self._fenced = term
        self.term = term
        self._renewed_at = started
        return True

    def step(self) -> None:
        """One campaign round, then ``is_leader`` follows the rules in the module docstring."""
        try:
            won = self.try_acquire_or_renew()
            self._answered_at = self._clock()
        except Exception as exc:
            log.warning("leader election: %s", exc)
            won = False
        with self._lock:
            # A round that won only after the deadline (a slow answer) proves nothing about
            # now: the guard may already have stepped down, and must not be undone.
            if won and self._clock() - self._renewed_at < self.renew_deadline:
                if not self.is_leader.is_set():
                    log.info("leader election: %s is now the leader (term %s)", self.identity,
                             self.term)
                    self.is_leader.set()
            else:
                self._step_down_if_late()
        metrics.leader_status(self.name, self.is_leader.is_set())

    def _step_down_if_late(self) -> None:
        """Under ``_lock``: stop leading once the renew deadline has passed."""
        late = self._clock() - self._renewed_at
        if self.is_leader.is_set() and late >= self.renew_deadline:
            log.warning("leader election: %s could not renew for %.1fs; stepping down",
                        self.identity, late)
            self.is_leader.clear()
            metrics.leader_status(self.name, False)

    def _guard(self, stop: threading.Event) -> None:
        """Step down when the renew deadline passes, whatever the round is doing: a renewal
        waiting on a slow api-server (or Redis) must not keep this process streaming."""
        while not stop.is_set():
            left = self.retry_period
            if self.is_leader.is_set():
                left = self._renewed_at + self.renew_deadline - self._clock()
                if left <= 0:
                    with self._lock:
                        self._step_down_if_late()
                    continue
            stop.wait(max(0.005, min(left, self.retry_period)))

    def campaigning(self) -> bool:
        """The api-server answered a round within the last lease: a standby that can take
        over (readiness of a watcher that does not lead)."""
        answered = self._answered_at
        return answered is not None and self._clock() - answered < self.lease_seconds

    def run(self, stop: threading.Event) -> None:
        """Campaign and renew until ``stop``; ``is_leader`` follows the outcome. A round runs
        every retry period, and at once when the Lease watch sees it released."""
        threading.Thread(target=self._forward_stop, args=(stop,), daemon=True,
                         name="lease-stop").start()
        threading.Thread(target=self._guard, args=(stop,), daemon=True,
                         name="lease-guard").start()
        watch: threading.Thread | None = None
        while not stop.is_set():
            self._wake.clear()  # before the round: a release seen during it still wakes
            self.step()
            if watch is None and not self.is_leader.is_set():
                # Only a standby needs it: a watcher that leads at once (a restart) does not
                # pay for the connection on its way to streaming.
                watch = threading.Thread(target=self._watch, args=(stop,), daemon=True,
                                         name="lease-watch")
                watch.start()
            self._wake.wait(self.retry_period)
        if self.is_leader.is_set():
            self.release()

    def _forward_stop(self, stop: threading.Event) -> None:
        stop.wait()
        self._wake.set()
        resp = self._watch_resp
        if resp is not None:
            try:
                resp.shutdown()
            except Exception:  # already closed
                pass

    def _watch(self, stop: threading.Event) -> None:
        """Wake the campaign whenever the Lease shows no holder (released, or deleted) while
        this process does not lead. Reconnects with backoff; a refusal (403: no ``watch`` in
        the role) only means slower takeovers, so it is logged once, not fatal."""
        api = kube.new_api_client()  # its own connection: the stream holds one
        delay, warned = 0.5, False
        try:
            while not stop.is_set():
                try:
                    self._watch_once(api, stop)
                    delay = 0.5
                except Exception as exc:
                    if stop.is_set():
                        break
                    refused = isinstance(exc, kube.ApiError) and exc.status in (401, 403)
                    if refused and not warned:
                        log.warning("leader election: may not watch the Lease (%s); a standby "
                                    "takes over at its next round instead", exc)
                        warned = True
                    elif not refused:
                        log.info("leader election: Lease watch: %s; reconnecting", exc)
                    stop.wait(delay)
                    delay = min(delay * 2, 30.0)
        finally:
            self.watching.clear()
            api.close()

    def _watch_once(self, api, stop: threading.Event) -> None:
        query = {"watch": "true", "fieldSelector": f"metadata.name={self.name}",
                 "timeoutSeconds": 300}
        resp = kube.request(api, "GET", kube.LEASES.path(self.namespace), query=query,
                            timeout=(self._timeout[0], 330), stream=True)
        self._watch_resp = resp
        try:
            if stop.is_set():  # stopped while connecting: ``_forward_stop`` saw no stream
                return
            self.watching.set()
            for event in kube.watch_events(resp, stop):
                self._seen(event)
        finally:
            self.watching.clear()
            self._watch_resp = None
            resp.release_conn()
            resp.close()

    def _seen(self, event: dict) -> None:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            raise kube.ApiError.from_watch_error(obj)
        if self.is_leader.is_set():
            return  # our own renewals: the rounds run on schedule
        if kind == "DELETED" or not (obj.get("spec") or {}).get("holderIdentity"):
            self._wake.set()

    def release(self) -> None:
        """Give the lease up on a clean stop so a standby takes over at once."""
        try:
            lease = kube.get_or_none(self.api, self._path, timeout=self._timeout)
            if lease and (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                lease["spec"]["holderIdentity"] = None
                lease["spec"]["renewTime"] = rfc3339(utcnow() - timedelta(days=1), micros=True)
                kube.request(self.api, "PUT", self._path, lease, timeout=self._timeout)
        except Exception as exc:
            log.warning("leader election: release failed: %s", exc)
        self.is_leader.clear()
        metrics.leader_status(self.name, False)
