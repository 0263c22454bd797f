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
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta

from . import kube
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

    def campaigning(self) -> bool:
        """The api-server answered a round within the last lease: a standby that can take
        over (readiness of a watcher that does not lead)."""
        answered = self._answered_at
        return answered is not None and self._clock() - answered < self.lease_seconds

    def run(self, stop: threading.Event) -> None:
        """Campaign and renew until ``stop``; ``is_leader`` follows the outcome."""
        while not stop.is_set():
            self.step()
            stop.wait(self.retry_period)
        if self.is_leader.is_set():
            self.release()

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
