"""Where metric values live, and turning them off (each case a fresh Python program)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.helpers import REPO

SCRIPT = """
import os, sys
from reconcilers._base import metrics
metrics.observe_run("things.example.com", "permanent", 0.02, retry=False)
body = metrics.exposition()[0].decode()
print(metrics.DIRECTORY)
print('controller_runtime_reconcile_total{controller="things.example.com",result="error"} 1.0'
      in body, len(body))
if len(sys.argv) > 1:  # start another program, as a launcher would
    import subprocess
    print(subprocess.run([sys.executable, "-c", sys.argv[1]], capture_output=True,
                         text=True, check=True).stdout.strip())
"""


def _run(env: dict, *args: str) -> list[str]:
    result = subprocess.run([sys.executable, "-c", SCRIPT, *args], cwd=REPO, text=True,
                            capture_output=True, timeout=60, env={**os.environ, **env})
    assert result.returncode == 0, result.stderr
    return result.stdout.split("\n")


def test_a_program_counts_into_a_directory_of_its_own_and_removes_it_at_exit():
    child = "from reconcilers._base import metrics; print(metrics.DIRECTORY)"
    env = {k: v for k, v in os.environ.items() if "METRICS" not in k and "MULTIPROC" not in k}
    directory, counted, child_directory, _ = _run(env, child)
    assert counted.startswith("True")
    # A program it starts is another program: its own directory, not a share of this one's.
    assert child_directory != directory
    assert not os.path.exists(directory) and not os.path.exists(child_directory)


def test_a_deployers_directory_is_shared_and_kept(tmp_path):
    shared = tmp_path / "metrics"
    env = {"PROMETHEUS_MULTIPROC_DIR": str(shared), "OPERATOR_METRICS_MADE_DIR": ""}
    child = "from reconcilers._base import metrics; print(metrics.DIRECTORY)"
    directory, counted, child_directory, _ = _run(env, child)
    assert directory == child_directory == str(shared) and counted.startswith("True")
    assert any(p.name.startswith("counter_") for p in shared.iterdir())


def test_metrics_can_be_turned_off():
    directory, counted, _ = _run({"OPERATOR_METRICS": "0"})
    assert directory == "" and counted == "False 0"


FRESH = """
import json
from prometheus_client.parser import text_string_to_metric_families
from reconcilers._base import metrics
metrics.initialise(["a.example.com", "b.example.com"])
metrics.observe_run("b.example.com", "gone", 0.01, retry=False)
metrics.observe_run("b.example.com", "skipped", 0.01, retry=False)
metrics.observe_run("b.example.com", "permanent", 0.01, retry=False)
metrics.initialise_webhook("/validate-x")
depth = metrics.Computed(lambda: [("workqueue_depth", "", ["name"], [(("b.example.com",), 2)])])
body = metrics.exposition([depth])[0].decode()
print(json.dumps([[s.name, s.labels, s.value] for f in text_string_to_metric_families(body)
                  for s in f.samples]))
"""


def _fresh_samples() -> dict[tuple[str, frozenset], float]:
    result = subprocess.run([sys.executable, "-c", FRESH], cwd=REPO, text=True,
                            capture_output=True, timeout=60)
    assert result.returncode == 0, result.stderr
    import json

    return {(name, frozenset(labels.items())): value
            for name, labels, value in json.loads(result.stdout)}


def test_every_series_of_a_reconciler_exists_at_zero_before_its_first_run():
    samples = _fresh_samples()
    a = "a.example.com"
    for result in ("success", "error", "requeue", "requeue_after"):
        assert samples[("controller_runtime_reconcile_total",
                        frozenset({"controller": a, "result": result}.items()))] == 0
    for family in ("controller_runtime_reconcile_errors_total",
                   "controller_runtime_terminal_reconcile_errors_total",
                   "controller_runtime_reconcile_panics_total",
                   "controller_runtime_reconcile_time_seconds_count"):
        assert samples[(family, frozenset({"controller": a}.items()))] == 0, family
    for family in ("workqueue_adds_total", "workqueue_retries_total",
                   "workqueue_queue_duration_seconds_count",
                   "workqueue_work_duration_seconds_count", "workqueue_depth"):
        assert samples[(family, frozenset({"name": a}.items()))] == 0, family
    # A gauge computed at scrape time keeps what it found, and is completed with zeros.
    assert samples[("workqueue_depth", frozenset({"name": "b.example.com"}.items()))] == 2


def test_results_carry_controller_runtimes_label_values():
    samples = _fresh_samples()
    b = "b.example.com"
    results = {dict(labels)["result"]: value for (name, labels), value in samples.items()
               if name == "controller_runtime_reconcile_total"
               and dict(labels)["controller"] == b}
    # Gone and skipped (deleted without our finalizer) are what a Go reconciler returns then.
    assert results == {"success": 2, "error": 1, "requeue": 0, "requeue_after": 0}
    assert samples[("controller_runtime_terminal_reconcile_errors_total",
                    frozenset({"controller": b}.items()))] == 1


def test_a_scrape_carries_the_serving_process_figures():
    """prometheus_client's multiprocess mode leaves its process and platform collectors out;
    kubebuilder's resources dashboard reads process_cpu_seconds_total and
    process_resident_memory_bytes."""
    names = {name for name, _ in _fresh_samples()}
    assert {"process_cpu_seconds_total", "process_resident_memory_bytes",
            "process_open_fds", "process_start_time_seconds", "python_info"} <= names


def test_a_webhook_path_starts_with_controller_runtimes_series():
    samples = _fresh_samples()
    hook = {"webhook": "/validate-x"}
    for code in ("200", "500"):
        assert samples[("controller_runtime_webhook_requests_total",
                        frozenset({**hook, "code": code}.items()))] == 0
    assert samples[("controller_runtime_webhook_latency_seconds_count",
                    frozenset(hook.items()))] == 0
    assert samples[("controller_runtime_webhook_requests_in_flight",
                    frozenset(hook.items()))] == 0


def test_a_projects_own_figures_count_where_the_operators_do():
    """A project's reconcilers declare figures of their own with ``prometheus_client``
    (``tests/operatorapp``), imported while the app is set up; ``prometheus_client`` picks
    multiprocess files at its first import, so the directory must be settled before then, or
    a prefork worker's runs would count where no scrape looks."""
    script = ("import django; django.setup()\n"
              "from prometheus_client import values\n"
              "print(values.ValueClass.__name__)\n")
    env = {k: v for k, v in os.environ.items() if "METRICS" not in k and "MULTIPROC" not in k}
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, text=True,
                            capture_output=True, timeout=60,
                            env={**env, "DJANGO_SETTINGS_MODULE": "tests.settings"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["MmapedValue"]
