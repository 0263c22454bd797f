"""Scenario 1, converge: create N objects as fast as the loader can; time from the first create
to the last object converged (seen by the observer's own watch); objects/s.

The loader is ``apiload create`` (Go, 16 goroutines), the same for every implementation, so
loading costs the operator as little CPU as possible. Objects are spread over
``ceil(N / 1000)`` namespaces. The same run yields the cost figures (CPU per converged object
per process group, api-server writes per object, RSS). The ceiling implementations run
``apiload ceiling -mode converge`` instead: create + status write per object, no operator.

After converging, an operator's run goes on (``steady``): updates at a steady rate (100/s)
round-robin over the N converged objects for the latency window - the steady state of an
install that holds N objects, measured as the latency scenario measures it (stamp -> reconcile
start, stamp -> converged, CPU per update). Its storage is recorded before and after
(``Impl.storage``: this project's PostgreSQL tables and Redis memory), so the growth with N
can be fitted over the sizes.
"""

from __future__ import annotations

import math
import time

from .. import workload
from ..impls.base import Impl
from ..impls.ceiling import apiload
from .common import Harness, Meter, measured_run
from .latency import window_of

VALUE = 7


def run(h: Harness, impl: Impl, n: int, rep: int,
        steady: tuple[int, float] | None = None) -> dict:
    """``steady``: ``(rate, window)`` of the updates among the N objects once converged."""
    if getattr(impl, "is_ceiling", False):
        return _ceiling(h, impl, n, rep)
    namespaces = max(1, math.ceil(n / 1000))
    with measured_run(h, impl, "cv", namespaces) as r:
        time.sleep(1.0)  # let start-up work (relist of the canary, pool warm-up) settle
        storage_before = impl.storage()
        meter = Meter(h, impl).start()
        loader = apiload(h.cfg, "create", n, r.ns.names, h.loader_concurrency, VALUE) if n else {}
        names = [f"{r.ns.of(i)}/item-{i}" for i in range(n)]
        timeout = max(120.0, n / 5)
        done = r.observer.wait(lambda o: all(o.converged_at(x, 1) for x in names), timeout)
        if not done:
            impl.check_alive()
        last = max((r.observer.converged_at(x, 1) or 0 for x in names), default=0.0)
        time.sleep(1.0)  # the tail of work after the last status write (history, acks)
        cost = meter.stop()
        storage = _storage(storage_before, impl.storage())
        reconciles = len(r.trace_lines(since=loader.get("first_create", 0) or 0))
        expected = {(r.ns.of(i), f"item-{i}"): VALUE for i in range(n)}
        expected[(r.ns.names[0], workload.CANARY)] = r.canary_value
        steady_stats = None
        if steady and n and done:
            rate, window = steady
            steady_stats = window_of(h, r, list(expected), rate, window, 1_000_000)
            expected.update(steady_stats.pop("_final"))
        check = workload.check(h.kube, r.ns.names, expected)
    out = {"impl": impl.name, "n": n, "rep": rep, "namespaces": namespaces,
           "ok": check.ok and done and (steady_stats is None or steady_stats["complete"]),
           "check": check.as_dict(), "loader": loader,
           "reconciles": reconciles, **cost}
    if storage:
        out["storage"] = storage
    if steady_stats is not None:
        out["steady"] = steady_stats
    impl_writes = cost["api_writes"] - loader.get("creates", 0)
    out["impl_writes"] = impl_writes
    if n:
        out["writes_per_object"] = round(impl_writes / n, 3)
        out["cpu_ms_per_object"] = {g: round(s * 1000 / n, 3) for g, s in cost["cpu_seconds"].items()}
    if out["ok"] and n:
        out["converge_seconds"] = round(last - loader["first_create"], 3)
        out["objects_per_second"] = round(n / out["converge_seconds"], 1)
        out["loader_seconds"] = round(loader["last_create"] - loader["first_create"], 3)
    return out


def _ceiling(h: Harness, impl: Impl, n: int, rep: int) -> dict:
    namespaces = max(1, math.ceil(n / 1000))
    ns = workload.Namespaces.create(h.kube, "cl", namespaces, owner=h.owner)
    try:
        meter = Meter(h, impl, sample_rss=False).start()
        res = apiload(h.cfg, "ceiling", n, ns.names, impl.concurrency, VALUE, mode="converge")
        cost = meter.stop()
        # apiload wrote observedGeneration 1 = the generation of a new object, so the same
        # check applies.
        check = workload.check(h.kube, ns.names, {(ns.of(i), f"item-{i}"): VALUE
                                                  for i in range(n)})
        status = apiload(h.cfg, "ceiling", n, ns.names, impl.concurrency, VALUE,
                         prefix="st", mode="status") if n else {}
    finally:
        ns.delete(h.kube)
    out = {"impl": impl.name, "n": n, "rep": rep, "namespaces": namespaces, "ok": check.ok,
           "check": check.as_dict(), "loader": res, "status_only": status, **cost,
           "impl_writes": res.get("status_writes", 0)}
    if n:
        out["writes_per_object"] = round(out["impl_writes"] / n, 3)
        out["cpu_ms_per_object"] = {g: round(s * 1000 / n, 3) for g, s in cost["cpu_seconds"].items()}
    if check.ok and n:
        out["converge_seconds"] = round(res["end"] - res["first_create"], 3)
        out["objects_per_second"] = round(n / out["converge_seconds"], 1)
        out["status_writes_per_second"] = round(n / (status["end"] - status["start"]), 1)
    return out


def _storage(before: dict, after: dict) -> dict:
    """What the implementation stores after converging, and Redis's memory before it."""
    if not after:
        return {}
    out = dict(after)
    if "redis_used_memory" in before:
        out["redis_used_memory_before"] = before["redis_used_memory"]
    return out
