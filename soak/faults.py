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

Each fault records what the soak *saw* it do (``Injected.effect``), from outside the
command that injected it: a killed process's exit status, a stopped process's state in
``/proc``, a probe through the proxy that was delayed, cut or never answered, the Lease taken
over by another watcher, a service's new process, the api-server's refusals of the
operator's writes in its audit log, runs the side channel shows blocking. A fault with no
effect seen is *silent*: it tested nothing, and the soak fails on it (``soak/check.py``).
"""

from __future__ import annotations

import json
import signal
import socket
import ssl
import struct
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from reconcilers.devstack import controlplane, process, services

SERVICES = {"postgres": "PostgreSQL", "redis": "Redis", "api-server": "api-server"}
LEASE_SECONDS = 4  # the SoakItem reconciler's run deadline
PROBE_BYTES = 3000  # past the data-limit toxic's 2,000 bytes
SLOW = 0.4  # seconds: a probe answered slower than this met the latency toxic (700 ms ± 300)


@dataclass
class Injected:
    """One fault as injected, and what was seen of it."""
    kind: str
    started: float  # unix time
    ended: float
    effect: str | None  # what the soak saw it do; None: nothing (a silent fault)
    # Where the checker looks for (more) effect once the run is over: the operator's writes
    # the audit log shows answered with one of ``codes`` in the window, or the side
    # channel's blocks of the objects ``keys`` (``<namespace>/<name>``) after ``started``.
    codes: tuple[int, int] | None = None
    keys: tuple[str, ...] = ()

    def add(self, seen: str | None) -> None:
        if seen:
            self.effect = f"{self.effect}; {seen}" if self.effect else seen


def _during(soak, seconds: float) -> None:
    """The fault's window, with objects changed at its start: the operator has work to do
    while the fault is in place (else a short window can pass with nothing to hit)."""
    until = time.monotonic() + seconds
    soak.change_objects()
    time.sleep(max(0.0, until - time.monotonic()))


# --- probes through the proxy ---------------------------------------------------------------


def _request(soak, proxy: str) -> bytes:
    """A request of ``PROBE_BYTES`` and more in the service's own protocol, and any answer
    proves it passed."""
    pad = b"x" * PROBE_BYTES
    if proxy == "redis":
        return b"*2\r\n$4\r\nECHO\r\n$%d\r\n%s\r\n" % (len(pad), pad)
    if proxy == "postgres":  # a StartupMessage (protocol 3.0) with a long application_name
        params = b"".join(k + b"\0" + v + b"\0" for k, v in (
            (b"user", soak.cfg.db_user.encode()), (b"database", b"operator_soak"),
            (b"application_name", pad))) + b"\0"
        return struct.pack("!ii", 8 + len(params), 196608) + params
    return b"GET /version HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: %s\r\n\r\n" % pad


def probe(soak, proxy: str, seconds: float) -> tuple[str, float]:
    """One request through the proxy as the operator's connections go: ``("answered" |
    "no answer" | "cut ...", seconds taken)``, waiting at most ``seconds``."""
    t0 = time.monotonic()
    deadline = t0 + seconds
    try:
        with socket.create_connection(("127.0.0.1", soak.toxiproxy.listen[proxy]),
                                      timeout=seconds) as raw:
            conn = raw
            if proxy == "api-server":
                tls = ssl.create_default_context(cafile=str(soak.cfg.pki_dir / "ca.crt"))
                conn = tls.wrap_socket(raw, server_hostname="127.0.0.1")
            conn.sendall(_request(soak, proxy))
            # Redis echoes it all; the others answer in their first bytes.
            want = PROBE_BYTES if proxy == "redis" else 1
            got = 0
            while got < want:
                conn.settimeout(max(0.01, deadline - time.monotonic()))
                chunk = conn.recv(65536)
                if not chunk:
                    return "cut (closed before the answer)", time.monotonic() - t0
                got += len(chunk)
        return "answered", time.monotonic() - t0
    except (socket.timeout, TimeoutError):
        return "no answer", time.monotonic() - t0
    except (OSError, ssl.SSLError) as exc:
        return f"cut ({exc.__class__.__name__})", time.monotonic() - t0


def probe_effect(fault: str, outcome: str, seconds: float) -> str | None:
    """What a probe shows of a toxic, or None when it shows nothing the toxic would do."""
    seen = f"a probe through the proxy: {outcome} after {seconds:.2f} s"
    if fault == "latency":
        return seen if outcome == "no answer" or (outcome == "answered" and seconds >= SLOW) \
            else None
    if fault == "black hole":
        return seen if outcome == "no answer" else None
    return seen if outcome.startswith("cut") else None  # reset, data limit


def proxy_fault(soak, proxy: str, fault: str) -> None:
    soak.toxiproxy.add(proxy, fault)
    started, window = time.time(), soak.window()
    try:
        work = threading.Thread(target=_during, args=(soak, window), daemon=True)
        work.start()
        time.sleep(0.2)  # toxics act on connections as data arrives: let it be in place
        effect = probe_effect(fault, *probe(soak, proxy, max(1.0, window - 0.5)))
        work.join()
    finally:
        soak.toxiproxy.clear(proxy)
    soak.record(Injected(f"{SERVICES[proxy]} through the proxy: {fault}", started, time.time(),
                         effect))


# --- the api-server's side ------------------------------------------------------------------


def _as_operator(soak, method: str, path: str, body: dict | None = None) -> int:
    """One request as the operator's ServiceAccount, straight to the api-server: its status
    (0: no answer)."""
    config = json.loads((soak.work / "operator.kubeconfig").read_text())
    token = config["users"][0]["user"]["token"]
    ctx = ssl.create_default_context(cafile=str(soak.cfg.pki_dir / "ca.crt"))
    req = urllib.request.Request(
        f"https://127.0.0.1:{soak.cfg.apiserver_port}{path}", method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=5) as resp:
            resp.read()
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return 0


def _apply_for_a_window(soak, doc: dict, kind: str, meanwhile=None,
                        codes: tuple[int, int] | None = None) -> Injected:
    """Cluster objects applied for a window, then deleted; the fault's record, whose effect
    the caller and the checker fill in."""
    path = soak.work / f"{doc['metadata']['name']}.json"
    path.write_text(json.dumps(doc))
    soak.kubectl("apply", "-f", str(path))
    injected = Injected(kind, time.time(), 0.0, None, codes)
    try:
        time.sleep(2)  # the api-server takes about a second to act on it
        window = soak.window()
        if meanwhile is not None:
            work = threading.Thread(target=_during, args=(soak, window), daemon=True)
            work.start()
            injected.add(meanwhile(window))
            work.join()
        else:
            _during(soak, window)
    finally:
        soak.kubectl("delete", "-f", str(path), "--wait=false", check=False)
    injected.ended = time.time()
    soak.record(injected)
    return injected


def _compete_for_seats(soak, seconds: float, threads: int = 6) -> str | None:
    """Requests as the operator's ServiceAccount, straight to the api-server, so its few
    seats are mostly taken and the operator's own requests meet 429s, not luck. Returns how
    many of them were answered 429."""
    until = time.monotonic() + seconds
    refused = [0] * threads

    def loop(i: int) -> None:
        while time.monotonic() < until:
            status = _as_operator(soak, "GET", f"/api/v1/namespaces/{soak.ns[0]}/configmaps")
            refused[i] += status == 429
            if status != 200:
                time.sleep(0.01)

    workers = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(seconds + 10)
    n = sum(refused)
    return f"{n} of the soak's requests as the operator's account answered 429" if n else None


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
        meanwhile=lambda seconds: _compete_for_seats(soak, seconds), codes=(429, 429))


def _refused_by_the_webhook(soak, _seconds: float) -> str | None:
    """A dry-run create as the operator's account, which the webhook must refuse with 500
    (a dry run creates nothing, and the audit log marks it as one)."""
    status = _as_operator(soak, "POST", f"/api/v1/namespaces/{soak.ns[0]}/configmaps"
                          "?dryRun=All", {"apiVersion": "v1", "kind": "ConfigMap",
                                          "metadata": {"name": "fault-probe"}})
    return f"a dry-run write as the operator's account answered {status}" \
        if status >= 500 else None


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
        "api-server answering 500 (admission webhook unreachable)",
        meanwhile=lambda seconds: _refused_by_the_webhook(soak, seconds), codes=(500, 599))


def _lease_holder(soak) -> str:
    out = soak.kubectl("-n", "default", "get", "lease", f"soak-{soak.run_id}", "-o", "json",
                       check=False)
    if out.returncode != 0:
        return ""
    return (json.loads(out.stdout).get("spec") or {}).get("holderIdentity") or ""


def pause_leader(soak) -> None:
    """SIGSTOP the watcher holding the Lease for longer than the Lease, then SIGCONT; its
    effect is another watcher taking the Lease meanwhile. Right after a watcher was killed
    there may be no leader yet: wait for one, a while."""
    started, leaders, holder = time.time(), [], ""
    for _ in range(20):
        holder = _lease_holder(soak)
        pid = holder.split(":")[1] if holder.count(":") >= 1 else ""
        leaders = [w for w in soak.watchers if str(w.popen.pid) == pid]
        if leaders:
            break
        time.sleep(1)
    kind = "leading watcher paused past its lease (SIGSTOP)"
    if not leaders:
        soak.record(Injected(kind, started, time.time(), None))  # silent: no one to pause
        return
    leaders[0].signal(signal.SIGSTOP)
    until, taken_by = time.monotonic() + soak.leader_lease + 5, None
    while time.monotonic() < until:
        now = _lease_holder(soak)
        if now and now != holder and taken_by is None:
            taken_by = now
        time.sleep(0.5)
    leaders[0].signal(signal.SIGCONT)
    soak.record(Injected(kind, started, time.time(),
                         f"the Lease taken over by {taken_by}" if taken_by else None))


def block_in_c(soak) -> None:
    """A few objects whose runs block in ``time.sleep`` past the hard limit for a while; the
    side channel's blocks of their runs are its effect."""
    started = time.time()
    until = started + soak.window() + 12
    keys = []
    for _ in range(3):
        ns = soak.rng.choice(soak.ns)
        name = soak.rng.choice(soak.names[ns])
        out = soak.kubectl("-n", ns, "patch", "soakitems.soak.operator.local", name, "--type",
                           "merge", "-p", json.dumps({"spec": {"blockUntil": until}}),
                           check=False)
        if out.returncode == 0:
            keys.append(f"{ns}/{name}")
    soak.record(Injected("reconciles blocked in C past the hard limit", started, time.time(),
                         None, keys=tuple(keys)))


def rolling_upgrade(soak) -> None:
    """Every process restarted one by one with a changed setting: workers first, so the new
    leader's start pass runs on new code."""
    started = time.time()
    soak.upgrades += 1
    soak.note = f"upgrade-{soak.upgrades}"
    replaced = 0
    for p in [*soak.workers, soak.beat, *soak.watchers]:
        old = p.popen
        p.stop()
        p.start(soak.env(), soak.work / "logs")
        replaced += old.poll() is not None and p.popen.pid != old.pid
        time.sleep(1)
    soak.record(Injected("rolling upgrade (changed setting, every process restarted)", started,
                         time.time(), f"{replaced} processes ended and started again"
                         if replaced == len(soak.procs) else None))


def _restarted(soak, name: str, restart) -> str | None:
    """Runs ``restart``; what it did, from the stack's pid file of ``name``: another process
    serving, the old one gone."""
    pid_file = soak.cfg.run_dir / f"{name}.pid"
    before = process.read_pid(pid_file)
    restart()
    after = process.read_pid(pid_file)
    if before and after and after != before and not process.pid_alive(before):
        return f"{name}: pid {before} ended, pid {after} serving"
    return None


def redis_stale_snapshot(soak) -> None:
    """Redis saved, written to for seconds, then restarted from that snapshot: the queue and
    cache go back in time (messages sent since are lost; some already run come back). Its
    effect: a key written after the save is gone after the restart."""
    import redis

    started = time.time()
    direct = redis.Redis(port=soak.cfg.redis_port, socket_timeout=30)
    marker = f"soak:{soak.run_id}:after-the-snapshot"

    def restart() -> None:
        direct.save()
        direct.set(marker, "1")
        time.sleep(soak.rng.uniform(2, 6))
        services.stop_redis(soak.cfg)
        services.start_redis(soak.cfg)  # an instance without persistence loads dump.rdb

    injected = Injected("Redis restarted from a stale snapshot", started, 0.0,
                        _restarted(soak, "redis", restart))
    (soak.cfg.state_dir / "redis" / "dump.rdb").unlink(missing_ok=True)
    after = redis.Redis(port=soak.cfg.redis_port, socket_timeout=30)  # a new connection
    if injected.effect and after.exists(marker):
        injected.effect = None  # restarted, but not back in time
        after.delete(marker)
    injected.ended = time.time()
    soak.record(injected)


def _stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped (``T`` in ``/proc/<pid>/stat``)."""
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] == "T"


def stop_worker_past_its_lease(soak) -> None:
    started = time.time()
    victim = soak.rng.choice(soak.workers)
    victim.signal(signal.SIGSTOP)
    time.sleep(0.5)
    stopped = _stopped(victim.popen.pid)
    time.sleep(LEASE_SECONDS * 2 + 2.5)
    victim.signal(signal.SIGCONT)
    soak.record(Injected("worker stopped past its lease (SIGSTOP)", started, time.time(),
                         f"{victim.name} (pid {victim.popen.pid}) stopped for "
                         f"{LEASE_SECONDS * 2 + 3} s" if stopped else None))


def restart_postgres(soak) -> None:
    """A fast shutdown (every client cut off at once), a pause, a start."""
    started = time.time()

    def restart() -> None:
        services.stop_postgres(soak.cfg)
        time.sleep(soak.rng.uniform(0.5, 3))
        services.start_postgres(soak.cfg)

    effect = _restarted(soak, "postgres", restart)
    soak.record(Injected("PostgreSQL restarted", started, time.time(), effect))


def restart_redis(soak) -> None:
    started = time.time()

    def restart() -> None:
        services.stop_redis(soak.cfg)
        time.sleep(soak.rng.uniform(0.5, 2))
        services.start_redis(soak.cfg)  # empty: no persistence

    effect = _restarted(soak, "redis", restart)
    soak.record(Injected("Redis restarted (empty)", started, time.time(), effect))


def restart_apiserver(soak) -> None:
    """The api-server restarted behind an endpoint that routes to it only once ``/readyz``
    passes, as a load balancer or the in-cluster ``kubernetes`` Service does: until then the
    operator's connections are refused. (A new api-server serves before its RBAC caches are
    synced - ``readyz``'s ``informer-sync`` - and answers 403 meanwhile:
    docs/contributing/reliability.md.)"""
    started = time.time()

    def restart() -> None:
        soak.toxiproxy.enable("api-server", False)
        try:
            process.stop("kube-apiserver", soak.cfg.run_dir)
            time.sleep(soak.rng.uniform(0.5, 2))
            controlplane.start(soak.cfg)  # returns once /readyz passes
        finally:
            soak.toxiproxy.enable("api-server", True)

    effect = _restarted(soak, "kube-apiserver", restart)
    soak.record(Injected("api-server restarted (every watch dropped)", started, time.time(),
                         effect))


def observe(injected: list[Injected], found, trace) -> None:
    """Fill in the effects only the run's records show: the operator's writes the api-server
    refused in a fault's window (its audit log, ``found``), the side channel's blocks."""
    from soak import audit

    blocks: list[tuple[str, float]] = []
    for line in trace.read_text().splitlines() if trace.exists() else []:
        parts = line.split()
        if len(parts) == 4 and parts[0] == "block":
            try:
                blocks.append((parts[1], float(parts[3])))
            except ValueError:
                continue
    for fault in injected:
        if fault.codes is not None and found:
            lo, hi = fault.codes
            n = audit.refused_between(found, fault.started, fault.ended + 2,
                                      range(lo, hi + 1))
            fault.add(f"{n} of the operator's writes answered {lo if lo == hi else f'{lo}-{hi}'}"
                      if n else None)
        if fault.keys:
            n = sum(key.partition(":")[2] in fault.keys and at >= fault.started
                    for key, at in blocks)
            fault.add(f"{n} runs of {len(fault.keys)} objects blocked in C" if n else None)


def silent(injected: list[Injected]) -> list[str]:
    return [f"{f.kind} at {time.strftime('%H:%M:%S', time.gmtime(f.started))}"
            for f in injected if not f.effect]
