"""The soak's report (``soak.report``), on synthetic input: a process exit explained only by its
log, and the measured section of the reliability doc written from a report, saying what was
not checked."""

from __future__ import annotations

import json

from soak import report


def test_a_process_exit_is_explained_only_by_what_its_log_says(tmp_path):
    log = tmp_path / "worker0.log"
    log.write_text("... CRITICAL x: 3 abandoned run threads still stuck (more than 2): "
                   "draining worker process 42 and exiting\n")
    assert "abandoned" in report.explain_exit(70, log)
    log.write_text("ValueError: something nobody expected\n")
    assert report.explain_exit(1, log) is None


def test_the_measured_section_is_written_from_the_report_and_says_what_was_not_checked(tmp_path):
    doc = tmp_path / "reliability.md"
    doc.write_text(f"# title\n\n{report.BEGIN}\nold figures\n{report.END}\n\n## after\n")
    result = {
        "passed": False, "minutes": 1.5, "objects": 60, "seed": 7, "pool": "threads",
        "fault mode": "proxy", "seconds": 300, "changes": 40, "namespaces": 3,
        "faults": {"Redis through the proxy: black hole": 2, "worker killed (-9)": 1},
        "audit log": {"ran": False, "why not": "the running kube-apiserver has no audit log"},
        "audit overlaps": None, "changes lost": None, "unconverged": [], "runs recorded": 10,
        "runs in the side channel": 9, "overlaps": 0, "history overlaps": 0,
        "faults injected": 3, "silent faults": ["worker killed (-9) at 05:00:01"],
        "runs lost to killed workers (recorded by the reaper)": 0, "max broker backlog": 5,
        "settled in (s)": 3.0, "process exits": [], "lost": 0,
        "checks": {"converged": True, "no two runs of one key overlapped (audit log: "
                   "begin-to-end spans)": None},
        "secondary checks": {"no overlapping runs in the history": True}}
    report.write_docs(result, doc)
    text = doc.read_text()
    assert "old figures" not in text and text.endswith("## after\n")
    assert "| Redis through the proxy: black hole | 2 |" in text
    assert "not checked: the running kube-apiserver has no audit log" in text
    assert "**not run**: no two runs of one key overlapped (audit log" in text
    assert "| faults with no effect seen (silent) | **1** of 3 |" in text
    assert "- worker killed (-9) at 05:00:01" in text
    assert "passed: no overlapping runs in the history (secondary" in text
    assert json.loads((tmp_path / "soak-report.json").read_text())["seed"] == 7
