"""Numbers into tables: medians with min-max over repetitions, and this-project / peer ratios.

``summarize`` reduces one scenario's raw runs to per-implementation figures (only runs that
passed the correctness check count); ``markdown`` renders every scenario's table;
``update_doc`` puts them into docs/contributing/benchmarks.md between markers, with the exact
command.
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path
from typing import Callable

from .probes import FOOTPRINT

THIS = "this-project"

# (label, getter, unit, higher_is_better)
Figure = tuple[str, Callable[[dict], float | None], str, bool]


def value_at(*path: str) -> Callable[[dict], float | None]:
    """A getter of the number at ``path`` in one run's result (None where it is missing)."""
    def get(run: dict):
        cur = run
        for p in path:
            if not isinstance(cur, dict) or p not in cur:
                return None
            cur = cur[p]
        return cur if isinstance(cur, (int, float)) and not isinstance(cur, bool) else None
    return get


def mib(*path: str) -> Callable[[dict], float | None]:
    """A getter of the kB figure at ``path``, in MiB."""
    kb = value_at(*path)
    return lambda run: None if not kb(run) else kb(run) / 1024


def _at_size(n: int, get: Callable[[dict], float | None]) -> Callable[[dict], float | None]:
    return lambda r: get(r) if r.get("n") == n else None


def _converge_figures() -> list[Figure]:
    figs: list[Figure] = [
        ("objects/s", value_at("objects_per_second"), "obj/s", True),
        ("converge time", value_at("converge_seconds"), "s", False),
        ("reconciles", value_at("reconciles"), "", False),
        ("api writes per object", value_at("writes_per_object"), "", False),
        ("operator CPU per object", value_at("cpu_ms_per_object", "operator"), "ms", False),
        ("whole footprint CPU per object", value_at("cpu_ms_per_object", FOOTPRINT), "ms",
         False),
    ]
    for g in ("postgres (all)", "postgres (bench db backends)", "redis", "kube-apiserver",
              "etcd", "harness (loader, observer)"):
        figs.append((f"{g} CPU per object", value_at("cpu_ms_per_object", g), "ms", False))
    figs += [("operator peak RSS", mib("operator_rss_peak_kb"), "MiB", False),
             ("whole footprint peak RSS", mib("footprint_rss_peak_kb"), "MiB", False),
             ("operator PSS after", mib("operator_memory_after", "pss_kb"), "MiB", False),
             ("whole footprint PSS after", mib("footprint_memory_after", "pss_kb"), "MiB",
              False),
             ("PostgreSQL tables and indexes", lambda r: (
                 sum(r["storage"]["postgres_tables_bytes"].values()) / 2**20
                 if (r.get("storage") or {}).get("postgres_tables_bytes") else None),
              "MiB", False),
             ("steady updates event->reconcile start p50", value_at("steady", "start_p50_ms"),
              "ms", False),
             ("steady updates event->reconcile start p99", value_at("steady", "start_p99_ms"),
              "ms", False),
             ("steady updates whole footprint CPU per update",
              value_at("steady", "footprint_cpu_ms_per_update"), "ms", False)]
    return figs


def _figures(scenario: str, runs: list[dict]) -> list[Figure]:
    if scenario == "converge":
        sizes = sorted({r["n"] for r in runs if "n" in r})
        figs = []
        for n in sizes:
            at = f" at N={n}" if len(sizes) > 1 else ""
            figs += [(label + at, _at_size(n, get), unit, higher)
                     for label, get, unit, higher in _converge_figures()]
        return figs
    if scenario == "latency":
        rates = sorted({int(k) for r in runs for k in (r.get("rates") or {})})
        figs = []
        for rate in rates:
            k = str(rate)
            figs += [
                (f"{rate}/s event->reconcile start p50", value_at("rates", k, "start_p50_ms"), "ms", False),
                (f"{rate}/s event->reconcile start p99", value_at("rates", k, "start_p99_ms"), "ms", False),
                (f"{rate}/s event->converged p50", value_at("rates", k, "converged_p50_ms"), "ms", False),
                (f"{rate}/s event->converged p99", value_at("rates", k, "converged_p99_ms"), "ms", False),
                (f"{rate}/s reconciles per update",
                 lambda r, k=k: (r["rates"][k]["reconciles"] / r["rates"][k]["updates"])
                 if r.get("rates", {}).get(k, {}).get("updates") else None, "", False),
                (f"{rate}/s operator CPU per update", value_at("rates", k, "operator_cpu_ms_per_update"),
                 "ms", False),
                (f"{rate}/s whole footprint CPU per update",
                 value_at("rates", k, "footprint_cpu_ms_per_update"), "ms", False),
            ]
        return figs
    if scenario == "burst":
        return [("reconciles for K updates", value_at("reconciles"), "", False),
                ("last run saw final generation", lambda r: 1.0 if r.get("last_saw_final") else 0.0,
                 "yes=1", True),
                ("converged after last update", value_at("converged_after_last_update_ms"), "ms", False)]
    if scenario == "relist":
        figs = []
        for mode in ("connections-dropped", "restart", "paired restart", "watcher restart",
                     "standby"):
            figs += [(f"{mode}: resume", value_at("modes", mode, "resume_seconds"), "s", False),
                     (f"{mode}: reconciles", value_at("modes", mode, "reconciles"), "", False),
                     (f"{mode}: operator CPU", value_at("modes", mode, "operator_cpu_seconds"), "s", False),
                     (f"{mode}: whole footprint CPU", value_at("modes", mode, "footprint_cpu_seconds"),
                      "s", False)]
            # In the order they happen: the start-up lines, the reconcile, converged.
            phases = list(dict.fromkeys(k for r in runs for k in
                                        (r.get("modes", {}).get(mode, {}).get("phases") or {})))
            figs += [(f"{mode}: to {k}", value_at("modes", mode, "phases", k), "s", False)
                     for k in phases]
        return figs
    if scenario == "cost":
        sizes = sorted({r["n"] for r in runs if "n" in r})
        figs = [(f"RSS at N={n}", lambda r, n=n: (r["rss_kb"] / 1024) if r.get("n") == n
                 and r.get("rss_kb") else None, "MiB", False) for n in sizes]
        figs += [(f"PSS at N={n}", lambda r, n=n: (r["pss_kb"] / 1024) if r.get("n") == n
                  and r.get("pss_kb") else None, "MiB", False) for n in sizes]
        figs += [(f"whole footprint {kind} at N={n}",
                  lambda r, n=n, key=f"footprint_{kind.lower()}_kb":
                  (r[key] / 1024) if r.get("n") == n and r.get(key) else None, "MiB", False)
                 for kind in ("RSS", "PSS") for n in sizes]
        return figs
    return []


def stats(values: list[float]) -> dict | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3), "runs": len(values)}


def summarize(scenario: str, runs: list[dict]) -> dict:
    """``{impl: {figure label: stats}}`` over the runs that passed the check."""
    out: dict[str, dict] = {}
    impls = list(dict.fromkeys(r["impl"] for r in runs))
    for impl in impls:
        mine = [r for r in runs if r["impl"] == impl]
        ok = [r for r in mine if r.get("ok")]
        figs = {label: stats([get(r) for r in ok]) for label, get, _, _ in _figures(scenario, runs)}
        figs = {k: v for k, v in figs.items() if v}
        entry = {"runs": len(mine), "passed": len(ok), "figures": figs}
        if len(ok) < len(mine):
            entry["failures"] = [r.get("error") or r.get("check", {}).get("wrong", [])[:2]
                                 for r in mine if not r.get("ok")]
        if scenario == "cost":
            entry["slope"] = _slopes(mine)
        out[impl] = entry
    return out


def _slopes(points: list[dict]) -> dict:
    from .scenarios.cost import slope

    by_rep: dict[int, list[dict]] = {}
    for p in points:
        by_rep.setdefault(p.get("rep", 0), []).append(p)
    rss = stats([slope(v, "rss_kb") for v in by_rep.values()])
    pss = stats([slope(v, "pss_kb") for v in by_rep.values()])
    redis = stats([(p["redis_delta_bytes"] / p["n"]) for p in points
                   if p.get("ok") and p.get("n") and p.get("redis_delta_bytes") is not None])
    return {"rss_bytes_per_object": rss, "pss_bytes_per_object": pss,
            "redis_bytes_per_object": redis}


def fmt(s: dict | None) -> str:
    if not s:
        return "-"
    m = s["median"]
    def f(x):
        return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}" if abs(x) < 10 else f"{x:.1f}"
    if s["runs"] > 1 and s["min"] != s["max"]:
        return f"{f(m)} ({f(s['min'])}-{f(s['max'])})"
    return f(m)


def ratio(a: dict | None, b: dict | None) -> str:
    """this / peer on medians; "-" when the peer's figure is too close to zero to divide by
    (e.g. PostgreSQL CPU of an implementation that does not use PostgreSQL)."""
    if not a or not b or abs(b["median"]) < 0.1 or abs(b["median"]) < abs(a["median"]) / 100:
        return "-"
    return f"{a['median'] / b['median']:.2f}"


def table(scenario: str, summary: dict, runs: list[dict]) -> str:
    impls = list(summary)
    peers = [i for i in impls if i != THIS]
    head = ["figure"] + impls + ([f"{THIS} / {p}" for p in peers] if THIS in summary else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, _, unit, _ in _figures(scenario, runs):
        cells = [f"{label}" + (f" ({unit})" if unit else "")]
        cells += [fmt(summary[i]["figures"].get(label)) for i in impls]
        if THIS in summary:
            mine = summary[THIS]["figures"].get(label)
            # The peers use no PostgreSQL or Redis: those rows are their background noise.
            shared = label.startswith(("postgres", "redis"))
            cells += ["-" if shared else ratio(mine, summary[p]["figures"].get(label))
                      for p in peers]
        if any(c != "-" for c in cells[1:]):
            lines.append("| " + " | ".join(cells) + " |")
    passed = ", ".join(f"{i} {summary[i]['passed']}/{summary[i]['runs']}" for i in impls)
    lines.append("")
    lines.append(f"Runs that passed the correctness check: {passed}.")
    if scenario == "cost":
        lines.append("")
        lines.append("| memory slope per cached object | " + " | ".join(impls) + " |")
        lines.append("|---|" + "---|" * len(impls))
        for key, label in (("rss_bytes_per_object", "operator RSS (bytes/object)"),
                           ("pss_bytes_per_object", "operator PSS (bytes/object)"),
                           ("redis_bytes_per_object", "shared cache in Redis (bytes/object)")):
            lines.append(f"| {label} | " + " | ".join(fmt(summary[i]["slope"].get(key))
                                                     for i in impls) + " |")
    return "\n".join(lines)


def _durability_line(meta: dict) -> str:
    record = meta.get("durability")
    if not record:
        return "PostgreSQL: durability not recorded (the test stack's: fsync off).  "
    shown = ", ".join(f"{k} {record.get(k)}" for k in ("fsync", "synchronous_commit",
                                                         "full_page_writes"))
    return (f"PostgreSQL {record.get('server_version')}: {shown} "
            f"({'durable' if record.get('durable') else 'not durable'}).  ")


def markdown(results: dict[str, list[dict]], meta: dict) -> str:
    parts = [f"Command: `{meta['command'].strip()}`  ",
             f"Date: {meta['started_at']}, {meta['elapsed_seconds']:.0f} s; mode {meta['plan']['mode']}, "
             f"N={meta['plan']['n']}, {meta['plan']['reps']} repetition(s); machine: "
             f"{meta['machine']['cpus']} CPUs ({meta['machine']['cpu_model']}), "
             f"{meta['machine']['memory_gib']} GiB; load average at start "
             f"{', '.join(f'{x:.2f}' for x in meta['machine']['loadavg_at_start'])}.  ",
             _durability_line(meta),
             "Cells: median (min-max) over repetitions; ratios are this-project / peer on "
             "medians (for times, CPU and counts lower is better; for objects/s higher is).", ""]
    for scenario, runs in results.items():
        parts.append(f"#### {scenario}")
        parts.append("")
        parts.append(table(scenario, summarize(scenario, runs), runs))
        parts.append("")
    return "\n".join(parts)


def load(paths: list[Path]) -> tuple[dict, dict[str, list[dict]]]:
    """Results files of one harness run -> (meta, {scenario: runs}), to re-render tables."""
    import json

    meta: dict = {}
    results: dict[str, list[dict]] = {}
    commands: list[str] = []
    for path in paths:
        data = json.loads(Path(path).read_text())
        results[data["scenario"]] = data["runs"]
        meta = meta or {k: v for k, v in data.items() if k not in ("scenario", "runs", "summary")}
        command = data["command"].strip()
        if command not in commands:
            commands.append(command)
    meta["command"] = "` and `".join(commands)  # several runs: each table says which below
    return meta, results


def update_doc(doc: Path, mode: str, body: str) -> None:
    """Replace the block between ``<!-- bench:<mode>:start -->`` and ``:end -->``."""
    start, end = f"<!-- bench:{mode}:start -->", f"<!-- bench:{mode}:end -->"
    text = doc.read_text() if doc.exists() else ""
    block = f"{start}\n{body}\n{end}"
    if start in text and end in text:
        text = re.sub(re.escape(start) + r".*?" + re.escape(end), lambda _: block, text,
                      flags=re.S)
    else:
        text = text.rstrip() + f"\n\n{block}\n"
    doc.write_text(text)


def one_line(scenario: str, res: dict) -> str:
    if not res.get("ok"):
        return (res.get("error") or str(res.get("check", {}).get("wrong", [])[:1]))[:200]
    if scenario == "converge":
        return (f"{res.get('objects_per_second')} obj/s, {res.get('writes_per_object')} writes/obj, "
                f"operator {res.get('cpu_ms_per_object', {}).get('operator')} ms CPU/obj")
    if scenario == "latency":
        return "; ".join(f"{k}/s start p50 {v['start_p50_ms']} p99 {v['start_p99_ms']} ms"
                         for k, v in res["rates"].items())
    if scenario == "burst":
        return f"{res['reconciles']} reconciles, last saw final: {res['last_saw_final']}"
    if scenario == "relist":
        return "; ".join(f"{m}: resume {v['resume_seconds']} s, {v['reconciles']} reconciles"
                         for m, v in res["modes"].items())
    if scenario == "cost":
        return f"N={res['n']} RSS {res.get('rss_kb', 0) / 1024:.0f} MiB"
    return ""


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.report --marker full bench/results/<date>-*.json``: re-render a run's
    tables into docs/contributing/benchmarks.md from its result files (no benchmark runs)."""
    import argparse

    from .config import REPO

    parser = argparse.ArgumentParser(prog="python -m bench.report", description=main.__doc__)
    parser.add_argument("--marker", required=True, choices=["quick", "full", "large"])
    parser.add_argument("files", nargs="+", type=Path)
    args = parser.parse_args(argv)
    meta, results = load(args.files)
    order = ["converge", "latency", "burst", "cost", "relist"]
    results = {k: results[k] for k in order if k in results}
    update_doc(REPO / "docs" / "contributing" / "benchmarks.md", args.marker,
               markdown(results, meta))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
