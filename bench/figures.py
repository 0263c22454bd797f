"""``python -m bench.figures``: the headline figures, from every results file - never a chosen run.

Reads every file in ``bench/results`` (``bench.results``) and groups the harness runs by
project version, mode (``full``, ``quick``, ``large``) and configuration (``default``, or what
makes a run an experiment: a layout other than the default, ``BENCH_EXPERIMENT_*``
overrides). The headline is the newest version with at least ``MIN_RUNS`` full runs of the
default configuration. Each figure is reduced to one value per run first - the median of the
run's repetitions, a ratio from the run's own medians (implementations are compared within a
run, minutes apart, never across runs) - and then to the median over all of the group's runs,
shown with its range. Where no version has ``MIN_RUNS`` full runs, the newest version's runs
are shown, labelled as fewer than three.

The output is the one generated block in docs/contributing/benchmarks.md (every figure, every
group of runs), between ``BEGIN`` and ``END``: the only place outside ``bench/results`` where
a figure appears - the README, the CHANGELOG and every other doc link it
(``tests/test_docs.py``). ``python -m bench`` runs this at its end.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from packaging.version import InvalidVersion, Version

from . import results
from .config import BENCH, REPO
from .harness import Plan
from .probes import FOOTPRINT
from .report import mib, value_at

MIN_RUNS = 3
THIS = "this-project"
PEERS = ("kopf", "cr-default", "cr-matched")
BEGIN, END = "<!-- figures:begin -->", "<!-- figures:end -->"
# The plan's settings that change what a figure means (sizes, repetitions, this project's
# layout); a run that sets one away from its mode's default is not a run of the default.
SETTINGS = ("n", "reps", "window", "rates", "burst_k", "burst_spread", "cost_sizes", "relist_n",
            "workers", "pool", "concurrency", "beat")
DEFAULT_PLANS = {"quick": Plan.quick(), "full": Plan.full(), "large": Plan.full(large=True)}


@dataclass(frozen=True)
class Figure:
    label: str
    unit: str
    scenario: str
    get: Callable[[dict], float | None]  # one repetition's value, from its raw result
    ratios: tuple[str, ...] = ()  # the peers this project's value is divided by


FIGURES = [
    Figure("converge", "obj/s", "converge", value_at("objects_per_second"), PEERS),
    Figure("CPU per converged object, whole footprint", "ms", "converge",
           value_at("cpu_ms_per_object", FOOTPRINT), PEERS),
    Figure("CPU per converged object, operator processes", "ms", "converge",
           value_at("cpu_ms_per_object", "operator"), PEERS),
    Figure("100 updates/s: event -> reconcile start p50", "ms", "latency",
           value_at("rates", "100", "start_p50_ms")),
    Figure("100 updates/s: event -> reconcile start p99", "ms", "latency",
           value_at("rates", "100", "start_p99_ms")),
    Figure("100 updates/s: CPU per update, whole footprint", "ms", "latency",
           value_at("rates", "100", "footprint_cpu_ms_per_update"), PEERS),
    Figure("peak RSS while converging, operator processes", "MiB", "converge",
           mib("operator_rss_peak_kb"), PEERS),
    Figure("peak RSS while converging, whole footprint", "MiB", "converge",
           mib("footprint_rss_peak_kb"), PEERS),
    Figure("PSS after converging, whole footprint", "MiB", "converge",
           mib("footprint_memory_after", "pss_kb"), PEERS),
    Figure("restart of the whole operator beside kopf's: resume", "s", "relist",
           value_at("modes", "paired restart", "resume_seconds"), ("kopf",)),
    Figure("restart of the whole operator beside kopf's: CPU, whole footprint", "s", "relist",
           value_at("modes", "paired restart", "footprint_cpu_seconds"), ("kopf",)),
    Figure("restart of the whole operator: reconciles its start makes", "", "relist",
           value_at("modes", "restart", "reconciles")),
]


@dataclass
class Group:
    """The runs of one version, mode and configuration."""

    version: str | None
    mode: str
    configuration: str
    runs: list[results.Run]


def configuration(run: results.Run) -> str:
    """``default``, or the run's plan settings away from its mode's default and its
    ``BENCH_EXPERIMENT_*`` overrides."""
    default = DEFAULT_PLANS[run.mode].as_dict() if run.mode in DEFAULT_PLANS else {}
    parts = [f"{key}={run.plan[key]}" for key in SETTINGS
             if key in run.plan and run.plan[key] != default.get(key)]
    parts += [f"{k}={v}" for k, v in sorted(run.environment.items())
              if k.startswith("BENCH_EXPERIMENT_")]
    return ", ".join(parts) or "default"


def group(runs: list[results.Run]) -> list[Group]:
    """Runs grouped by version, mode and configuration; the newest version first."""
    out: dict[tuple, Group] = {}
    for run in runs:
        key = (run.version, run.mode, configuration(run))
        out.setdefault(key, Group(*key, runs=[])).runs.append(run)
    return sorted(out.values(), key=lambda g: (_version_key(g.version), g.runs[-1].started_at),
                  reverse=True)


def _version_key(version: str | None) -> tuple:
    if version is None:
        return (0, Version("0"))
    try:
        return (2, Version(version))
    except InvalidVersion:
        return (1, Version("0"))


def choose(groups: list[Group]) -> tuple[Group | None, str]:
    """The headline's group and a sentence saying what it is. Never a single chosen run: every
    full run of the default configuration of the chosen version counts."""
    full = [g for g in groups if g.version and g.mode == "full" and g.configuration == "default"]
    enough = [g for g in full if len(g.runs) >= MIN_RUNS]
    if enough:
        chosen = enough[0]
        note = (f"**Version {chosen.version}: the median of its {len(chosen.runs)} full runs** "
                "(`make bench`).")
        newer = [g for g in full if _version_key(g.version) > _version_key(chosen.version)]
        if newer:
            note += " Newer, with fewer than three full runs so far: " + ", ".join(
                f"{g.version} ({len(g.runs)})" for g in newer) + "."
        return chosen, note
    if full:
        chosen = full[0]
        return chosen, (f"**Fewer than three full runs of any version: version {chosen.version} "
                        f"has {len(chosen.runs)}.** Its figures are shown below; they are not "
                        f"the headline until {MIN_RUNS} full runs of one version exist.")
    quick = [g for g in groups if g.version and g.mode == "quick"
             and g.configuration == "default"]
    if quick:
        chosen = quick[0]
        return chosen, (f"**No full run of the fair bench yet: the {len(chosen.runs)} quick "
                        f"run(s) of version {chosen.version}** (`make bench-quick`, N=200, one "
                        "repetition) - fewer than three full runs, not a headline.")
    return None, "**No results of the fair bench yet**: run `make bench` three times."


def per_run(run: results.Run, figure: Figure, impl: str) -> float | None:
    """One run's value of ``figure`` for ``impl``: the median of its passing repetitions."""
    values = [figure.get(r) for r in run.scenarios.get(figure.scenario, [])
              if r.get("impl") == impl and r.get("ok")]
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def per_run_ratio(run: results.Run, figure: Figure, peer: str) -> float | None:
    """This project / ``peer`` within one run."""
    mine, theirs = per_run(run, figure, THIS), per_run(run, figure, peer)
    if mine is None or not theirs:
        return None
    return mine / theirs


@dataclass(frozen=True)
class Cell:
    """The median over runs of one figure, its range, and over how many runs."""

    median: float
    low: float
    high: float
    runs: int

    @classmethod
    def of(cls, values: list[float | None]) -> "Cell | None":
        values = [v for v in values if v is not None]
        if not values:
            return None
        return cls(statistics.median(values), min(values), max(values), len(values))


def cells(g: Group, figure: Figure) -> tuple[dict[str, Cell | None], dict[str, Cell | None]]:
    """``({impl: value cell}, {peer: ratio cell})`` of one figure over the group's runs."""
    values = {impl: Cell.of([per_run(r, figure, impl) for r in g.runs])
              for impl in (THIS, *PEERS)}
    ratios = {peer: Cell.of([per_run_ratio(r, figure, peer) for r in g.runs])
              for peer in figure.ratios}
    return values, ratios


def _number(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.1f}" if abs(x) >= 10 else f"{x:.3g}"


def show(cell: Cell | None, runs: int, ratio: bool = False) -> str:
    """``median (low-high)``, with the number of runs where fewer than all of them had it."""
    if cell is None:
        return "-"
    f = (lambda x: f"{x:.2f}x") if ratio else _number
    out = f(cell.median)
    if cell.runs > 1 and cell.low != cell.high:
        out += f" ({f(cell.low)}-{f(cell.high)})"
    if cell.runs < runs:
        out += f" [{cell.runs} of {runs} runs]"
    return out


def table(g: Group, figures: list[Figure]) -> str:
    n = len(g.runs)
    head = ["figure", THIS, *PEERS, *(f"{THIS} / {p}" for p in PEERS)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for figure in figures:
        values, ratios = cells(g, figure)
        row = [figure.label + (f" ({figure.unit})" if figure.unit else "")]
        row += [show(values[i], n) for i in (THIS, *PEERS)]
        row += [show(ratios.get(p), n, ratio=True) for p in PEERS]
        if any(c != "-" for c in row[1:]):
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def _runs_line(g: Group) -> str:
    return "; ".join(f"{r.run_id} (`{r.commit[:8] or '?'}`"
                     + (", uncommitted changes" if r.uncommitted else "") + ")" for r in g.runs)


LEGEND = (
    "Each cell: the median over the runs of each run's own median (min-max over the runs); "
    "ratios are this project / peer, taken within each run. **Whole footprint**: this project's "
    "watcher, every worker process (prefork children included), beat when used, all of "
    "PostgreSQL and Redis (shared services: on this machine they also serve whatever else runs "
    "on it); a peer's is its own process. `cr-default` is controller-runtime as shipped "
    "(`MaxConcurrentReconciles` 1), `cr-matched` the same with `MaxConcurrentReconciles` equal "
    "to this project's run threads. The restart stops and starts the whole operator (this "
    "project: watcher and workers), side by side with kopf's, their restarts alternating.")


def docs_block(groups: list[Group]) -> str:
    chosen, note = choose(groups)
    parts = [BEGIN, "<!-- generated by `python -m bench.figures` from bench/results/*.json: "
             "do not edit by hand -->", "", note, ""]
    if chosen is not None:
        plan = chosen.runs[-1].plan
        parts += [f"N={plan.get('n')}, {plan.get('reps')} repetition(s) per run; runs: "
                  f"{_runs_line(chosen)}.", "", table(chosen, FIGURES), "", LEGEND, ""]
    parts += ["Every group of runs in `bench/results/` (only full runs of the default "
              "configuration make the headline; files written before the fair bench record no "
              "version):", "",
              "| version | mode | configuration | runs | latest |", "|---|---|---|---|---|"]
    parts += [f"| {g.version or 'not recorded'} | {g.mode} | {g.configuration} | {len(g.runs)} "
              f"| {g.runs[-1].started_at} |" for g in groups]
    parts.append(END)
    return "\n".join(parts)


def replace_block(text: str, block: str, where: str) -> str:
    """``text`` with the block between ``BEGIN`` and ``END`` replaced, nothing else changed."""
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{where} has no {BEGIN} ... {END} block to write the figures into")
    return pattern.sub(lambda _: block, text, count=1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.figures", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=BENCH / "results",
                        help="the directory of results files (all of them are read)")
    parser.add_argument("--docs", type=Path,
                        default=REPO / "docs" / "contributing" / "benchmarks.md")
    parser.add_argument("--print", action="store_true", help="print the block, write nothing")
    args = parser.parse_args(argv)
    block = docs_block(group(results.load_dir(args.results)))
    if args.print:
        print(block)
        return 0
    args.docs.write_text(replace_block(args.docs.read_text(), block, str(args.docs)))
    print(f"figures: updated {args.docs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
