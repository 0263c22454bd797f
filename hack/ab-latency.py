"""Medians of a before/after experiment on the latency scenario, over every run of each side.

    python hack/ab-latency.py bench/results/experiments/<name>

reads ``<name>/before/*.json`` and ``<name>/after/*.json`` (``python -m bench --scenarios
latency --out ...`` on each commit, alternated) and prints, per side and implementation, the
median over all runs at 100 updates/s of: CPU per update of the whole footprint, of the
operator's processes and of PostgreSQL's backends, and event -> start p50 / p99; then this
project's whole-footprint CPU per update against kopf's, each a median of its side's runs.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

COLUMNS = ("footprint ms/update", "operator ms/update", "postgres ms/update", "start p50 ms",
           "start p99 ms")


def _row(run: dict) -> tuple[float, ...]:
    steady = run["rates"]["100"]
    cpu = steady["cost"]["cpu_seconds"]
    return (steady["footprint_cpu_ms_per_update"], steady["operator_cpu_ms_per_update"],
            1000 * cpu.get("postgres (bench db backends)", 0.0) / steady["updates"],
            steady["start_p50_ms"], steady["start_p99_ms"])


def summarise(experiment: Path) -> None:
    for side in ("before", "after"):
        rows: dict[str, list[tuple[float, ...]]] = {}
        for path in sorted((experiment / side).glob("*.json")):
            for run in json.loads(path.read_text())["runs"]:
                rows.setdefault(run["impl"], []).append(_row(run))
        for impl, values in sorted(rows.items()):
            medians = [round(statistics.median(col), 2) for col in zip(*values)]
            print(f"{side:6} {impl:13} runs={len(values)} "
                  + ", ".join(f"{name} {m}" for name, m in zip(COLUMNS, medians)))
        ours = statistics.median(r[0] for r in rows["this-project"])
        kopf = statistics.median(r[0] for r in rows["kopf"])
        print(f"{side:6} whole footprint per update vs kopf: {ours / kopf:.2f}x")


if __name__ == "__main__":
    summarise(Path(sys.argv[1]))
