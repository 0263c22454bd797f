"""The chaos soak, short: every kind of fault at least once against the whole operator, then
the independent checker; and the checker's parts (the audit log, the messages, the report)
on synthetic input. ``make soak`` runs the long one (docs/contributing/reliability.md)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from tests.fixtures import ARTIFACTS
from tests.helpers import REPO
from soak import audit, check, report

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


def _audit_line(name: str, agent: str, at: str, code: int = 200, verb: str = "patch",
                ns: str = "soak-1-0", resource: str = "configmaps", **extra) -> str:
    return json.dumps({
        "kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": "Metadata",
        "stage": "ResponseComplete", "verb": verb, "userAgent": agent,
        "objectRef": {"resource": resource, "namespace": ns, "name": name, **extra},
        "responseStatus": {"code": code}, "requestReceivedTimestamp": f"2026-12-06T05:00:{at}Z",
        "stageTimestamp": f"2026-12-06T05:00:{at}Z"})


def _run(identity: str) -> str:
    return f"django-crd-operator/0.9.0 (run {identity})"


def test_the_audit_checker_sees_two_runs_interleaving_writes_to_one_object():
    lines = [
        _audit_line("item-1-0", _run("5-a"), "01.000000", verb="create"),
        _audit_line("item-1-0", _run("6-b"), "01.500000"),  # b writes between a's writes
        _audit_line("item-1-0", _run("5-a"), "02.000000"),
        # one after the other on another object: no overlap
        _audit_line("item-2", _run("7-c"), "01.000000", resource="soakitems",
                    subresource="status"),
        _audit_line("item-2", _run("8-d"), "03.000000", resource="soakitems"),
        # refused writes change nothing; other namespaces are not this soak's
        _audit_line("item-2", _run("9-e"), "02.000000", code=409, resource="soakitems"),
        _audit_line("item-1-0", _run("5-x"), "01.700000", ns="other"),
        '{"torn line',
    ]
    found = list(audit.writes(lines, "soak-1-"))
    assert len(found) == 6
    overlaps = audit.overlaps(found)
    # A child's writes count for its SoakItem's key (``item-1-0`` is ``item-1``'s).
    assert len(overlaps) == 1 and overlaps[0].startswith("soak-1-0/item-1: runs 5-a")
    assert audit.summary(found)["writes refused (not 2xx)"] == 1


def test_writes_outside_a_run_are_named_but_kubectl_and_the_garbage_collector_may_write():
    found = list(audit.writes([
        _audit_line("item-1", "kubectl/v1.35.4 (linux/amd64) kubernetes/abc", "01.0"),
        _audit_line("item-1-0", "kube-controller-manager/v1.35.4 (linux/amd64) kubernetes/abc"
                    "/system:serviceaccount:kube-system:generic-garbage-collector", "02.0",
                    verb="delete"),
        _audit_line("item-1-1", "django-crd-operator/0.9.0", "03.0"),
    ], "soak-1-"))
    outside = audit.outside_runs(found)
    assert len(outside) == 1 and "item-1-1" in outside[0]


def test_the_audit_log_is_read_with_its_rotated_backups(tmp_path):
    log = tmp_path / "kube-apiserver-audit.log"
    (tmp_path / "kube-apiserver-audit-2026-12-06T05-00-00.000.log").write_text(
        _audit_line("item-1", _run("1-a"), "01.0") + "\n")
    log.write_text(_audit_line("item-1", _run("2-b"), "02.0") + "\n")
    assert [w.run for w in audit.read(log, "soak-1-")] == ["1-a", "2-b"]


def test_a_message_the_broker_never_delivered_is_lost_only_if_its_key_never_ran_after(tmp_path):
    messages, trace = tmp_path / "messages.log", tmp_path / "trace.log"
    messages.write_text(
        "publish t1 100.0 soakitem:ns/a\nreceive t1 100.2\n"  # delivered
        "publish t2 110.0 soakitem:ns/b soakitem:ns/c\n"  # lost by the broker: b ran after
        "publish t3 120.0 soakitem:ns/d\n"  # lost, and d never ran after: lost work
        "publish t4 130.0 soakitem:ns/gone\n"  # lost, but its object was deleted
        "publish t5 140.0 soakitem:ns/e\npublish t5 150.0 soakitem:ns/e\nreceive t5 150.1\n"
        "receive t5 150.2\npublish t6")  # torn
    trace.write_text("start soakitem:ns/b r1 111.0\nstart soakitem:ns/c r2 109.0\n"
                     "start soakitem:ns/d r3 100.0\nstart soakitem:ns/e r4 151.0\n")
    figures, undelivered = check.messages(messages)
    assert figures["messages published"] == 6
    assert sorted(t for t, _at, _keys in undelivered) == ["t2", "t3", "t4"]
    lost = check.lost_keys(undelivered, trace, {"ns/a", "ns/b", "ns/c", "ns/d", "ns/e"})
    assert len(lost) == 1 and lost[0].startswith("soakitem:ns/d")


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


def test_every_api_server_call_of_a_run_names_the_run():
    from reconcilers._kube import kube

    assert "(run" not in kube.user_agent()
    with kube.acting_for_run("12-abcdef01"):
        assert kube.user_agent().endswith("(run 12-abcdef01)")
        assert audit.RUN.search(kube.user_agent()).group(1) == "12-abcdef01"
    assert "(run" not in kube.user_agent()


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
