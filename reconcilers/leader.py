"""Leader election through a ``coordination.k8s.io/v1`` Lease, as client-go's leaderelection.

Only the holder of the Lease runs watch streams; the others wait and take over when the holder
stops renewing for ``lease_seconds``. Updates carry the Lease's resourceVersion, so two
candidates can never both win the same term (the api-server rejects the stale write with 409).
The ledger dedups anyway, so a brief overlap while leadership moves costs nothing but work.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime, timedelta, timezone

from kubernetes.client.exceptions import ApiException

from . import kube

log = logging.getLogger(__name__)


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _fmt(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(s: str | None) -> datetime | None:
    if not s:
        return None
    return datetime.strptime(s.replace("Z", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z")


class LeaderElector:
    def __init__(self, identity: str, namespace: str, name: str, lease_seconds: int = 15,
                 api=None):
        self.identity, self.namespace, self.name = identity, namespace, name
        self.lease_seconds = lease_seconds
        self.api = api or kube.new_api_client()
        self.is_leader = threading.Event()
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"

    def try_acquire_or_renew(self) -> bool:
        now = _now()
        spec = {"holderIdentity": self.identity, "leaseDurationSeconds": self.lease_seconds,
                "renewTime": _fmt(now)}
        try:
            lease = kube.request(self.api, "GET", f"{self.path}/{self.name}")
        except ApiException as e:
            if e.status != 404:
                raise
            try:
                kube.request(self.api, "POST", self.path, {
                    "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": {**spec, "acquireTime": _fmt(now), "leaseTransitions": 0}})
                return True
            except ApiException as e2:
                if e2.status == 409:
                    return False
                raise
        current = lease.get("spec") or {}
        holder = current.get("holderIdentity")
        renewed = _parse(current.get("renewTime")) or datetime.min.replace(tzinfo=timezone.utc)
        duration = int(current.get("leaseDurationSeconds") or self.lease_seconds)
        expired = renewed + timedelta(seconds=duration) < now
        if holder and holder != self.identity and not expired:
            return False
        new_spec = {**current, **spec}
        if holder != self.identity:
            new_spec["acquireTime"] = _fmt(now)
            new_spec["leaseTransitions"] = int(current.get("leaseTransitions") or 0) + 1
        lease["spec"] = new_spec
        try:
            kube.request(self.api, "PUT", f"{self.path}/{self.name}", lease)
            return True
        except ApiException as e:
            if e.status == 409:  # someone else renewed or took it first
                return False
            raise

    def run(self, stop: threading.Event) -> None:
        """Campaign and renew until ``stop``; ``is_leader`` follows the outcome."""
        retry = max(1.0, self.lease_seconds / 5)
        while not stop.is_set():
            try:
                won = self.try_acquire_or_renew()
            except Exception as exc:
                log.warning("leader election: %s", exc)
                won = False
            if won and not self.is_leader.is_set():
                log.info("leader election: %s is now the leader", self.identity)
                self.is_leader.set()
            elif not won and self.is_leader.is_set():
                log.warning("leader election: %s lost the lease", self.identity)
                self.is_leader.clear()
            stop.wait(retry)
        if self.is_leader.is_set():
            self.release()

    def release(self) -> None:
        """Give the lease up on a clean stop so a standby takes over at once."""
        try:
            lease = kube.request(self.api, "GET", f"{self.path}/{self.name}")
            if (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                lease["spec"]["holderIdentity"] = None
                lease["spec"]["renewTime"] = _fmt(_now() - timedelta(days=1))
                kube.request(self.api, "PUT", f"{self.path}/{self.name}", lease)
        except Exception as exc:
            log.warning("leader election: release failed: %s", exc)
        self.is_leader.clear()
