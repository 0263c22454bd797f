"""The benchmark harness cannot silently rot: its this-project implementation, end to end.

Runs ``bench``'s converge scenario for this project on a tiny workload (N=20) against the real
stack - watcher, a Celery worker and beat as real processes, the observer watch, the Go loader -
and checks the correctness verdict and the shape of the result the report is built from.

The bench uses a database and Redis db of its own, derived from this test run's settings
(``<DATABASE_URL's database>_bench`` and ``REDIS_URL``'s db), so concurrent test runs with
private ``DATABASE_URL``/``REDIS_URL`` never collide. The Go loader is built on first use
(cached outside the repo), which can take minutes on a cold Go module cache.
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

CONVERGE_KEYS = {
    "impl", "n", "rep", "ok", "check", "loader", "reconciles", "cpu_seconds", "wall_seconds",
    "api_requests", "api_writes", "impl_writes", "writes_per_object", "cpu_ms_per_object",
    "operator_rss_peak_kb", "operator_memory_after", "converge_seconds", "objects_per_second",
    "footprint_rss_peak_kb", "footprint_memory_after", "storage", "steady",
}


@pytest.fixture
def bench_runner(stack, tmp_path):
    from django.conf import settings

    from bench import config
    from bench.harness import Plan, Runner

    db = settings.DATABASES["default"]
    database_url = (f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/"
                    f"{db['NAME']}_bench")
    cfg = config.load(work_dir=tmp_path / "bench", database_url=database_url,
                      redis_url=settings.REDIS_URL)
    plan = Plan.quick(n=20, sizes=[20], scenarios=["converge"], impls=["this-project"])
    runner = Runner(plan, cfg, log=lambda *_: None)
    runner.prepare()
    return runner


def test_this_project_converges_and_reports_every_figure(bench_runner, tmp_path):
    from bench import report, results

    measured = bench_runner.run()
    (run,) = measured["converge"]
    assert run.get("ok"), run.get("error") or run.get("check")
    assert run["check"] == {"ok": True, "objects": 21, "expected": 21, "wrong": [],
                            "wrong_count": 0}  # 20 items + the canary
    assert CONVERGE_KEYS <= set(run), CONVERGE_KEYS - set(run)
    assert run["reconciles"] >= 20
    assert run["api_requests"].get("PATCH/status", 0) >= 20
    assert run["objects_per_second"] > 0
    assert run["cpu_ms_per_object"]["operator"] > 0
    # The whole footprint: the operator's processes plus all of PostgreSQL and Redis.
    cpu = run["cpu_ms_per_object"]
    assert cpu["whole footprint"] >= cpu["operator"]
    memory, footprint = run["operator_memory_after"], run["footprint_memory_after"]
    assert footprint["processes"] > memory["processes"]
    assert footprint["pss_kb"] > memory["pss_kb"] > 0
    assert run["footprint_rss_peak_kb"] >= run["operator_rss_peak_kb"] > 0
    # The ledger's tables hold the run's work; the steady updates among the 20 objects were
    # each reconciled and converged.
    assert sum(run["storage"]["postgres_tables_bytes"].values()) > 0
    assert run["steady"]["complete"] and run["steady"]["updates"] == 500
    assert run["steady"]["start_samples"] > 0

    meta = {"command": "test", "started_at": "now", "run_id": "2000-01-01T000000Z",
            "elapsed_seconds": 1.0,
            "plan": bench_runner.plan.as_dict(), "machine": {"cpus": 2, "cpu_model": "x",
                                                             "memory_gib": 1,
                                                             "loadavg_at_start": [0, 0, 0]},
            "implementations": bench_runner.describe()}
    (path,) = results.write(measured, meta, tmp_path / "results")
    assert path.name == "2000-01-01T000000Z-quick-converge.json"
    summary = report.summarize("converge", measured["converge"])
    assert summary["this-project"]["passed"] == 1
    assert "objects/s" in summary["this-project"]["figures"]
    assert "whole footprint CPU per object" in summary["this-project"]["figures"]
    assert "| objects/s (obj/s) |" in report.markdown(measured, meta)


def test_benchitems_outside_bench_namespaces_stop_the_harness(stack, tmp_path):
    """A BenchItem left in a namespace of its own (an experiment's) would be reconciled inside
    every later measurement of the operators that watch all namespaces: the harness refuses
    to start rather than report inflated figures."""
    import uuid

    from bench import config, workload
    from bench.harness import Plan, Runner
    from bench.kube import Kube

    cfg = config.load(work_dir=tmp_path / "bench")
    kube = Kube.from_config(cfg)
    workload.ensure_crd(kube)
    namespace = f"stray-{uuid.uuid4().hex[:6]}"
    kube.request("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
    try:
        workload.create(kube, namespace, "left-behind", 1)
        assert workload.foreign_items(kube).get(namespace) == 1
        runner = Runner(Plan.quick(n=1, scenarios=["converge"], impls=["this-project"]), cfg,
                        log=lambda *_: None)
        with pytest.raises(SystemExit, match=f"{namespace} \\(1\\)"):
            runner.prepare()
    finally:
        workload.delete_namespaces(kube, [namespace])
    assert namespace not in workload.foreign_items(kube)


@pytest.mark.timeout(60)
def test_measured_sources_are_loaded_from_current_bytecode(tmp_path):
    """Each implementation is measured as deployed, from compiled modules (the image runs
    ``compileall``): under ``PYTHONDONTWRITEBYTECODE`` an edited module would otherwise be
    compiled again at every process start, inside the timed restart."""
    import os
    import subprocess
    import sys
    import time

    from bench.impls.base import compile_bytecode

    pkg = tmp_path / "measured"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    module = pkg / "mod.py"
    module.write_text("VALUE = 1\n")
    compile_bytecode(pkg)
    time.sleep(1.1)  # a pyc records its source's mtime in whole seconds
    module.write_text("VALUE = 22\n")

    def start() -> list[str]:
        """A new process imports the module: its value, and how many sources it compiled."""
        probe = ("import importlib._bootstrap_external as e; compiled = []; "
                 "orig = e.SourceLoader.source_to_code; "
                 "e.SourceLoader.source_to_code = lambda self, data, path, **kw: "
                 "(compiled.append(path), orig(self, data, path, **kw))[1]; "
                 "import measured.mod as m; print(m.VALUE, len(compiled))")
        env = {**os.environ, "PYTHONPATH": str(tmp_path), "PYTHONDONTWRITEBYTECODE": "1"}
        return subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                              text=True, check=True).stdout.split()

    assert start() == ["22", "1"]  # stale bytecode: compiled at start, every start
    assert start() == ["22", "1"]
    compile_bytecode(pkg)
    assert start() == ["22", "0"]

    (pkg / "broken.py").write_text("def (:\n")
    with pytest.raises(RuntimeError, match="could not compile"):
        compile_bytecode(pkg)
