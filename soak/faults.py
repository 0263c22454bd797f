"""The soak's faults: each injects one kind (for a window) and undoes it. All but the restarts
act only on the soak's own processes, its Toxiproxy, and cluster objects that match only the
soak's own ServiceAccount - so the ``proxy`` mode can run on a stack others use; the restarts
of PostgreSQL, Redis (empty, or from a stale snapshot) and the api-server run in ``all`` mode.

- a worker stopped (SIGSTOP) past its lease, then resumed;
- PostgreSQL (fast shutdown), Redis (empty) and the api-server (behind a readiness gate)
  restarted;
- network faults through Toxiproxy between the operator and PostgreSQL, Redis, the api-server;
- the api-server answering 429: API Priority and Fairness puts the operator's ServiceAccount
  in a priority level with no seats of its own, rejecting whatever finds none free (real 429s
  with Retry-After from the real api-server), while the soak takes seats as that account;
- the api-server answering 500: a validating webhook that cannot be reached, with
  ``failurePolicy: Fail``, matching only the operator's writes in the soak's namespaces;
- the leading watcher paused (SIGSTOP) past its Lease, then resumed;
- reconciles that block in C (``spec.blockUntil``: ``time.sleep`` past the hard limit);
- a rolling upgrade: every process restarted, workers first, with a changed setting the
  reconciler writes into ``status.note`` (the new leader's start pass must reach every object);
- Redis restarted from a stale snapshot (saved, then written to for seconds, then restarted).
"""

from __future__ import annotations

import json
import signal
import ssl
import threading
import time
import urllib.error
import urllib.request

from reconcilers.devstack import controlplane, process, services

SERVICES = {"postgres": "PostgreSQL", "redis": "Redis", "api-server": "api-server"}
LEASE_SECONDS = 4  # the SoakItem reconciler's run deadline


def _during(soak, seconds: float) -> None:
    """The fault's window, with objects changed at its start: the operator has work to do
    while the fault is in place (else a short window can pass with nothing to hit)."""
    until = time.monotonic() + seconds
    soak.change_objects()
    time.sleep(max(0.0, until - time.monotonic()))


def proxy_fault(soak, proxy: str, fault: str) -> None:
    soak.toxiproxy.add(proxy, fault)
    try:
        _during(soak, soak.window())
    finally:
        soak.toxiproxy.clear(proxy)
    soak.count(f"{SERVICES[proxy]} through the proxy: {fault}")


def _apply_for_a_window(soak, doc: dict, kind: str, meanwhile=None) -> None:
    path = soak.work / f"{doc['metadata']['name']}.json"
    path.write_text(json.dumps(doc))
    soak.kubectl("apply", "-f", str(path))
    try:
        time.sleep(2)  # the api-server takes about a second to act on it
        window = soak.window()
        if meanwhile is not None:
            work = threading.Thread(target=_during, args=(soak, window), daemon=True)
            work.start()
            meanwhile(window)
            work.join()
        else:
            _during(soak, window)
    finally:
        soak.kubectl("delete", "-f", str(path), "--wait=false", check=False)
    soak.count(kind)


def _compete_for_seats(soak, seconds: float, threads: int = 6) -> None:
    """Requests as the operator's ServiceAccount, straight to the api-server, so its few
    seats are mostly taken and the operator's own requests meet 429s, not luck."""
    config = json.loads((soak.work / "operator.kubeconfig").read_text())
    token = config["users"][0]["user"]["token"]
    ctx = ssl.create_default_context(cafile=str(soak.cfg.pki_dir / "ca.crt"))
    until = time.monotonic() + seconds

    def loop() -> None:
        while time.monotonic() < until:
            req = urllib.request.Request(
                f"https://127.0.0.1:{soak.cfg.apiserver_port}/api/v1/namespaces/{soak.ns[0]}"
                "/configmaps", headers={"Authorization": f"Bearer {token}"})
            try:
                urllib.request.urlopen(req, context=ctx, timeout=5).read()
            except (urllib.error.URLError, OSError):
                time.sleep(0.01)

    workers = [threading.Thread(target=loop, daemon=True) for _ in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(seconds + 10)


def api_throttled(soak) -> None:
    name = f"soak-{soak.run_id}-throttled"
    _apply_for_a_window(soak, {"apiVersion": "v1", "kind": "List", "metadata": {"name": name},
                               "items": [
        {"apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "PriorityLevelConfiguration",
         "metadata": {"name": name},
         "spec": {"type": "Limited", "limited": {
             "nominalConcurrencyShares": 0, "lendablePercent": 0, "borrowingLimitPercent": 0,
             "limitResponse": {"type": "Reject"}}}},
        {"apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema",
         "metadata": {"name": name},
         "spec": {"priorityLevelConfiguration": {"name": name}, "matchingPrecedence": 10,
                  "distinguisherMethod": {"type": "ByUser"},
                  "rules": [{"subjects": [soak.identity_subject()],
                             "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"],
                                                "resources": ["*"], "namespaces": ["*"],
                                                "clusterScope": True}],
                             "nonResourceRules": [{"verbs": ["*"],
                                                   "nonResourceURLs": ["*"]}]}]}}]},
        "api-server answering 429 (APF, no seats)",
        meanwhile=lambda seconds: _compete_for_seats(soak, seconds))


def api_failing(soak) -> None:
    name = f"soak-{soak.run_id}-failing"
    _apply_for_a_window(soak, {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration", "metadata": {"name": name},
        "webhooks": [{
            "name": "fail.soak.operator.local",
            "clientConfig": {"url": "https://127.0.0.1:9/unreachable"},  # discard: closed
            "rules": [{"operations": ["CREATE", "UPDATE", "DELETE"],
                       "apiGroups": ["", "soak.operator.local"], "apiVersions": ["v1"],
                       "resources": ["configmaps", "soakitems", "soakitems/status"],
                       "scope": "Namespaced"}],
            "failurePolicy": "Fail", "sideEffects": "None", "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 2,
            "namespaceSelector": {"matchExpressions": [{
                "key": "kubernetes.io/metadata.name", "operator": "In", "values": soak.ns}]},
            "matchConditions": [{"name": "the-soak-operator", "expression":
                                 f"request.userInfo.username == '{soak.username}'"}]}]},
        "api-server answering 500 (admission webhook unreachable)")


def pause_leader(soak) -> None:
    """SIGSTOP the watcher holding the Lease for longer than the Lease, then SIGCONT. Right
    after a watcher was killed there may be no leader yet: wait for one, a while."""
    leaders = []
    for _ in range(20):
        out = soak.kubectl("-n", "default", "get", "lease", f"soak-{soak.run_id}", "-o",
                           "json", check=False)
        holder = ""
        if out.returncode == 0:
            holder = (json.loads(out.stdout).get("spec") or {}).get("holderIdentity") or ""
        pid = holder.split(":")[1] if holder.count(":") >= 1 else ""
        leaders = [w for w in soak.watchers if str(w.popen.pid) == pid]
        if leaders:
            break
        time.sleep(1)
    if not leaders:
        soak.count("leading watcher paused: no leader found to pause")
        return
    leaders[0].signal(signal.SIGSTOP)
    time.sleep(soak.leader_lease + 5)
    leaders[0].signal(signal.SIGCONT)
    soak.count("leading watcher paused past its lease (SIGSTOP)")


def block_in_c(soak) -> None:
    """A few objects whose runs block in ``time.sleep`` past the hard limit for a while."""
    until = time.time() + soak.window() + 12
    for _ in range(3):
        ns = soak.rng.choice(soak.ns)
        name = soak.rng.choice(soak.names[ns])
        soak.kubectl("-n", ns, "patch", f"soakitems.soak.operator.local", name, "--type",
                     "merge", "-p", json.dumps({"spec": {"blockUntil": until}}), check=False)
    soak.count("reconciles blocked in C past the hard limit")


def rolling_upgrade(soak) -> None:
    """Every process restarted one by one with a changed setting: workers first, so the new
    leader's start pass runs on new code."""
    soak.upgrades += 1
    soak.note = f"upgrade-{soak.upgrades}"
    for p in [*soak.workers, soak.beat, *soak.watchers]:
        p.stop()
        p.start(soak.env(), soak.work / "logs")
        time.sleep(1)
    soak.count("rolling upgrade (changed setting, every process restarted)")


def redis_stale_snapshot(soak) -> None:
    """Redis saved, written to for seconds, then restarted from that snapshot: the queue and
    cache go back in time (messages sent since are lost; some already run come back)."""
    import redis

    direct = redis.Redis(port=soak.cfg.redis_port, socket_timeout=30)
    direct.save()
    time.sleep(soak.rng.uniform(2, 6))
    services.stop_redis(soak.cfg)
    services.start_redis(soak.cfg)  # an instance without persistence loads dump.rdb at start
    (soak.cfg.state_dir / "redis" / "dump.rdb").unlink(missing_ok=True)
    soak.count("Redis restarted from a stale snapshot")


def stop_worker_past_its_lease(soak) -> None:
    victim = soak.rng.choice(soak.workers)
    victim.signal(signal.SIGSTOP)
    time.sleep(LEASE_SECONDS * 2 + 3)
    victim.signal(signal.SIGCONT)
    soak.count("worker stopped past its lease (SIGSTOP)")


def restart_postgres(soak) -> None:
    """A fast shutdown (every client cut off at once), a pause, a start."""
    services.stop_postgres(soak.cfg)
    time.sleep(soak.rng.uniform(0.5, 3))
    services.start_postgres(soak.cfg)
    soak.count("PostgreSQL restarted")


def restart_redis(soak) -> None:
    services.stop_redis(soak.cfg)
    time.sleep(soak.rng.uniform(0.5, 2))
    services.start_redis(soak.cfg)  # empty: no persistence
    soak.count("Redis restarted (empty)")


def restart_apiserver(soak) -> None:
    """The api-server restarted behind an endpoint that routes to it only once ``/readyz``
    passes, as a load balancer or the in-cluster ``kubernetes`` Service does: until then the
    operator's connections are refused. (A new api-server serves before its RBAC caches are
    synced - ``readyz``'s ``informer-sync`` - and answers 403 meanwhile:
    docs/contributing/reliability.md.)"""
    soak.toxiproxy.enable("api-server", False)
    try:
        process.stop("kube-apiserver", soak.cfg.run_dir)
        time.sleep(soak.rng.uniform(0.5, 2))
        controlplane.start(soak.cfg)  # returns once /readyz passes
    finally:
        soak.toxiproxy.enable("api-server", True)
    soak.count("api-server restarted (every watch dropped)")
