"""Scenario 5, relist: with N objects converged, force the watch to restart and measure the
time until the implementation handles a new change again, and how many reconciles it causes.

Two ways, both applied to each implementation:

- ``connections-dropped``: every TCP connection the implementation holds to the api-server is
  killed (``ss -K``, by its local ports); clients reconnect and resume their watches.
- ``restart``: whatever holds the watches is restarted (this project: the watcher process only,
  workers keep running; kopf and controller-runtime: their one process), so it lists all N
  objects again.
- ``standby``: where an implementation has a standby (this project: a second watcher), the
  leader stops cleanly with the standby running, as in a rolling update of two replicas; the
  standby takes over.

At the disruption the canary object gets a new generation; "resume" is the time from the
disruption to the canary converged (seen by the observer). Reconciles are counted until none
has started for 3 s; the canary's own run is not counted.
"""

from __future__ import annotations

import math
import subprocess
import time

from .. import probes, workload
from ..impls.base import Impl
from ..impls.ceiling import apiload
from .common import Harness, Meter, measured_run

VALUE = 3


def drop_connections(impl: Impl, api_port: int) -> int:
    ports = probes.established_ports(probes.tree(impl.roots()), api_port)
    for port in ports:
        subprocess.run(["ss", "-K", "-t", "src", f"127.0.0.1:{port}",
                        "dst", f"127.0.0.1:{api_port}"], capture_output=True)
    return len(ports)


def start_standby(impl: Impl, trace, timeout: float = 60) -> None:
    """Start the standby and wait until it stands by: started up (it says so), then two
    seconds for its first round, its Lease watch and its sender (connected once its first
    second without the Lease has passed)."""
    impl.start_standby(trace)
    standby = next(p for p in impl.procs if p.name == "standby")
    deadline = time.monotonic() + timeout
    while "watching " not in standby.log_tail():
        if not standby.alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the standby did not start: {standby.log_tail()}")
        time.sleep(0.1)
    time.sleep(2.0)


def run(h: Harness, impl: Impl, n: int, rep: int) -> dict:
    namespaces = max(1, math.ceil(n / 1000))
    results = {}
    with measured_run(h, impl, "rl", namespaces) as r:
        apiload(h.cfg, "create", n, r.ns.names, h.loader_concurrency, VALUE)
        names = [f"{r.ns.of(i)}/item-{i}" for i in range(n)]
        if not r.observer.wait(lambda o: all(o.converged_at(x, 1) for x in names),
                               max(120.0, n / 5)):
            raise TimeoutError(f"{impl.name}: {n} objects did not converge before the relist")
        r.wait_quiet(0, quiet=2.0, timeout=120)
        modes = ["connections-dropped", "restart"] + (["standby"] if impl.supports_standby
                                                       else [])
        for mode in modes:
            if mode == "standby":
                start_standby(impl, r.trace)
            meter = Meter(h, impl, sample_rss=False).start()
            t0 = time.time()
            dropped = None
            if mode == "restart":
                impl.restart_watch(r.trace)
            elif mode == "standby":
                impl.stop_leader()
            else:
                dropped = drop_connections(impl, h.cfg.stack.apiserver_port)
            _, generation = r.bump_canary()
            converged = r.wait_converged(r.canary, generation, 300)
            r.wait_quiet(t0, quiet=3.0, timeout=300)
            cost = meter.stop()
            runs = r.trace_lines(since=t0)
            results[mode] = {
                "connections_dropped": dropped,
                "resume_seconds": round(converged - t0, 3) if converged else None,
                "reconciles": len([x for x in runs if x[1] != r.canary]),
                "operator_cpu_seconds": cost["cpu_seconds"]["operator"],
                "api_requests": cost["api_requests"],
            }
        expected = {(r.ns.of(i), f"item-{i}"): VALUE for i in range(n)}
        expected[(r.ns.names[0], workload.CANARY)] = r.canary_value
        check = workload.check(h.kube, r.ns.names, expected)
    ok = check.ok and all(m["resume_seconds"] is not None for m in results.values())
    return {"impl": impl.name, "n": n, "rep": rep, "ok": ok, "check": check.as_dict(),
            "modes": results}
