"""The chaos soak, short: every kind of fault at least once against the whole operator, then
the independent checker. ``make soak`` runs the long one (docs/reliability.md)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import REPO
from soak import check

pytestmark = pytest.mark.e2e


def test_the_checker_sees_overlapping_runs_in_the_side_channel(tmp_path):
    trace = tmp_path / "trace.log"
    trace.write_text("start k a 10.0\nwrite k a 11.0\nstart k b 10.5\nwrite k b 10.6\n"
                     "start j c 10.0\nwrite j c 11.0\nstart j d 11.5\nwrite j d 12.0\n"
                     "start j e 20.0\nwrite j e")  # a line torn by kill -9
    runs, overlaps = check.side_channel_overlaps(trace)
    assert runs == 5
    assert len(overlaps) == 1 and overlaps[0].startswith("k: runs a")


def test_a_run_stopped_past_its_lease_that_writes_nothing_after_is_no_overlap(tmp_path):
    trace = tmp_path / "trace.log"
    # Run a starts, writes, is stopped; b runs meanwhile; a resumes but is fenced: no write.
    trace.write_text("start k a 1.0\nwrite k a 1.5\nstart k b 9.0\nwrite k b 9.5\n")
    assert check.side_channel_overlaps(trace)[1] == []


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_a_short_soak_keeps_every_promise(stack, tmp_path, pool):
    """Both pools: prefork children run a message's keys one by one; the thread pool's run
    threads hand each ending run the next waiting key (``runpool.take_next``)."""
    from django.db import connections

    connections.close_all()  # the soak restarts PostgreSQL under this process
    report = tmp_path / "soak.json"
    result = subprocess.run(
        [sys.executable, "-m", "soak", "--minutes", "1.5", "--objects", "90", "--seed", "7",
         "--each-fault", "--settle", "180", "--pool", pool, "--work", str(tmp_path / "work"),
         "--report", str(report)],
        cwd=REPO, capture_output=True, text=True, timeout=900)
    assert report.exists(), result.stdout[-3000:] + result.stderr[-3000:]
    figures = json.loads(report.read_text())
    assert figures["checks"] and all(figures["checks"].values()), json.dumps(figures, indent=2)
    assert result.returncode == 0
    assert figures["overlaps"] == 0
    kinds = set(figures["faults"])
    for fault in ("worker killed (-9)", "watcher killed (-9)", "PostgreSQL restarted",
                  "Redis restarted (empty)", "api-server restarted (every watch dropped)",
                  "worker stopped past its lease (SIGSTOP)"):
        assert fault in kinds, kinds
