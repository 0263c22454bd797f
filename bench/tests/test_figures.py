"""The headline figures: the median over every durable full run of one engine, never a chosen
run.

Pure logic on results files written to a temporary directory; no service is needed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import figures, results, targets

CONVERGE = figures.FIGURES[0]
ENGINE = "e" * 64
DURABLE = {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on",
           "server_version": "17.6", "port": 15434, "durable": True}
FAST = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off",
        "server_version": "17.6", "port": 15432, "durable": False}


def converge(impl: str, rate: float, rep: int = 0, ok: bool = True) -> dict:
    return {"impl": impl, "rep": rep, "ok": ok, "objects_per_second": rate}


def write_run(out: Path, second: int, rates: dict[str, list[float]], version: str = "1.0.0",
              mode: str = "full", environment: dict | None = None,
              engine: str | None = ENGINE, durability: dict | None = DURABLE, **plan) -> None:
    """One harness run's converge file: ``rates`` maps an implementation to one objects/s
    value per repetition. ``engine`` / ``durability`` None: a file from before they were
    recorded."""
    runs = [converge(impl, rate, rep) for impl, reps in rates.items()
            for rep, rate in enumerate(reps)]
    project = {"version": version, "commit": f"{second:040d}", "uncommitted": []}
    if engine is not None:
        project["engine"] = engine
    meta = {"run_id": f"2030-01-01T0000{second:02d}Z",
            "started_at": f"2030-01-01 00:{second:02d} UTC",
            "plan": {"mode": "full-large" if mode == "large" else mode, **plan},
            "project": project, "arguments": [], "environment": environment or {}}
    if durability is not None:
        meta["durability"] = durability
    results.write({"converge": runs}, meta, out)


def headline(out: Path) -> tuple[figures.Group | None, str]:
    return figures.choose(figures.group(results.load_dir(out)))


def test_the_headline_is_the_median_over_every_full_run_not_the_best_one(tmp_path):
    for second, rate in enumerate([300.0, 100.0, 200.0]):
        write_run(tmp_path, second, {"this-project": [rate], "kopf": [100.0]})
    chosen, note = headline(tmp_path)
    values, ratios = figures.cells(chosen, CONVERGE)
    assert len(chosen.runs) == 3 and "median of its 3 durable full runs" in note
    assert values["this-project"] == figures.Cell(200.0, 100.0, 300.0, 3)
    assert ratios["kopf"].median == 2.0


def test_each_run_counts_once_as_the_median_of_its_repetitions(tmp_path):
    write_run(tmp_path, 0, {"this-project": [10.0, 20.0, 90.0]})  # one run's median: 20
    write_run(tmp_path, 1, {"this-project": [30.0]})
    write_run(tmp_path, 2, {"this-project": [40.0]})
    chosen, _ = headline(tmp_path)
    assert figures.cells(chosen, CONVERGE)[0]["this-project"].median == 30.0


def test_ratios_are_taken_within_each_run_then_the_median_over_runs(tmp_path):
    # The machine's speed moves between runs: a ratio compares implementations minutes apart.
    write_run(tmp_path, 0, {"this-project": [100.0], "cr-matched": [200.0]})  # 0.5
    write_run(tmp_path, 1, {"this-project": [300.0], "cr-matched": [400.0]})  # 0.75
    write_run(tmp_path, 2, {"this-project": [900.0], "cr-matched": [1000.0]})  # 0.9
    chosen, _ = headline(tmp_path)
    assert figures.cells(chosen, CONVERGE)[1]["cr-matched"].median == 0.75


def test_a_failed_repetition_gives_no_figure(tmp_path):
    runs = [converge("this-project", 999.0, ok=False), converge("this-project", 100.0, rep=1)]
    meta = {"run_id": "2030-01-01T000000Z", "started_at": "2030-01-01 00:00 UTC",
            "plan": {"mode": "full"}, "project": {"version": "1.0.0"}}
    results.write({"converge": runs}, meta, tmp_path)
    (run,) = results.load_dir(tmp_path)
    assert figures.per_run(run, CONVERGE, "this-project") == 100.0


def test_runs_are_grouped_by_version_and_the_newest_with_three_full_runs_is_the_headline(
        tmp_path):
    for second in range(3):
        write_run(tmp_path, second, {"this-project": [100.0]}, version="0.9.0")
    for second in range(3, 6):
        write_run(tmp_path, second, {"this-project": [500.0]}, version="0.10.0")
    write_run(tmp_path, 6, {"this-project": [900.0]}, version="0.11.0")
    chosen, note = headline(tmp_path)
    assert chosen.version == "0.10.0"  # a version number, not a string: 0.10 > 0.9
    assert figures.cells(chosen, CONVERGE)[0]["this-project"].median == 500.0
    assert "0.11.0" in note and "(1)" in note


def test_a_changed_engine_under_an_unchanged_version_is_a_group_of_its_own(tmp_path):
    for second in range(3):
        write_run(tmp_path, second, {"this-project": [100.0]}, engine="a" * 64)
    for second in range(3, 6):
        write_run(tmp_path, second, {"this-project": [500.0]}, engine="b" * 64)
    write_run(tmp_path, 6, {"this-project": [900.0]}, engine="c" * 64)
    groups = figures.group(results.load_dir(tmp_path))
    assert [(g.engine[0], len(g.runs)) for g in groups] == [("c", 1), ("b", 3), ("a", 3)]
    chosen, note = figures.choose(groups)
    assert chosen.engine == "b" * 64  # the newest engine with three durable full runs
    assert figures.cells(chosen, CONVERGE)[0]["this-project"].median == 500.0
    assert "`cccccccccccc` (1)" in note


def test_runs_from_before_the_engine_digest_are_grouped_by_version_and_labelled(tmp_path):
    for second in range(2):
        write_run(tmp_path, second, {"this-project": [100.0]}, engine=None)
    write_run(tmp_path, 2, {"this-project": [100.0]})
    groups = figures.group(results.load_dir(tmp_path))
    assert sorted((g.engine is None, len(g.runs)) for g in groups) == [(False, 1), (True, 2)]
    assert "| not recorded (grouped by version) |" in figures.docs_block(groups)


def test_only_durable_runs_make_the_headline(tmp_path):
    # More non-durable runs, and newer ones, never outrank three durable ones.
    for second in range(3):
        write_run(tmp_path, second, {"this-project": [100.0]})
    for second in range(3, 7):
        write_run(tmp_path, second, {"this-project": [900.0]}, durability=FAST)
    groups = figures.group(results.load_dir(tmp_path))
    assert {(g.durable, len(g.runs)) for g in groups} == {(True, 3), (False, 4)}
    chosen, note = figures.choose(groups)
    assert chosen.durable and "durable full runs" in note
    assert figures.cells(chosen, CONVERGE)[0]["this-project"].median == 100.0


def test_a_run_without_the_durability_record_is_an_old_non_durable_run(tmp_path):
    for second in range(3):
        write_run(tmp_path, second, {"this-project": [100.0]}, engine=None, durability=None)
    (run,) = results.load_dir(tmp_path)[:1]
    assert run.durable is False
    groups = figures.group(results.load_dir(tmp_path))
    chosen, note = figures.choose(groups)
    assert "No durable full run yet: not a headline" in note
    block = figures.docs_block(groups)
    assert "| not recorded: the test stack's, fsync off |" in block


def scaled(impl: str, n: int, cpu_seconds: float, pss_kb: float, rep: int = 0) -> dict:
    return {"impl": impl, "rep": rep, "ok": True, "n": n, "objects_per_second": n / 10,
            "cpu_seconds": {"whole footprint": cpu_seconds},
            "footprint_memory_after": {"pss_kb": pss_kb},
            "storage": {"postgres_tables_bytes": {"a": 1000 * n, "b": 24 * n}}}


def test_the_slope_is_fitted_over_the_sizes_of_each_run(tmp_path):
    # CPU: 1 s + 2 ms per object; PSS: 200 MiB + 10 KiB per object.
    runs = [scaled("this-project", n, 1 + 0.002 * n, 200 * 1024 + 10 * n)
            for n in (1000, 10_000)]
    runs += [scaled("kopf", n, 0.001 * n, 50 * 1024 + 20 * n) for n in (1000, 10_000)]
    meta = {"run_id": "2030-01-01T000000Z", "started_at": "2030-01-01 00:00 UTC",
            "plan": {"mode": "full", "n": 1000, "sizes": [1000, 10_000]},
            "project": {"version": "1.0.0", "engine": ENGINE}, "durability": DURABLE}
    results.write({"converge": runs}, meta, tmp_path)
    (run,) = results.load_dir(tmp_path)
    by_label = {f.label: f for f in figures.FIGURES}
    cpu = by_label["slope: CPU to converge one more object, whole footprint"]
    pss = by_label["slope: PSS per cached object, whole footprint"]
    tables = by_label["slope: PostgreSQL tables and indexes per object"]
    projected = by_label["PSS after converging N=100,000, whole footprint, fitted"]
    assert figures.per_run(run, cpu, "this-project") == pytest.approx(2.0)  # ms per object
    assert figures.per_run(run, pss, "this-project") == pytest.approx(10 * 1024)
    assert figures.per_run(run, tables, "this-project") == pytest.approx(1024)
    assert figures.per_run(run, projected, "this-project") == pytest.approx(
        200 + 100_000 * 10 / 1024)
    assert figures.per_run_ratio(run, pss, "kopf") == pytest.approx(0.5)
    # A figure at the run's own N reads only that size's repetitions.
    assert figures.per_run(run, CONVERGE, "this-project") == 100.0
    at_scale = by_label["converge N=10,000"]
    assert figures.per_run(run, at_scale, "this-project") == 1000.0


def test_one_size_gives_no_slope():
    assert figures.fit([(1000, 5.0), (1000, 6.0)]) is None
    assert figures.fit([(1000, 1.0), (3000, 5.0)]) == pytest.approx((0.002, -1.0))


def test_quick_runs_and_experiments_never_count_toward_the_headline(tmp_path):
    for second in range(2):
        write_run(tmp_path, second, {"this-project": [100.0]})
    write_run(tmp_path, 2, {"this-project": [900.0]}, mode="quick")
    write_run(tmp_path, 3, {"this-project": [900.0]},
              environment={"BENCH_EXPERIMENT_METRICS_OFF": "1"})
    write_run(tmp_path, 4, {"this-project": [900.0]}, pool="prefork", concurrency=4)
    write_run(tmp_path, 5, {"this-project": [900.0]}, n=5000, reps=3)
    groups = figures.group(results.load_dir(tmp_path))
    assert {(g.mode, g.configuration, len(g.runs)) for g in groups} == {
        ("full", "default", 2), ("quick", "default", 1),
        ("full", "BENCH_EXPERIMENT_METRICS_OFF=1", 1),
        ("full", "pool=prefork, concurrency=4", 1), ("full", "n=5000", 1)}
    chosen, note = figures.choose(groups)
    assert (chosen.mode, len(chosen.runs)) == ("full", 2)
    assert figures.cells(chosen, CONVERGE)[0]["this-project"].median == 100.0


def test_fewer_than_three_full_runs_are_shown_labelled_as_such(tmp_path):
    write_run(tmp_path, 0, {"this-project": [100.0]})
    write_run(tmp_path, 1, {"this-project": [200.0]})
    groups = figures.group(results.load_dir(tmp_path))
    block = figures.docs_block(groups)
    assert "Fewer than three durable full runs" in block
    assert "has 2" in block
    assert "| converge (obj/s) | 150 (100-200)" in block


def test_a_figure_missing_from_some_runs_says_over_how_many(tmp_path):
    write_run(tmp_path, 0, {"this-project": [100.0], "kopf": [50.0]})
    write_run(tmp_path, 1, {"this-project": [100.0]})
    write_run(tmp_path, 2, {"this-project": [100.0]})
    chosen, _ = headline(tmp_path)
    assert "50.0 [1 of 3 runs]" in figures.table(chosen, [CONVERGE])


def test_no_results_of_the_fair_bench_says_so(tmp_path):
    assert "No results of the fair bench yet" in figures.docs_block([])


def test_there_is_no_way_to_name_a_run(tmp_path):
    write_run(tmp_path, 0, {"this-project": [100.0]})
    (path,) = tmp_path.glob("*.json")
    with pytest.raises(SystemExit):
        figures.main([str(path)])


def test_only_the_generated_block_is_rewritten(tmp_path):
    docs = tmp_path / "benchmarks.md"
    before = "# Title\n\ntext\n\n<!-- figures:begin -->\nold 347 obj/s\n<!-- figures:end -->\n\nrest\n"
    docs.write_text(before)
    out = tmp_path / "results"
    for second in range(3):
        write_run(out, second, {"this-project": [100.0]})
    figures.main(["--results", str(out), "--docs", str(docs)])
    text = docs.read_text()
    assert text.startswith("# Title\n\ntext\n\n<!-- figures:begin -->\n")
    assert text.endswith("<!-- figures:end -->\n\nrest\n")
    assert "old 347" not in text and "| converge (obj/s) | 100 |" in text


def test_a_file_without_the_block_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="figures:begin"):
        figures.replace_block("no block here\n", "x", "benchmarks.md")


def test_the_figures_go_to_the_benchmarks_doc_only():
    """One generated block, in the benchmarks doc: the README and every other doc link it."""
    with pytest.raises(SystemExit):  # no --readme any more
        figures.main(["--readme", "README.md"])
    text = (figures.REPO / "docs" / "contributing" / "benchmarks.md").read_text()
    assert text.count(figures.BEGIN) == 1 and text.count(figures.END) == 1
    assert figures.BEGIN not in (figures.REPO / "README.md").read_text()


def test_every_target_reads_a_figure_the_headline_has():
    for target in targets.TARGETS:
        assert target.figure in figures.FIGURE_BY_LABEL, target
        assert target.over is None or target.over in figures.FIGURE_BY_LABEL, target


@pytest.mark.parametrize("rate, verdict", [(270.0, "yes"), (250.0, "**no**")])
def test_a_target_is_met_or_missed_by_the_median_of_the_runs_ratios(tmp_path, rate, verdict):
    """Converge vs kopf must reach 1.3x: with kopf at 200 obj/s, 270 (1.35x) meets it and 250
    (1.25x) misses it - the verdict is computed from the runs, the median of per-run ratios."""
    for second in range(3):
        write_run(tmp_path, second, {"this-project": [rate], "kopf": [200.0]})
    chosen, _ = headline(tmp_path)
    row = next(line for line in figures.targets_table(chosen).splitlines()
               if line.startswith("| converge vs kopf |"))
    assert row.split(" | ")[1:] == [">= 1.3x", f"{rate / 200:.2f}x", f"{verdict} |"]


def test_a_ratio_just_short_of_its_target_never_reads_as_on_it(tmp_path):
    for second in range(3):
        write_run(tmp_path, second, {"this-project": [259.4], "kopf": [200.0]})  # 1.297x
    chosen, _ = headline(tmp_path)
    row = next(line for line in figures.targets_table(chosen).splitlines()
               if line.startswith("| converge vs kopf |"))
    assert "| 1.297x | **no** |" in row


def test_a_targets_ratio_to_another_size_is_taken_within_each_run(tmp_path):
    """Throughput at N=10,000 over N=1,000: each run's own pair, then the median."""
    for second, (small, large) in enumerate([(300.0, 240.0), (200.0, 190.0), (250.0, 230.0)]):
        runs = [{"impl": "this-project", "rep": 0, "ok": True, "n": 1000,
                 "objects_per_second": small},
                {"impl": "this-project", "rep": 0, "ok": True, "n": 10_000,
                 "objects_per_second": large}]
        meta = {"run_id": f"2030-01-01T0000{second:02d}Z",
                "started_at": f"2030-01-01 00:{second:02d} UTC",
                "plan": {"mode": "full", "n": 1000, "sizes": [1000, 10_000]},
                "project": {"version": "1.0.0", "engine": ENGINE, "commit": "c" * 40,
                            "uncommitted": []},
                "arguments": [], "environment": {}, "durability": DURABLE}
        results.write({"converge": runs}, meta, tmp_path)
    chosen, _ = headline(tmp_path)
    target = next(t for t in targets.TARGETS if t.over)
    cell = figures.target_cell(chosen, target)
    assert (cell.median, cell.low, cell.high) == (0.92, 0.8, 0.95)


def test_a_value_just_past_its_target_never_reads_as_on_it(tmp_path):
    """A p50 of 5.004 ms against <= 5 ms would show as 5 (three significant digits)."""
    target = targets.Target("100 updates/s: event -> reconcile start p50", 5, False)
    assert figures._against(target, figures.Cell(5.004, 5.001, 5.2, 3), 3) \
        == "5.004 (5.001-5.200)"
    assert figures._against(target, figures.Cell(4.2, 4.0, 5.2, 3), 3) == "4.2 (4-5.2)"
