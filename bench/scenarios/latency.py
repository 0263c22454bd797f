"""Scenario 2, latency: steady updates at a fixed rate for a fixed time; per update, the time
from the client's stamp to the reconcile starting (from the trace every implementation writes)
and to the object being converged (from the observer's watch); p50/p99.

A pool of 100 converged objects is updated round-robin, each update a merge patch of
spec.value (a new generation) plus the stamp annotation, sent on schedule by a small thread
pool so a slow response never delays the next send. CPU per update of the operator's processes
and of its whole footprint is measured too.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from .. import workload
from ..impls.base import Impl
from ..impls.ceiling import apiload
from ..probes import FOOTPRINT
from .common import Harness, Meter, measured_run

POOL = 100


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    k = (len(s) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def ms(x: float | None) -> float | None:
    return None if x is None else round(x * 1000, 2)


def run(h: Harness, impl: Impl, rates: list[int], window: float, rep: int) -> dict:
    with measured_run(h, impl, "lt") as r:
        ns = r.ns.names[0]
        apiload(h.cfg, "create", POOL, [ns], 8, 0, prefix="pool")
        pool = [f"pool-{i}" for i in range(POOL)]
        if not r.observer.wait(lambda o: all(o.converged_at(f"{ns}/{x}", 1) for x in pool), 120):
            raise TimeoutError(f"{impl.name}: latency pool did not converge")
        time.sleep(1.0)
        per_rate = {}
        value = 0
        for rate in rates:
            value += 1_000_000
            per_rate[str(rate)] = window_of(h, r, [(ns, x) for x in pool], rate, window, value)
            r.wait_quiet(time.time(), quiet=1.0, timeout=30)
        expected = {(ns, workload.CANARY): r.canary_value}
        for stats in per_rate.values():
            expected.update(stats.pop("_final"))
        for name in pool:
            expected.setdefault((ns, name), 0)
        check = workload.check(h.kube, [ns], expected)
    ok = check.ok and all(s["complete"] for s in per_rate.values())
    return {"impl": impl.name, "rep": rep, "window_seconds": window, "ok": ok,
            "check": check.as_dict(), "rates": per_rate}


def window_of(h: Harness, r, pool: list[tuple[str, str]], rate: int, window: float,
              base_value: int) -> dict:
    """``rate`` updates/s for ``window`` seconds, round-robin over ``pool`` (``(namespace,
    name)`` of converged objects). ``_final`` maps each updated object to its last value."""
    count = int(rate * window)
    sent: list[tuple[tuple[str, str], float, int, int]] = []  # object, stamp, generation, value
    lock = threading.Lock()

    def send(k: int) -> None:
        key = pool[k % len(pool)]
        stamp, generation = workload.update(h.kube, key[0], key[1], base_value + k)
        with lock:
            sent.append((key, stamp, generation, base_value + k))

    meter = Meter(h, r.impl, sample_rss=False).start()
    t0 = time.time() + 0.1
    with ThreadPoolExecutor(max_workers=8) as pool_ex:
        for k in range(count):
            delay = t0 + k / rate - time.time()
            if delay > 0:
                time.sleep(delay)
            pool_ex.submit(send, k)
    final: dict[tuple[str, str], tuple[int, int]] = {}
    for key, _stamp, generation, value in sent:
        if generation > final.get(key, (0, 0))[0]:
            final[key] = (generation, value)
    complete = r.observer.wait(
        lambda o: all(o.converged_at(f"{ns}/{n}", g) for (ns, n), (g, _) in final.items()), 60)
    cost = meter.stop()
    time.sleep(0.3)  # trace writers may buffer up to 100 ms (the Go peer flushes every 100 ms)

    starts = {}
    for t, obj, gen in r.trace_lines(since=t0 - 0.5):
        starts.setdefault(obj, []).append((t, gen))
    to_start, to_converged = [], []
    for (ns, name), stamp, generation, _ in sent:
        obj = f"{ns}/{name}"
        first = next((t for t, g in starts.get(obj, ()) if g >= generation and t >= stamp - 0.001),
                     None)
        if first is not None:
            to_start.append(first - stamp)
        conv = r.observer.converged_at(obj, generation)
        if conv is not None:
            to_converged.append(conv - stamp)
    achieved = len(sent) / max(1e-9, max(s for _, s, _, _ in sent) - min(s for _, s, _, _ in sent)) \
        if len(sent) > 1 else 0.0
    reconciles = sum(len(v) for v in starts.values())
    return {
        "rate": rate, "updates": len(sent), "achieved_rate": round(achieved, 1),
        "complete": complete, "reconciles": reconciles,
        "start_p50_ms": ms(percentile(to_start, 0.5)), "start_p99_ms": ms(percentile(to_start, 0.99)),
        "start_max_ms": ms(max(to_start, default=None)), "start_samples": len(to_start),
        "converged_p50_ms": ms(percentile(to_converged, 0.5)),
        "converged_p99_ms": ms(percentile(to_converged, 0.99)),
        "converged_samples": len(to_converged),
        "operator_cpu_ms_per_update": round(cost["cpu_seconds"]["operator"] * 1000 / max(1, len(sent)), 3),
        "footprint_cpu_ms_per_update": round(cost["cpu_seconds"][FOOTPRINT] * 1000
                                             / max(1, len(sent)), 3),
        "cost": cost,
        "_final": {key: v for key, (_, v) in final.items()},
    }
