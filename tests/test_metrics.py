"""Where metric values live, and turning them off (each case a fresh Python program)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.helpers import REPO

SCRIPT = """
import os, sys
from reconcilers import metrics
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
    child = "from reconcilers import metrics; print(metrics.DIRECTORY)"
    env = {k: v for k, v in os.environ.items() if "METRICS" not in k and "MULTIPROC" not in k}
    directory, counted, child_directory, _ = _run(env, child)
    assert counted.startswith("True")
    # A program it starts is another program: its own directory, not a share of this one's.
    assert child_directory != directory
    assert not os.path.exists(directory) and not os.path.exists(child_directory)


def test_a_deployers_directory_is_shared_and_kept(tmp_path):
    shared = tmp_path / "metrics"
    env = {"PROMETHEUS_MULTIPROC_DIR": str(shared), "OPERATOR_METRICS_MADE_DIR": ""}
    child = "from reconcilers import metrics; print(metrics.DIRECTORY)"
    directory, counted, child_directory, _ = _run(env, child)
    assert directory == child_directory == str(shared) and counted.startswith("True")
    assert any(p.name.startswith("counter_") for p in shared.iterdir())


def test_metrics_can_be_turned_off():
    directory, counted, _ = _run({"OPERATOR_METRICS": "0"})
    assert directory == "" and counted == "False 0"
