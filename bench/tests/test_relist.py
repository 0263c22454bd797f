"""The relist scenario's restart figure: the median of several restarts, none hidden."""

from __future__ import annotations

from bench.scenarios.relist import _median_of


def sample(resume, reconciles=0, cpu=0.5):
    return {"connections_dropped": None, "resume_seconds": resume, "reconciles": reconciles,
            "operator_cpu_seconds": cpu, "api_requests": {}}


def test_a_repetition_reports_the_median_restart_and_keeps_every_sample():
    out = _median_of([sample(0.71, cpu=0.7), sample(0.52, cpu=0.5), sample(0.64, cpu=0.6)])
    assert out["resume_seconds"] == 0.64
    assert out["operator_cpu_seconds"] == 0.6  # the median sample's own figures
    assert out["resume_samples"] == [0.71, 0.52, 0.64]


def test_reconciles_are_the_most_any_restart_caused():
    out = _median_of([sample(0.5), sample(0.6, reconciles=1000), sample(0.7)])
    assert out["reconciles"] == 1000


def test_a_restart_that_never_resumed_fails_the_repetition():
    out = _median_of([sample(0.5), sample(None), sample(0.7)])
    assert out["resume_seconds"] is None


def test_a_single_disruption_is_reported_as_measured():
    one = sample(0.15)
    assert _median_of([one]) == one


def test_paired_restarts_take_turns_at_going_first():
    from bench.scenarios.relist import alternate

    pairs = [alternate(["ours", "kopf"], turn) for turn in range(4)]
    assert pairs == [["ours", "kopf"], ["kopf", "ours"], ["ours", "kopf"], ["kopf", "ours"]]


def test_where_a_restart_spends_its_time_is_timed_from_the_watchers_own_lines(tmp_path):
    from bench.scenarios.relist import LogLines, phases

    log = tmp_path / "watcher.log"
    log.write_text("watching benchitems as old\nleading: starting streams (term 1)\n")
    lines = LogLines(log, ("watching ", "leading: starting streams"))
    lines.poll()  # the previous process's lines, before the restart, are not this start's
    assert lines.seen == {"watching ": None, "leading: starting streams": None}
    with open(log, "a") as f:
        f.write("watching benchitems as new\n")
    lines.poll()
    seen = lines.seen
    assert seen["watching "] is not None and seen["leading: starting streams"] is None
    out = phases(seen["watching "] - 0.5, seen, None, seen["watching "] + 0.25)
    assert out == {"line 'watching'": 0.5, "line 'leading: starting streams'": None,
                   "canary reconcile start": None, "canary converged": 0.75}
