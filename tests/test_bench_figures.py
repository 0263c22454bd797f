"""The headline figures: the median over every full run of one version, never a chosen run.

Pure logic on results files written to a temporary directory; no service is needed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import figures, results

CONVERGE = figures.FIGURES[0]


def converge(impl: str, rate: float, rep: int = 0, ok: bool = True) -> dict:
    return {"impl": impl, "rep": rep, "ok": ok, "objects_per_second": rate}


def write_run(out: Path, second: int, rates: dict[str, list[float]], version: str = "1.0.0",
              mode: str = "full", environment: dict | None = None, **plan) -> None:
    """One harness run's converge file: ``rates`` maps an implementation to one objects/s
    value per repetition."""
    runs = [converge(impl, rate, rep) for impl, reps in rates.items()
            for rep, rate in enumerate(reps)]
    meta = {"run_id": f"2030-01-01T0000{second:02d}Z",
            "started_at": f"2030-01-01 00:{second:02d} UTC",
            "plan": {"mode": "full-large" if mode == "large" else mode, **plan},
            "project": {"version": version, "commit": f"{second:040d}", "uncommitted": []},
            "arguments": [], "environment": environment or {}}
    results.write({"converge": runs}, meta, out)


def headline(out: Path) -> tuple[figures.Group | None, str]:
    return figures.choose(figures.group(results.load_dir(out)))


def test_the_headline_is_the_median_over_every_full_run_not_the_best_one(tmp_path):
    for second, rate in enumerate([300.0, 100.0, 200.0]):
        write_run(tmp_path, second, {"this-project": [rate], "kopf": [100.0]})
    chosen, note = headline(tmp_path)
    values, ratios = figures.cells(chosen, CONVERGE)
    assert len(chosen.runs) == 3 and "median of its 3 full runs" in note
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
    assert "0.11.0 (1)" in note


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
    assert "Fewer than three full runs" in block
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
