"""Results files: every run kept as its own file, with what its figures depend on.

Pure logic on a temporary directory; no service is needed.
"""

from __future__ import annotations

import datetime as dt
import json

import pytest

from bench import results


def meta(run_id: str = "2030-01-01T000000Z", mode: str = "full", **extra) -> dict:
    return {"run_id": run_id, "started_at": "2030-01-01 00:00 UTC", "plan": {"mode": mode},
            "project": {"version": "1.0.0", "commit": "abc", "uncommitted": []}, **extra}


def test_a_run_is_named_by_its_utc_start_mode_and_scenario(tmp_path):
    started = dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)
    paths = results.write({"converge": [], "relist": []},
                          meta(results.run_id(started), "full-large"), tmp_path)
    assert [p.name for p in paths] == ["2030-01-02T030405Z-large-converge.json",
                                       "2030-01-02T030405Z-large-relist.json"]
    body = json.loads(paths[0].read_text())
    assert (body["format"], body["mode"], body["project"]["version"]) == (2, "large", "1.0.0")


def test_an_earlier_run_is_never_overwritten(tmp_path):
    results.write({"converge": []}, meta(), tmp_path)
    with pytest.raises(FileExistsError):
        results.write({"converge": []}, meta(), tmp_path)


def test_every_override_in_force_is_recorded_and_secrets_are_masked():
    env = {"BENCH_EXPERIMENT_METRICS_OFF": "1", "BENCH_EXPERIMENT_RECONCILERS_X": "2",
           "RECONCILERS_LEASE_SECONDS": "30", "CELERY_WORKER_PREFETCH_MULTIPLIER": "4",
           "GOMAXPROCS": "1", "BENCH_DATABASE_URL": "postgres://op:hunter2@127.0.0.1:5432/b",
           "BENCH_ADMIN_TOKEN": "t0ken", "HOME": "/root", "PATH": "/bin"}
    assert results.overrides(env) == {
        "BENCH_ADMIN_TOKEN": "***",
        "BENCH_DATABASE_URL": "postgres://op:***@127.0.0.1:5432/b",
        "BENCH_EXPERIMENT_METRICS_OFF": "1", "BENCH_EXPERIMENT_RECONCILERS_X": "2",
        "CELERY_WORKER_PREFETCH_MULTIPLIER": "4", "GOMAXPROCS": "1",
        "RECONCILERS_LEASE_SECONDS": "30"}


def test_the_files_of_one_run_are_read_back_as_one_run(tmp_path):
    results.write({"converge": [{"impl": "a"}], "latency": [{"impl": "b"}]},
                  meta(environment={"BENCH_EXPERIMENT_X": "1"}), tmp_path)
    results.write({"converge": []}, meta("2030-01-01T000100Z", "quick"), tmp_path)
    first, second = results.load_dir(tmp_path)
    assert set(first.scenarios) == {"converge", "latency"}
    assert (first.version, first.mode, first.environment) == ("1.0.0", "full",
                                                               {"BENCH_EXPERIMENT_X": "1"})
    assert second.mode == "quick"


def test_files_from_before_the_format_are_read_as_runs_of_no_version(tmp_path):
    old = {"scenario": "converge", "command": "python -m bench", "plan": {"mode": "full-large"},
           "started_at": "2026-12-04 12:45 UTC", "runs": [], "summary": {}}
    (tmp_path / "2026-12-04-large-converge.json").write_text(json.dumps(old))
    (tmp_path / "2026-12-04-large-relist.json").write_text(
        json.dumps({**old, "scenario": "relist"}))
    (run,) = results.load_dir(tmp_path)
    assert (run.version, run.mode, set(run.scenarios)) == (None, "large", {"converge", "relist"})


def test_the_project_version_and_commit_are_recorded():
    project = results.project()
    assert project["version"] and len(project["commit"]) == 40
    assert isinstance(project["uncommitted"], list)


def test_the_project_version_and_commit_are_recorded_with_the_engines_digest():
    project = results.project()
    assert project["engine"] == results.engine_digest() and len(project["engine"]) == 64


def test_the_engine_digest_follows_the_engines_source_and_nothing_else(tmp_path):
    engine = tmp_path / "reconcilers"
    (engine / "_watch").mkdir(parents=True)
    (engine / "_watch" / "lifecycle.py").write_text("A = 1\n")
    (tmp_path / "docs.md").write_text("text")
    before = results.engine_digest(tmp_path)
    (tmp_path / "docs.md").write_text("other text")  # not the engine
    (engine / "README.txt").write_text("not python")
    assert results.engine_digest(tmp_path) == before
    (engine / "_watch" / "lifecycle.py").write_text("A = 2\n")
    assert results.engine_digest(tmp_path) != before


def test_the_engine_digest_covers_the_settings_and_migrations_it_runs_with(tmp_path):
    """The project's settings (connection reuse, prefetch, pool sizes) and the ledger's
    migrations (its indexes) change what a run costs as much as the package's code does."""
    for part in ("reconcilers", "operator_project", "migrations"):
        (tmp_path / part).mkdir()
        (tmp_path / part / "m.py").write_text("A = 1\n")
    before = results.engine_digest(tmp_path)
    for part in ("operator_project", "migrations"):
        (tmp_path / part / "m.py").write_text("A = 2\n")
        assert results.engine_digest(tmp_path) != before, part
        before = results.engine_digest(tmp_path)


def test_each_file_records_the_servers_durability_and_load_reads_it(tmp_path):
    record = {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on",
              "server_version": "17.6", "port": 15434, "durable": True}
    results.write({"converge": []}, meta(durability=record), tmp_path)
    results.write({"converge": []}, meta("2030-01-01T000100Z"), tmp_path)  # before the record
    (path, _) = sorted(tmp_path.glob("*.json"))
    assert json.loads(path.read_text())["durability"] == record
    durable, old = results.load_dir(tmp_path)
    assert (durable.durable, durable.durability) == (True, record)
    assert (old.durable, old.durability) == (False, None)


def test_durable_means_every_setting_that_keeps_a_commit_through_a_crash():
    from bench.postgres import is_durable

    on = {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on"}
    assert is_durable(on)
    assert is_durable({**on, "synchronous_commit": "remote_apply"})
    for name in on:
        assert not is_durable({**on, name: "off"}), name
    assert not is_durable({})


def test_the_full_plan_measures_every_size_for_the_headlines_implementations():
    from bench.harness import Plan
    from bench.impls.base import Impl

    full, large = Plan.full(), Plan.full(large=True)
    assert (full.sizes, full.cost_sizes) == ([1000, 10_000], [0, 1000, 10_000])
    assert large.sizes == [1000, 10_000, 30_000]
    assert Plan.quick().sizes == [200, 400] and Plan.quick(n=50).cost_sizes == [0, 50, 100]
    ours, other = Impl(cfg=None, name="this-project"), Impl(cfg=None, name="cr-default")
    assert full.at(10_000, ours) and not full.at(10_000, other)
    assert full.at(1000, other) and full.at(0, other)
