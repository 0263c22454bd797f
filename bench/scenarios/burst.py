"""Scenario 3, burst dedup: K updates to one object within about a second while each reconcile
takes 50 ms (the implementation is started with that artificial duration). How many
reconciles ran, and did the last one see the final generation?

A level-based queue runs a changed key again after the current run (dirty re-run), so the
floor for a ~1 s burst of 50 ms runs is one run per ~50-70 ms unless the implementation
waits to batch; the figure shows how much each one merges.
"""

from __future__ import annotations

import time

from .. import workload
from ..impls.base import Impl
from .common import Harness, measured_run

SLEEP_MS = 50


def run(h: Harness, impl: Impl, k: int, spread: float, rep: int) -> dict:
    with measured_run(h, impl, "bu", sleep_ms=SLEEP_MS) as r:
        ns = r.ns.names[0]
        workload.create(h.kube, ns, "burst", 0)
        obj = f"{ns}/burst"
        if r.wait_converged(obj, 1, 60) is None:
            raise TimeoutError(f"{impl.name}: burst object did not converge")
        time.sleep(0.5)
        t0 = time.time()
        generation = 1
        for i in range(k):
            delay = t0 + i * spread / k - time.time()
            if delay > 0:
                time.sleep(delay)
            _, generation = workload.update(h.kube, ns, "burst", i + 1)
        t_last = time.time()
        converged = r.wait_converged(obj, generation, 60)
        r.wait_quiet(t0, quiet=1.5, timeout=60)
        runs = r.trace_lines(since=t0, obj=obj)
        check = workload.check(h.kube, [ns], {(ns, "burst"): k,
                                              (ns, workload.CANARY): r.canary_value})
    return {
        "impl": impl.name, "rep": rep, "k": k, "reconcile_ms": SLEEP_MS,
        "burst_seconds": round(t_last - t0, 3), "final_generation": generation,
        "ok": check.ok and converged is not None, "check": check.as_dict(),
        "reconciles": len(runs),
        "generations_seen": [g for _, _, g in runs],
        "last_saw_final": bool(runs) and runs[-1][2] == generation,
        "converged_after_last_update_ms": (round((converged - t_last) * 1000, 1)
                                           if converged else None),
    }
