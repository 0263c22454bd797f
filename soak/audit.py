"""The kube-apiserver's audit log, read back by the soak's checker: who wrote each object, and
whether two runs of the operator ever wrote one object at once - judged from outside the
operator's own tables.

Every api-server call a run makes names the run in its User-Agent (``reconcilers._kube.kube``:
``django-crd-operator/<version> (run <identity>)``); the devstack's audit policy logs writes to
ConfigMaps and SoakItems at Metadata level (``reconcilers/devstack/controlplane.py``). For
each object, the successful writes of each run span from its first to its last (by the time
the api-server received them); two runs whose spans meet interleaved their writes (A..B..A),
which only two holders of one key at once can do. Runs done one after the other cannot: a run
has its last answer before it ends, and the next run's first request comes after that.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from itertools import combinations
from pathlib import Path
from typing import Iterable, Iterator

WRITE_VERBS = {"create", "update", "patch", "delete"}
RUN = re.compile(r"\(run ([^)\s]+)\)")
# Writers that are not the operator and may write the soak's objects: the soak itself
# (kubectl apply/delete) and the controller manager (garbage collection, namespace deletion).
OTHERS = ("kubectl/", "kube-controller-manager/")


@dataclass(frozen=True)
class Write:
    resource: str  # e.g. "configmaps", "soakitems" (a subresource is the object's)
    namespace: str
    name: str
    verb: str
    agent: str
    code: int
    at: datetime  # when the api-server received it

    @property
    def obj(self) -> str:
        return f"{self.resource} {self.namespace}/{self.name}"

    @property
    def run(self) -> str | None:
        found = RUN.search(self.agent)
        return found.group(1) if found else None

    @property
    def succeeded(self) -> bool:
        return 200 <= self.code < 300


def files(audit_log: Path) -> list[Path]:
    """The log and its rotated backups (``<stem>-<timestamp>.log``), oldest first."""
    rotated = sorted(audit_log.parent.glob(f"{audit_log.stem}-*{audit_log.suffix}"))
    return [*rotated, *([audit_log] if audit_log.exists() else [])]


def writes(lines: Iterable[str], namespace_prefix: str) -> Iterator[Write]:
    """The write events for objects in namespaces starting with ``namespace_prefix``."""
    for line in lines:
        if namespace_prefix not in line:  # most lines are other tests': not even parsed
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue  # a line cut by rotation
        ref = event.get("objectRef") or {}
        if (event.get("stage") != "ResponseComplete" or event.get("verb") not in WRITE_VERBS
                or not ref.get("name")
                or not (ref.get("namespace") or "").startswith(namespace_prefix)):
            continue
        yield Write(ref.get("resource", ""), ref["namespace"], ref["name"], event["verb"],
                    event.get("userAgent", ""), (event.get("responseStatus") or {}).get("code", 0),
                    datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00")))


def read(audit_log: Path, namespace_prefix: str) -> list[Write]:
    found = []
    for path in files(audit_log):
        with open(path, errors="replace") as f:
            found.extend(writes(f, namespace_prefix))
    return found


def overlaps(found: Iterable[Write]) -> list[str]:
    """Objects two runs wrote at once: their spans of successful writes meet."""
    spans: dict[str, dict[str, list[datetime]]] = defaultdict(dict)
    for w in found:
        if w.run is None or not w.succeeded:
            continue  # a refused write changed nothing
        span = spans[w.obj].setdefault(w.run, [w.at, w.at])
        span[0], span[1] = min(span[0], w.at), max(span[1], w.at)
    problems = []
    for obj, runs in spans.items():
        for (r1, (s1, e1)), (r2, (s2, e2)) in combinations(runs.items(), 2):
            if s1 <= e2 and s2 <= e1:
                problems.append(f"{obj}: runs {r1} [{s1:%H:%M:%S.%f}, {e1:%H:%M:%S.%f}] and "
                                f"{r2} [{s2:%H:%M:%S.%f}, {e2:%H:%M:%S.%f}]")
    return problems


def outside_runs(found: Iterable[Write]) -> list[str]:
    """Successful writes neither a run of the operator nor an allowed other writer made."""
    return [f"{w.obj}: {w.verb} by {w.agent!r} at {w.at:%H:%M:%S.%f}" for w in found
            if w.succeeded and w.run is None and not w.agent.startswith(OTHERS)]


def summary(found: list[Write]) -> dict:
    by_run = [w for w in found if w.run is not None]
    return {"writes": len(found), "writes by runs": len(by_run),
            "runs seen": len({w.run for w in by_run}),
            "writes refused (not 2xx)": sum(not w.succeeded for w in found),
            "objects written": len({w.obj for w in found})}
