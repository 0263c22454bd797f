"""The soak's independent checker: the operator's promises, read from the api-server, its
audit log, the messages counted at the broker and the reconciler's side channel - never from
the operator's own opinion.

The verdict rests on that independent evidence:

1. every live object converged to its last spec (status, observedGeneration, its children)
   and shows the note of the last rolling upgrade - after one last change to every live
   object, so a key the operator left stuck shows as an object that never took it;
2. every deleted object's children are gone;
3. no two runs of one key overlapped, in the api-server's audit log (``soak.audit``: each run
   writes a begin and an end, and no two runs' spans of one key meet) and in the side
   channel (the span from a run's start to its last write);
4. no change lost: every change the soak made that the audit log shows was followed by a run
   that saw it (its begin accepted after the change, conditional on the generation it read)
   and ended; and every key of a message the broker never delivered ran after it anyway, or
   its object is gone;
5. every fault had an effect the soak saw (``soak.faults``): a silent fault tested nothing;
6. the broker's backlog stayed bounded and ends empty; every process exit is explained.

The project's own tables are read too, as secondary evidence that can fail the run but never
pass it on their own: the ledger (no key left running, queued or in backoff: the operator's
memory of pending work, whose promise is about that memory itself) and the history (no two
records of one key overlap: the admin's account of the runs must agree with the audit log).
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from itertools import combinations
from pathlib import Path

from soak import audit, faults

READ_TIMEOUT = 30  # seconds for each read of the cluster: a stack coming back answers late


def _django():
    import django

    django.setup()


def cluster():
    """The official ``kubernetes`` client, from ``KUBECONFIG``: the checker reads the cluster
    through none of the operator's code, whose fault it would otherwise share."""
    from kubernetes import config

    return config.new_client_from_config(config_file=os.environ.get("KUBECONFIG"))


def _items(api, ns: str) -> list[dict]:
    from kubernetes import client

    return client.CustomObjectsApi(api).list_namespaced_custom_object(
        "soak.operator.local", "v1", ns, audit.ITEMS, _request_timeout=READ_TIMEOUT)["items"]


def _configmaps(api, ns: str) -> dict[str, dict]:
    from kubernetes import client

    found = client.CoreV1Api(api).list_namespaced_config_map(ns, _request_timeout=READ_TIMEOUT)
    return {cm["metadata"]["name"]: cm
            for cm in api.sanitize_for_serialization(found)["items"]}


def unconverged(soak, api) -> list[str]:
    problems = []
    for ns in soak.ns:
        cms = _configmaps(api, ns)
        for item in _items(api, ns):
            name, spec = item["metadata"]["name"], item["spec"]
            status = item.get("status") or {}
            if (status.get("value"), status.get("children"), status.get("observedGeneration")) \
                    != (spec["value"], spec["children"], item["metadata"]["generation"]):
                problems.append(f"{ns}/{name}: status {status} for spec {spec}")
                continue
            if status.get("note") != soak.note:
                problems.append(f"{ns}/{name}: note {status.get('note')!r}, not the last "
                                f"upgrade's {soak.note!r}")
                continue
            for i in range(4):
                cm = cms.get(f"{name}-{i}")
                if i < spec["children"] and ((cm or {}).get("data") or {}).get("value") != \
                        str(spec["value"]):
                    problems.append(f"{ns}/{name}-{i}: child missing or stale")
                elif i >= spec["children"] and cm is not None:
                    problems.append(f"{ns}/{name}-{i}: child not wanted but present")
        for dns, dname in soak.deleted:
            if dns == ns:
                left = [c for c in cms if c.startswith(f"{dname}-")]
                if left:
                    problems.append(f"{ns}/{dname} deleted but its children remain: {left}")
    return problems


def unsettled_keys() -> list[str]:
    from django.db import close_old_connections

    from reconcilers.models import WorkItem

    close_old_connections()
    return [f"{w.key_str} {w.state}" for w in WorkItem.objects.exclude(state="idle")]


def history_overlaps() -> list[str]:
    from reconcilers.models import ReconcileRecord

    runs = defaultdict(list)
    for r in ReconcileRecord.objects.exclude(error_class="WorkerLost").only(
            "namespace", "name", "started_at", "finished_at"):
        runs[(r.namespace, r.name)].append((r.started_at, r.finished_at))
    found = []
    for key, spans in runs.items():
        spans.sort()
        for (s1, e1), (s2, e2) in zip(spans, spans[1:]):
            if s2 < e1:
                found.append(f"{key}: {s1}-{e1} and {s2}-{e2}")
    return found


def side_channel_overlaps(trace_path) -> tuple[int, list[str]]:
    """Each run's active span is its start to its last write (stamped when it was sent);
    spans of one key must not meet."""
    spans: dict[str, dict[str, list[float]]] = defaultdict(dict)
    for line in trace_path.read_text().splitlines():
        try:
            kind, key, run, at = line.split()
        except ValueError:
            continue  # a line torn by a kill -9 mid-write
        span = spans[key].setdefault(run, [float(at), float(at)])
        if kind == "write":
            span[1] = max(span[1], float(at))
    found = []
    for key, runs in spans.items():
        for (r1, (s1, e1)), (r2, (s2, e2)) in combinations(runs.items(), 2):
            if s1 < e2 and s2 < e1:
                found.append(f"{key}: runs {r1} [{s1:.3f}, {e1:.3f}] and {r2} [{s2:.3f}, {e2:.3f}]")
    return sum(len(r) for r in spans.values()), found


def messages(path: Path) -> tuple[dict, list[tuple[str, float, list[str]]]]:
    """Messages published and received (``soak/soakapp/messages.py``), paired per task id in
    time order; returns the figures and the messages the broker never delivered."""
    published: dict[str, list[tuple[float, list[str]]]] = defaultdict(list)
    received: dict[str, list[float]] = defaultdict(list)
    for line in path.read_text().splitlines() if path.exists() else []:
        parts = line.split()
        try:
            if parts[0] == "publish":
                published[parts[1]].append((float(parts[2]), parts[3:]))
            elif parts[0] == "receive":
                received[parts[1]].append(float(parts[2]))
        except (IndexError, ValueError):
            continue  # a line torn by a kill -9
    undelivered = []
    for task_id, sends in published.items():
        sends.sort()
        # Each receipt accounts for the latest send before it; a redelivered message (a
        # stale snapshot, a restored one) is received more often than sent.
        pending = list(sends)
        for at in sorted(received.get(task_id, [])):
            before = [s for s in pending if s[0] <= at + 1]
            if before:
                pending.remove(before[-1])
        undelivered += [(task_id, at, keys) for at, keys in pending]
    figures = {"messages published": sum(len(v) for v in published.values()),
               "messages received by workers": sum(len(v) for v in received.values()),
               "messages the broker never delivered": len(undelivered)}
    return figures, undelivered


def lost_keys(undelivered, trace_path: Path, live: set[str], slack: float = 2.0) -> list[str]:
    """Keys of undelivered messages that never ran after the message was sent though their
    object still exists: work the operator lost. ``slack`` covers a run claimed from an
    earlier message in the instant before the reaper sent its key again."""
    starts: dict[str, list[float]] = defaultdict(list)
    for line in trace_path.read_text().splitlines() if trace_path.exists() else []:
        parts = line.split()
        if len(parts) == 4 and parts[0] == "start":
            try:
                starts[parts[1]].append(float(parts[3]))
            except ValueError:
                continue
    lost = []
    for task_id, at, keys in undelivered:
        for key in keys:
            if key.partition(":")[2] in live and not any(s >= at - slack for s in starts.get(key, [])):
                lost.append(f"{key}: in message {task_id} sent at {at:.3f}, never run after")
    return lost


def audit_figures(found: list) -> dict:
    """What the audit log's writes show (``soak.audit``)."""
    return {"ran": True, **audit.summary(found), "overlaps": audit.overlaps(found),
            "changes lost": audit.lost(found),
            "writes outside any run": audit.outside_runs(found),
            "writes answered 429": sum(w.code == 429 for w in found),
            "writes answered 5xx": sum(w.code >= 500 for w in found)}


def audit_check(soak) -> tuple[dict, list]:
    """What the api-server's audit log shows, or why it was not read (never a pass); and the
    writes read."""
    from reconcilers.devstack import controlplane

    if not controlplane.audit_enabled(soak.cfg):
        return {"ran": False, "why not": "the running kube-apiserver has no audit log (a stack "
                "started before the audit flags: restart it with `make down up`)"}, []
    found = audit.read(soak.cfg.audit_log, f"soak-{soak.run_id}-")
    if not found:
        return {"ran": False, "why not": f"no write of this run in {soak.cfg.audit_log}"}, []
    return audit_figures(found), found


def history_checks(seen: dict, injected: list) -> dict:
    """The checks on the run's history - the audit log (``seen``: ``audit_figures``, or why
    it was not read) and the faults with what was seen of them (``faults.observe`` first).
    None: not run (no audit log), which is never a pass."""
    audited = seen["ran"]
    return {
        "no two runs of one key overlapped (audit log: begin-to-end spans)":
            (not seen["overlaps"]) if audited else None,
        "no change lost (audit log: every change seen by a run that ended)":
            (not seen["changes lost"]) if audited else None,
        "no write to the soak's objects outside a run (audit log)":
            (not seen["writes outside any run"]) if audited else None,
        "every fault had an effect the soak saw (none silent)": not faults.silent(injected),
    }


def _settle(soak, api, seconds: float) -> float:
    """Wait until every object converged and every key settled, at most ``seconds``; the
    seconds it took."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            problems = unconverged(soak, api) + unsettled_keys()
        except Exception as exc:  # the stack is still coming back from the last fault
            problems = [f"checker could not read: {exc}"]
        if not problems or time.monotonic() > deadline:
            break
        time.sleep(2)
    return round(seconds - (deadline - time.monotonic()), 1)


def verdict(checks: dict, secondary: dict) -> bool:
    """Passed only when every check passed; a check not run (None) is no pass."""
    return all(v is True for v in [*checks.values(), *secondary.values()])


def run(soak, settle: float) -> dict:
    _django()
    import redis

    from reconcilers.models import ReconcileRecord

    api = cluster()
    settled_in = _settle(soak, api, settle)
    # One last change to every live object: each must be taken up by a run, which a key
    # left stuck (running, queued, in backoff for ever) cannot be.
    soak.change_every_object()
    last_change_in = _settle(soak, api, settle)
    history = history_overlaps()
    side_runs, side = side_channel_overlaps(soak.trace)
    seen, found = audit_check(soak)
    faults.observe(soak.injected, found, soak.trace)
    silent = faults.silent(soak.injected)
    message_figures, undelivered = messages(soak.messages)
    live = {f"{ns}/{name}" for ns, names in soak.names.items() for name in names}
    lost_work = lost_keys(undelivered, soak.trace, live)
    unexplained = [f"{name} exited with {code}" for name, code, why in soak.exits if not why]
    backlog = redis.Redis.from_url(soak.redis_url).llen("celery")
    records = ReconcileRecord.objects.count()
    lost = ReconcileRecord.objects.filter(error_class="WorkerLost").count()
    objects = sum(len(v) for v in soak.names.values()) + len(soak.deleted)
    try:
        final_unconverged, final_unsettled = unconverged(soak, api), unsettled_keys()
    except Exception as exc:
        final_unconverged, final_unsettled = [f"checker could not read: {exc}"], ["?"]
    audited = seen["ran"]
    checks = {  # independent of the operator's tables: the verdict rests on these
        "converged (every live object, every child, after a last change to each; deleted "
        "objects' children gone)": not final_unconverged,
        **history_checks(seen, soak.injected),
        "no message lost (every key of an undelivered message ran after it)": not lost_work,
        "no overlapping runs in the side channel": not side,
        "every process exit explained": not unexplained,
        "the broker's backlog ends empty": backlog == 0,
        "no watcher or beat process exited on its own": not soak.crashes,
        "the backlog stayed bounded (max <= 2x objects + 100)":
            soak.max_backlog <= 2 * objects + 100,
    }
    secondary = {  # the operator's own tables: can fail the run, never pass it alone
        "no key left running, queued or in backoff (the ledger)": not final_unsettled,
        "no overlapping runs in the history": not history,
    }
    return {
        "passed": verdict(checks, secondary), "checks": checks, "secondary checks": secondary,
        "objects": objects, "namespaces": len(soak.ns), "runs recorded": records,
        "runs in the side channel": side_runs,
        "runs lost to killed workers (recorded by the reaper)": lost,
        "overlaps": len(side) + len(seen.get("overlaps", [])),
        "history overlaps": len(history),
        "audit log": {k: (v[:20] if isinstance(v, list) else v) for k, v in seen.items()},
        "audit overlaps": len(seen["overlaps"]) if audited else None,
        "changes lost": len(seen["changes lost"]) if audited else None,
        **message_figures, "keys lost": lost_work[:20], "lost": len(lost_work),
        "faults injected": len(soak.injected), "silent faults": silent,
        "fault effects": [f"{f.kind}: {f.effect or 'SILENT'}" for f in soak.injected],
        "process exits": [f"{name} exited with {code}: {why or 'UNEXPLAINED'}"
                          for name, code, why in soak.exits],
        "note": soak.note,
        "unconverged": (final_unconverged + final_unsettled)[:20],
        "settled in (s)": settled_in, "took the last change in (s)": last_change_in,
        "max broker backlog": soak.max_backlog,
        "overlap details": (history + side)[:20], "crashed processes": soak.crashes,
        "Celery workers restarted after exiting on their own": soak.worker_exits,
        "Celery workers restarted by their liveness probe (consumer stalled)": soak.stalled,
        "liveness probe answers": soak.probes,
    }
