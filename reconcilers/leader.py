"""Leader election through a ``coordination.k8s.io/v1`` Lease, as client-go's leaderelection.

Only the holder of the Lease runs watch streams; the others wait and take over when the holder
stops renewing. The rules, each from client-go:

- Expiry is judged by the *local* clock of the observer: a candidate notes when it last saw the
  Lease's record change and treats it as expired ``leaseDurationSeconds`` after that. Another
  host's ``renewTime`` is never compared with this host's clock, so clock skew cannot make two
  leaders.
- The leader keeps leading through failed renewals (an error, a 409, a slow api-server) until
  ``renew_deadline`` has passed since its last successful renewal; every call is bounded by a
  timeout well inside that deadline, so a hung renewal cannot keep it streaming past its lease.
- Updates carry the Lease's resourceVersion, so two candidates can never both win the same
  term (the api-server rejects the stale write with 409).

The ledger dedups anyway, so a brief overlap while leadership moves costs nothing but work.

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

from . import kube, metrics
from .vocab import rfc3339, utcnow

log = logging.getLogger(__name__)


class LeaderElector:
    """Campaigns for one Lease; ``is_leader`` is set while this process may stream."""

    def __init__(self, identity: str, namespace: str, name: str, lease_seconds: float = 15,
                 api=None, renew_deadline: float | None = None,
                 retry_period: float | None = None, clock=time.monotonic):
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
        self._renewed_at = 0.0  # local clock of our last successful acquire/renew
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
        now = utcnow()
        spec = {"holderIdentity": self.identity,
                "leaseDurationSeconds": int(round(self.lease_seconds)),
                "renewTime": rfc3339(now, micros=True)}
        lease = kube.get_or_none(self.api, self._path, timeout=self._timeout)
        if lease is None:
            try:
                kube.request(self.api, "POST", kube.LEASES.path(self.namespace), {
                    "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": {**spec, "acquireTime": spec["renewTime"], "leaseTransitions": 0}},
                    timeout=self._timeout)
            except kube.ApiError as e:
                if e.conflict:
                    return False
                raise
            self._renewed_at = self._clock()
            return True
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
            kube.request(self.api, "PUT", self._path, lease, timeout=self._timeout)
        except kube.ApiError as e:
            if e.conflict:  # someone else renewed or took it first
                return False
            raise
        self._observe(new_spec)
        self._renewed_at = self._clock()
        return True

    def step(self) -> None:
        """One campaign round, then ``is_leader`` follows the rules in the module docstring."""
        try:
            won = self.try_acquire_or_renew()
            self._answered_at = self._clock()
        except Exception as exc:
            log.warning("leader election: %s", exc)
            won = False
        if won:
            if not self.is_leader.is_set():
                log.info("leader election: %s is now the leader", self.identity)
                self.is_leader.set()
        elif self.is_leader.is_set() and self._clock() - self._renewed_at >= self.renew_deadline:
            log.warning("leader election: %s could not renew for %.1fs; stepping down",
                        self.identity, self._clock() - self._renewed_at)
            self.is_leader.clear()
        metrics.leader_status(self.name, self.is_leader.is_set())

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
