"""The chaos soak, short: every kind of fault at least once against the whole operator, then
the independent checker. ``make soak`` runs the long one (docs/contributing/reliability.md);
the checker's parts, on synthetic input, are tested beside the soak (``soak/tests/``)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from tests.fixtures import ARTIFACTS
from tests.helpers import REPO

pytestmark = pytest.mark.e2e


# Every fault kind at least once, then up to three minutes to settle: past the suite's
# default 300 s a timed-out soak would leave its operator's processes running under the next.
@pytest.mark.timeout(1000)
@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_a_short_soak_keeps_every_promise(stack, pool):
    """Both pools: prefork children run a message's keys one by one; the thread pool's run
    threads' loop ends each run and claims the next waiting key in one statement
    (``runner.work``)."""
    from django.db import connections

    connections.close_all()  # the soak restarts PostgreSQL under this process
    # Its logs, trace and (when a check fails) every process's stacks are kept beside the
    # other tests' logs: pytest keeps only its last few temporary directories.
    work = ARTIFACTS / f"soak-{pool}"
    shutil.rmtree(work, ignore_errors=True)
    report = work / "soak.json"
    result = subprocess.run(
        [sys.executable, "-m", "soak", "--minutes", "1.5", "--objects", "90", "--seed", "7",
         "--each-fault", "--settle", "180", "--pool", pool, "--work", str(work / "work"),
         "--report", str(report)],
        cwd=REPO, capture_output=True, text=True, timeout=900)
    assert report.exists(), result.stdout[-3000:] + result.stderr[-3000:]
    figures = json.loads(report.read_text())
    assert figures["checks"] and all(v is True for v in [
        *figures["checks"].values(), *figures["secondary checks"].values()]), (
        json.dumps(figures, indent=2) + f"\nlogs (and stacks) in {work / 'work' / 'logs'}")
    assert result.returncode == 0
    assert figures["overlaps"] == 0 and figures["history overlaps"] == 0
    assert figures["audit log"]["ran"], figures["audit log"]  # a fresh stack keeps one
    assert figures["audit overlaps"] == 0 and figures["lost"] == 0
    assert figures["changes lost"] == 0 and figures["silent faults"] == []
    # Every run wrote a begin and an end: the audit log can show two runs at once.
    assert figures["audit log"]["runs with a begin and an end"] > 0
    kinds = set(figures["faults"])
    for fault in ("worker killed (-9)", "watcher killed (-9)", "PostgreSQL restarted",
                  "Redis restarted (empty)", "api-server restarted (every watch dropped)",
                  "worker stopped past its lease (SIGSTOP)",
                  *[f"{service} through the proxy: {fault}"
                    for service in ("PostgreSQL", "Redis", "api-server")
                    for fault in ("latency", "black hole", "reset", "data limit")],
                  "api-server answering 429 (APF, no seats)",
                  "api-server answering 500 (admission webhook unreachable)",
                  "leading watcher paused past its lease (SIGSTOP)",
                  "reconciles blocked in C past the hard limit",
                  "rolling upgrade (changed setting, every process restarted)",
                  "Redis restarted from a stale snapshot"):
        assert fault in kinds, kinds
