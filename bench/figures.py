"""``python -m bench.figures``: the headline figures, from every results file - never a chosen run.

Reads every file in ``bench/results`` (``bench.results``) and groups the harness runs by
project version, engine (the digest of the source the run executed: ``results.ENGINE``),
mode (``full``, ``quick``, ``large``), configuration (``default``, or what makes a run an
experiment: a layout other than the default, ``BENCH_EXPERIMENT_*`` overrides) and durability
(whether the server under the ledger had ``fsync``, ``synchronous_commit`` and
``full_page_writes`` on, as the server said). Files written before the engine's digest was
recorded are grouped by version alone and labelled so; files without the durability record
ran on the test stack's PostgreSQL (all three off) and are never the headline.

The headline is the newest engine with at least ``MIN_RUNS`` durable full runs of the default
configuration. Each figure is reduced to one value per run first - the median of the run's
repetitions, a ratio from the run's own medians (implementations are compared within a run,
minutes apart, never across runs), a slope fitted over the run's sizes - and then to the median
over all of the group's runs, shown with its range. Where no engine has ``MIN_RUNS`` durable
full runs, the newest group's runs are shown, labelled as what they are.

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
from .targets import TARGETS, Target

MIN_RUNS = 3
THIS = "this-project"
PEERS = ("kopf", "cr-default", "cr-matched")
BEGIN, END = "<!-- figures:begin -->", "<!-- figures:end -->"
# The plan's settings that change what a figure means (sizes, repetitions, this project's
# layout); a run that sets one away from its mode's default is not a run of the default.
SETTINGS = ("n", "reps", "window", "rates", "burst_k", "burst_spread", "cost_sizes", "relist_n",
            "sizes", "steady_rate", "workers", "pool", "concurrency", "beat")
DEFAULT_PLANS = {"quick": Plan.quick(), "full": Plan.full(), "large": Plan.full(large=True)}
# The defaults of a run from before the sizes (its plan has no ``sizes``): one converge size,
# the cost at 0 and N (and 10,000 in the large run).
DEFAULTS_BEFORE_SIZES = {"quick": {"cost_sizes": [0, 200]}, "full": {"cost_sizes": [0, 1000]},
                         "large": {"cost_sizes": [0, 1000, 10_000]}}


BASE = "base"  # a figure's size: the run's own N (``plan["n"]``)
SCALE = 10_000  # the size the headline's "at scale" figures are read at
PROJECTED = 100_000  # the size the fitted cost line is read at


@dataclass(frozen=True)
class Figure:
    label: str
    unit: str
    scenario: str
    get: Callable[[dict], float | None]  # one repetition's value, from its raw result
    ratios: tuple[str, ...] = ()  # the peers this project's value is divided by
    # Which repetitions count: those of the run's own N (BASE), of one N, or all of them
    # (None; also any result that records no N, as the latency scenario's).
    size: int | str | None = BASE
    # None: the value. "slope": least squares of the value over N, per object, across the
    # run's sizes. An int: that line read at this N (what that many objects would cost).
    fit: str | int | None = None


def _times(get: Callable[[dict], float | None], k: float) -> Callable[[dict], float | None]:
    return lambda r: None if get(r) is None else get(r) * k


def _kib_as_bytes(*path: str) -> Callable[[dict], float | None]:
    return _times(value_at(*path), 1024)


def _table_bytes(r: dict) -> float | None:
    """Bytes of the ledger's, the history's and the stream's tables with their indexes."""
    tables = (r.get("storage") or {}).get("postgres_tables_bytes")
    return float(sum(tables.values())) if tables else None


def _redis_grown(r: dict) -> float | None:
    """Redis's ``used_memory`` grown over the run (the instance's: other users' keys too)."""
    storage = r.get("storage") or {}
    before, after = storage.get("redis_used_memory_before"), storage.get("redis_used_memory")
    return None if before is None or after is None else float(after - before)


def _steady(key: str) -> Callable[[dict], float | None]:
    return value_at("steady", key)


FIGURES = [
    Figure("converge", "obj/s", "converge", value_at("objects_per_second"), PEERS),
    Figure("CPU per converged object, whole footprint", "ms", "converge",
           value_at("cpu_ms_per_object", FOOTPRINT), PEERS),
    Figure("CPU per converged object, operator processes", "ms", "converge",
           value_at("cpu_ms_per_object", "operator"), PEERS),
    Figure("100 updates/s: event -> reconcile start p50", "ms", "latency",
           value_at("rates", "100", "start_p50_ms"), size=None),
    Figure("100 updates/s: event -> reconcile start p99", "ms", "latency",
           value_at("rates", "100", "start_p99_ms"), size=None),
    Figure("100 updates/s: CPU per update, whole footprint", "ms", "latency",
           value_at("rates", "100", "footprint_cpu_ms_per_update"), PEERS, size=None),
    Figure("peak RSS while converging, operator processes", "MiB", "converge",
           mib("operator_rss_peak_kb"), PEERS),
    Figure("peak RSS while converging, whole footprint", "MiB", "converge",
           mib("footprint_rss_peak_kb"), PEERS),
    Figure("PSS after converging, whole footprint", "MiB", "converge",
           mib("footprint_memory_after", "pss_kb"), PEERS),
    Figure("PSS after converging, operator processes", "MiB", "converge",
           mib("operator_memory_after", "pss_kb"), PEERS),
    # The steady updates among all N converged objects (the latency scenario's are among 100).
    Figure("100 updates/s among all N objects: event -> reconcile start p50", "ms", "converge",
           _steady("start_p50_ms")),
    Figure("100 updates/s among all N objects: event -> reconcile start p99", "ms", "converge",
           _steady("start_p99_ms")),
    Figure("100 updates/s among all N objects: CPU per update, whole footprint", "ms", "converge",
           _steady("footprint_cpu_ms_per_update"), PEERS),
    # At scale: the same figures with N=10,000 objects, and how the cost grows with N.
    Figure(f"converge N={SCALE:,}", "obj/s", "converge", value_at("objects_per_second"), PEERS,
           size=SCALE),
    Figure(f"CPU per converged object at N={SCALE:,}, whole footprint", "ms", "converge",
           value_at("cpu_ms_per_object", FOOTPRINT), PEERS, size=SCALE),
    Figure(f"100 updates/s among N={SCALE:,}: event -> reconcile start p50", "ms", "converge",
           _steady("start_p50_ms"), size=SCALE),
    Figure(f"100 updates/s among N={SCALE:,}: event -> reconcile start p99", "ms", "converge",
           _steady("start_p99_ms"), size=SCALE),
    Figure(f"100 updates/s among N={SCALE:,}: CPU per update, whole footprint", "ms",
           "converge", _steady("footprint_cpu_ms_per_update"), PEERS, size=SCALE),
    Figure(f"PSS after converging N={SCALE:,}, whole footprint", "MiB", "converge",
           mib("footprint_memory_after", "pss_kb"), PEERS, size=SCALE),
    Figure("slope: CPU to converge one more object, whole footprint", "ms", "converge",
           _times(value_at("cpu_seconds", FOOTPRINT), 1000), PEERS, size=None, fit="slope"),
    Figure("slope: PSS per cached object, whole footprint", "bytes", "converge",
           _kib_as_bytes("footprint_memory_after", "pss_kb"), PEERS, size=None, fit="slope"),
    Figure("slope: PostgreSQL tables and indexes per object", "bytes", "converge",
           _table_bytes, size=None, fit="slope"),
    Figure("slope: Redis used_memory per object", "bytes", "converge", _redis_grown,
           size=None, fit="slope"),
    Figure(f"PSS after converging N={PROJECTED:,}, whole footprint, fitted", "MiB", "converge",
           mib("footprint_memory_after", "pss_kb"), PEERS, size=None, fit=PROJECTED),
    Figure(f"PostgreSQL tables and indexes at N={PROJECTED:,}, fitted", "MiB", "converge",
           _times(_table_bytes, 1 / 2**20), size=None, fit=PROJECTED),
    # Restarts and the takeover.
    Figure("restart of the whole operator beside kopf's: resume", "s", "relist",
           value_at("modes", "paired restart", "resume_seconds"), ("kopf",)),
    Figure("restart of the whole operator beside kopf's: CPU, whole footprint", "s", "relist",
           value_at("modes", "paired restart", "footprint_cpu_seconds"), ("kopf",)),
    Figure("restart of the whole operator: reconciles its start makes", "", "relist",
           value_at("modes", "restart", "reconciles")),
    Figure("cold restart of the watcher alone: resume", "s", "relist",
           value_at("modes", "watcher restart", "resume_seconds")),
    Figure("hot-standby takeover: resume", "s", "relist",
           value_at("modes", "standby", "resume_seconds")),
    Figure("hot-standby takeover: reconciles it makes (nothing changed: 0 is right)", "",
           "relist", value_at("modes", "standby", "reconciles")),
]


FIGURE_BY_LABEL = {f.label: f for f in FIGURES}


@dataclass
class Group:
    """The runs of one version, engine, mode, configuration and durability."""

    version: str | None
    engine: str | None  # None: runs from before the engine's digest was recorded
    mode: str
    configuration: str
    durable: bool
    runs: list[results.Run]

    @property
    def durability(self) -> str:
        """What the ledger's server was, as its runs recorded it."""
        record = self.runs[-1].durability
        if record is None:
            return "not recorded: the test stack's, fsync off"
        shown = ", ".join(f"{k} {record.get(k)}" for k in DURABILITY)
        return ("durable" if self.durable else "not durable") + f" ({shown})"

    @property
    def engine_label(self) -> str:
        return f"`{self.engine[:12]}`" if self.engine else "not recorded (grouped by version)"


DURABILITY = ("fsync", "synchronous_commit", "full_page_writes")


def configuration(run: results.Run) -> str:
    """``default``, or the run's plan settings away from its mode's default and its
    ``BENCH_EXPERIMENT_*`` overrides."""
    default = DEFAULT_PLANS[run.mode].as_dict() if run.mode in DEFAULT_PLANS else {}
    if "sizes" not in run.plan:
        default.update(DEFAULTS_BEFORE_SIZES.get(run.mode, {}))
    parts = [f"{key}={run.plan[key]}" for key in SETTINGS
             if key in run.plan and run.plan[key] != default.get(key)]
    parts += [f"{k}={v}" for k, v in sorted(run.environment.items())
              if k.startswith("BENCH_EXPERIMENT_")]
    return ", ".join(parts) or "default"


def group(runs: list[results.Run]) -> list[Group]:
    """Runs grouped by version, engine, mode, configuration and durability; the newest
    version first, and within one version the group with the latest run first."""
    out: dict[tuple, Group] = {}
    for run in runs:
        key = (run.version, run.engine, run.mode, configuration(run), run.durable)
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


def _name(g: Group) -> str:
    return f"version {g.version}, engine {g.engine_label}"


def choose(groups: list[Group]) -> tuple[Group | None, str]:
    """The headline's group and a sentence saying what it is. Never a single chosen run: every
    durable full run of the default configuration of the chosen engine counts."""
    full = [g for g in groups if g.version and g.mode == "full" and g.configuration == "default"]
    durable = [g for g in full if g.durable]
    enough = [g for g in durable if len(g.runs) >= MIN_RUNS]
    if enough:
        chosen = enough[0]
        note = (f"**{_name(chosen)[0].upper()}{_name(chosen)[1:]}: the median of its "
                f"{len(chosen.runs)} durable full runs** (`make bench`; PostgreSQL with fsync, "
                "synchronous_commit and full_page_writes on).")
        newer = durable[:durable.index(chosen)]
        if newer:
            note += " Newer, with fewer than three durable full runs so far: " + ", ".join(
                f"{_name(g)} ({len(g.runs)})" for g in newer) + "."
        return chosen, note
    if durable:
        chosen = durable[0]
        return chosen, (f"**Fewer than three durable full runs of any engine: {_name(chosen)} "
                        f"has {len(chosen.runs)}.** Its figures are shown below; they are not "
                        f"the headline until {MIN_RUNS} durable full runs of one engine exist.")
    if full:
        chosen = full[0]
        return chosen, (f"**No durable full run yet: not a headline.** Below, the newest "
                        f"non-durable full runs ({_name(chosen)}, {len(chosen.runs)} runs), "
                        "measured on the test stack's PostgreSQL with fsync, synchronous_commit "
                        "and full_page_writes off: the ledger's commits never waited for the "
                        "disk, so these figures understate what production pays.")
    quick = [g for g in groups if g.version and g.mode == "quick"
             and g.configuration == "default"]
    if quick:
        chosen = quick[0]
        return chosen, (f"**No full run of the fair bench yet: the {len(chosen.runs)} quick "
                        f"run(s) of {_name(chosen)}** (`make bench-quick`, N=200, one "
                        "repetition) - fewer than three full runs, not a headline.")
    return None, "**No results of the fair bench yet**: run `make bench` three times."


def _counts(run: results.Run, figure: Figure, r: dict) -> bool:
    """Whether repetition ``r`` is one of those ``figure`` reads (its size)."""
    if not r.get("ok"):
        return False
    if figure.size is None:
        return True
    size = run.plan.get("n") if figure.size == BASE else figure.size
    return r.get("n", size) == size


def per_run(run: results.Run, figure: Figure, impl: str) -> float | None:
    """One run's value of ``figure`` for ``impl``: the median of its passing repetitions, or
    the line fitted through them over N (``Figure.fit``)."""
    mine = [r for r in run.scenarios.get(figure.scenario, [])
            if r.get("impl") == impl and _counts(run, figure, r)]
    if figure.fit is not None:
        line = fit([(r["n"], figure.get(r)) for r in mine if r.get("n")])
        if line is None:
            return None
        slope, intercept = line
        return slope if figure.fit == "slope" else intercept + slope * figure.fit
    values = [v for v in (figure.get(r) for r in mine) if v is not None]
    return statistics.median(values) if values else None


def fit(points: list[tuple[float, float | None]]) -> tuple[float, float] | None:
    """Least squares ``(slope, intercept)`` through ``(n, value)``; None without two sizes."""
    pts = [(n, y) for n, y in points if y is not None]
    if len({n for n, _ in pts}) < 2:
        return None
    mean_n = sum(n for n, _ in pts) / len(pts)
    mean_y = sum(y for _, y in pts) / len(pts)
    slope = (sum((n - mean_n) * (y - mean_y) for n, y in pts)
             / sum((n - mean_n) ** 2 for n, _ in pts))
    return slope, mean_y - slope * mean_n


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


def target_cell(g: Group, target: Target) -> Cell | None:
    """What ``target`` reads on the group: this project's value, its ratio to a peer, or its
    ratio to another of its own figures, each taken within a run, medianed over the runs."""
    figure = FIGURE_BY_LABEL[target.figure]
    if target.over is not None:
        over = FIGURE_BY_LABEL[target.over]
        pairs = [(per_run(r, figure, THIS), per_run(r, over, THIS)) for r in g.runs]
        return Cell.of([a / b if a is not None and b else None for a, b in pairs])
    values, ratios = cells(g, figure)
    return ratios.get(target.peer) if target.peer else values[THIS]


def _against(target: Target, cell: Cell | None, runs: int) -> str:
    """``show`` for a target, where rounding may not carry a median onto the target's side
    of the limit: such a median and its range get more digits (0.897x, not 0.90x against
    0.9x)."""
    text = show(cell, runs, ratio=target.ratio)
    if cell is None or target.met(float(text.split(" ")[0].rstrip("x").replace(",", ""))) \
            == target.met(cell.median):
        return text
    digits = next((d for d in (3, 4, 5) if target.met(round(cell.median, d))
                   == target.met(cell.median)), 6)
    unit = "x" if target.ratio else ""
    out = f"{cell.median:.{digits}f}{unit}"
    if cell.runs > 1 and cell.low != cell.high:
        out += f" ({cell.low:.{digits}f}{unit}-{cell.high:.{digits}f}{unit})"
    return out + (f" [{cell.runs} of {runs} runs]" if cell.runs < runs else "")


def targets_table(g: Group) -> str:
    n = len(g.runs)
    lines = ["| target | wanted | measured | met |", "|---|---|---|---|"]
    for target in TARGETS:
        cell = target_cell(g, target)
        verdict = "-" if cell is None else "yes" if target.met(cell.median) else "**no**"
        label = target.label(FIGURE_BY_LABEL[target.figure].unit)
        lines.append(f"| {label}{f' ({target.why})' if target.why else ''} | {target.wanted()} "
                     f"| {_against(target, cell, n)} | {verdict} |")
    return "\n".join(lines)


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
    "project: watcher and workers), side by side with kopf's, their restarts alternating. "
    "**Slope**: least squares over each run's sizes (N=1,000 and 10,000; 30,000 too with "
    "`--large`), per object; the fitted line read at 100,000 objects is what that many would "
    "cost if the growth stays linear. The PostgreSQL tables are the ledger's, the history's and "
    "the stream's (`pg_total_relation_size`: heap, indexes, TOAST); Redis's `used_memory` is "
    "the instance's, grown over the run. The takeover: the leading watcher stops cleanly with a "
    "hot standby running and nothing changed; every reconcile it makes is one too many.")


def docs_block(groups: list[Group]) -> str:
    chosen, note = choose(groups)
    parts = [BEGIN, "<!-- generated by `python -m bench.figures` from bench/results/*.json: "
             "do not edit by hand -->", "", note, ""]
    if chosen is not None:
        plan = chosen.runs[-1].plan
        sizes = ", ".join(f"{n:,}" if isinstance(n, int) else str(n)
                          for n in plan.get("sizes") or [plan.get("n")])
        parts += [f"N={sizes}, {plan.get('reps')} repetition(s) per run; PostgreSQL: "
                  f"{chosen.durability}; runs: {_runs_line(chosen)}.", "",
                  table(chosen, FIGURES), "", LEGEND, "",
                  "The performance targets (`bench/targets.py`), read on the same runs (met: "
                  "the median is within the target):", "", targets_table(chosen), ""]
    parts += ["Every group of runs in `bench/results/` (only durable full runs of the default "
              "configuration make the headline; files written before the fair bench record no "
              "version, those before the engine's digest none, and those before the durable "
              "bench no PostgreSQL settings):", "",
              "| version | engine | PostgreSQL | mode | configuration | runs | latest |",
              "|---|---|---|---|---|---|---|"]
    parts += [f"| {g.version or 'not recorded'} | {g.engine_label} | {g.durability} | {g.mode} "
              f"| {g.configuration} | {len(g.runs)} | {g.runs[-1].started_at} |"
              for g in groups]
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
