"""Scenario 4, cost: memory of the operator's processes against the number of cached objects.

CPU per converged object per process group and api-server writes per object come from every
converge run (``converge.run`` measures them). This scenario adds the memory curve: steady RSS
(and PSS) of the operator's processes and of its whole footprint (this project: with all of
PostgreSQL and Redis) after converging N = 0, the converge size and, in the large run, 10,000
objects, and the slope in bytes per cached object. For this project the shared cache lives in
Redis, so the size of its cache hashes there is reported beside it.
"""

from __future__ import annotations

import time

from ..impls.base import Impl
from ..probes import FOOTPRINT, memory_of
from . import converge
from .common import Harness, Meter, measured_run


def point(h: Harness, impl: Impl, n: int, rep: int, converged: dict | None = None) -> dict:
    """One (N, memory) point; reuses a converge run of the same size when given one."""
    if n == 0:
        with measured_run(h, impl, "co") as r:
            meter = Meter(h, impl).start()
            time.sleep(3.0)
            cost = meter.stop()
            mem = memory_of(impl.roots())
            ok = r.observer.converged_at(r.canary, 1) is not None
        return {"impl": impl.name, "n": 0, "rep": rep, "ok": ok, "rss_kb": mem["rss_kb"],
                "pss_kb": mem["pss_kb"], "processes": mem["processes"],
                "rss_peak_kb": cost.get("operator_rss_peak_kb"),
                **_footprint(cost),
                "idle_cpu_seconds_3s": cost["cpu_seconds"]["operator"],
                "footprint_idle_cpu_seconds_3s": cost["cpu_seconds"][FOOTPRINT],
                "redis_delta_bytes": 0}
    res = converged or converge.run(h, impl, n, rep)
    mem = res.get("operator_memory_after", {})
    return {"impl": impl.name, "n": n, "rep": rep, "ok": res["ok"], "rss_kb": mem.get("rss_kb"),
            "pss_kb": mem.get("pss_kb"), "processes": mem.get("processes"),
            "rss_peak_kb": res.get("operator_rss_peak_kb"), **_footprint(res),
            "redis_delta_bytes": res.get("redis_cache_delta_bytes", 0),
            "cpu_ms_per_object": res.get("cpu_ms_per_object"),
            "writes_per_object": res.get("writes_per_object")}


def _footprint(measured: dict) -> dict:
    """The whole footprint's memory from a ``Meter`` result (or a converge run)."""
    mem = measured.get("footprint_memory_after", {})
    return {"footprint_rss_kb": mem.get("rss_kb"), "footprint_pss_kb": mem.get("pss_kb"),
            "footprint_processes": mem.get("processes"),
            "footprint_rss_peak_kb": measured.get("footprint_rss_peak_kb")}


def slope(points: list[dict], field: str = "rss_kb") -> float | None:
    """Least-squares bytes per object of ``field`` (kB) over the points' N."""
    pts = [(p["n"], p[field] * 1024) for p in points if p.get(field) is not None and p["ok"]]
    if len({n for n, _ in pts}) < 2:
        return None
    mean_n = sum(n for n, _ in pts) / len(pts)
    mean_y = sum(y for _, y in pts) / len(pts)
    den = sum((n - mean_n) ** 2 for n, _ in pts)
    return round(sum((n - mean_n) * (y - mean_y) for n, y in pts) / den, 1)
