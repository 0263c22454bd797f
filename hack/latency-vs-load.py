"""Event -> reconcile start beside how busy the machine was, for every repetition of the latency
scenario in the given results files.

    python hack/latency-vs-load.py bench/results/2026-12-07T*-full-latency.json

For each implementation and rate, one line per repetition, sorted by load: the cores the
measured processes kept busy during the window (the CPU seconds of the api-server, etcd, the
controller manager, the harness and the implementation's whole footprint, over the window's
wall time; the machine has two), then p50 and p99 of event -> reconcile start, then the
footprint's CPU per update. Then, per implementation at 100 updates/s, the median p50 of the
repetitions below and above 1.65 busy cores. On a 2-core machine the 100 updates/s latency
follows the load: a repetition that ran while the machine was slower spends more CPU on the
same updates and queues longer for a core.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

MEASURED = ("etcd", "harness (loader, observer)", "kube-apiserver", "kube-controller-manager",
            "whole footprint")
SPLIT = 1.65  # busy cores (of 2) dividing the quieter repetitions from the busier ones


def rows(paths: list[Path]) -> dict[tuple[str, str], list[tuple[float, float, float, float]]]:
    out: dict[tuple[str, str], list] = defaultdict(list)
    for path in paths:
        for run in json.loads(path.read_text())["runs"]:
            for rate, window in run.get("rates", {}).items():
                cost = window["cost"]
                busy = sum(cost["cpu_seconds"].get(k, 0.0) for k in MEASURED) / cost["wall_seconds"]
                out[(run["impl"], rate)].append((busy, window["start_p50_ms"],
                                                 window["start_p99_ms"],
                                                 window["footprint_cpu_ms_per_update"]))
    return out


def main(argv: list[str]) -> int:
    table = rows([Path(a) for a in argv])
    for (impl, rate), reps in sorted(table.items()):
        print(f"{impl} at {rate} updates/s: busy cores, start p50 / p99 ms, footprint ms/update")
        for busy, p50, p99, cpu in sorted(reps):
            print(f"  {busy:4.2f}  {p50:6.2f} / {p99:7.2f}  {cpu:5.2f}")
    print(f"median p50 at 100 updates/s, repetitions below / above {SPLIT} busy cores:")
    for (impl, rate), reps in sorted(table.items()):
        if rate != "100":
            continue
        low = [p50 for busy, p50, _, _ in reps if busy < SPLIT]
        high = [p50 for busy, p50, _, _ in reps if busy >= SPLIT]
        show = [f"{statistics.median(x):.2f} ms ({len(x)})" if x else "-" for x in (low, high)]
        print(f"  {impl}: {show[0]} / {show[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
