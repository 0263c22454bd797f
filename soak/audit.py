"""The kube-apiserver's audit log, read back by the soak's checker: who wrote each object,
whether two runs of the operator ever held one object at once, and whether every change was
seen by a run - judged from outside the operator's own tables.

Every api-server call a run makes names the run in its User-Agent, as the operator sends it:
``django-crd-operator/<version> (run <identity>)``, unique per attempt; the devstack's audit
policy logs writes to ConfigMaps and SoakItems at Metadata level (``reconcilers/devstack/
controlplane.py``). The soak's reconciler writes each object at least twice per run
(``soak/soakapp/reconcilers.py``): a *begin* on the SoakItem (accepted only while the object
has the generation the run read) and an *end* on its status.

- **Overlap**: each run of a key (a SoakItem and its ConfigMaps ``<name>-<i>``) spans from
  the time the api-server received its first successful write to the time it completed its
  last. A run has its last answer before it ends, and the next run of the key starts after
  that, so the spans of runs done one after the other never meet; two runs whose spans meet
  held the key at once.
- **Lost**: every change the soak's driver made (``kubectl``: a SoakItem created or patched,
  a child deleted behind the operator's back) must be followed by a run of that key whose
  begin the api-server received after the change was complete - so the run saw it - and
  whose end was accepted; or the object was deleted after it. Anything else is a change the
  operator lost.
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
DRIVER = "kubectl/"  # the soak's own writes (kubectl apply, patch, delete)
# Writers that are not the operator and may write the soak's objects: the soak itself and the
# controller manager (garbage collection, namespace deletion).
OTHERS = (DRIVER, "kube-controller-manager/")
ITEMS, CHILDREN = "soakitems", "configmaps"


def _time(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


@dataclass(frozen=True)
class Write:
    resource: str  # e.g. "configmaps", "soakitems"
    namespace: str
    name: str
    verb: str
    agent: str
    code: int
    at: datetime  # when the api-server received it
    subresource: str = ""  # e.g. "status"
    done: datetime | None = None  # when the api-server completed its answer
    dry_run: bool = False

    @property
    def obj(self) -> str:
        return f"{self.resource} {self.namespace}/{self.name}"

    @property
    def key(self) -> str:
        """The SoakItem this object belongs to: itself, or the owner of a child
        ``<item>-<i>`` (the soak's naming)."""
        name = self.name.rsplit("-", 1)[0] if self.resource == CHILDREN else self.name
        return f"{self.namespace}/{name}"

    @property
    def completed(self) -> datetime:
        return self.done or self.at

    @property
    def run(self) -> str | None:
        found = RUN.search(self.agent)
        return found.group(1) if found else None

    @property
    def succeeded(self) -> bool:
        return 200 <= self.code < 300 and not self.dry_run

    @property
    def is_begin(self) -> bool:
        return self.resource == ITEMS and not self.subresource and self.verb == "patch"

    @property
    def is_end(self) -> bool:
        return self.resource == ITEMS and self.subresource == "status"

    @property
    def is_change(self) -> bool:
        """A change by the soak's driver the operator must act on: a SoakItem created or
        changed, or a child deleted behind its back (a SoakItem deleted needs no run)."""
        if not self.succeeded or not self.agent.startswith(DRIVER) or self.subresource:
            return False
        return ((self.resource == ITEMS and self.verb in ("create", "update", "patch"))
                or (self.resource == CHILDREN and self.verb == "delete"))


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
        done = event.get("stageTimestamp")
        yield Write(ref.get("resource", ""), ref["namespace"], ref["name"], event["verb"],
                    event.get("userAgent", ""), (event.get("responseStatus") or {}).get("code", 0),
                    _time(event["requestReceivedTimestamp"]), ref.get("subresource", ""),
                    _time(done) if done else None,
                    "dryRun=" in (event.get("requestURI") or ""))


def read(audit_log: Path, namespace_prefix: str) -> list[Write]:
    found = []
    for path in files(audit_log):
        with open(path, errors="replace") as f:
            found.extend(writes(f, namespace_prefix))
    return found


@dataclass
class Run:
    """One run of one key, as the audit log shows it (successful writes only: a refused
    write changed nothing)."""
    identity: str
    key: str
    first: datetime  # its first write received
    last: datetime  # its last write completed
    began: datetime | None = None  # its first begin received
    ended: datetime | None = None  # its last end completed


def runs(found: Iterable[Write]) -> dict[str, dict[str, Run]]:
    """Per key, its runs by identity."""
    by_key: dict[str, dict[str, Run]] = defaultdict(dict)
    for w in sorted(found, key=lambda w: w.at):
        if w.run is None or not w.succeeded:
            continue
        run = by_key[w.key].setdefault(w.run, Run(w.run, w.key, w.at, w.completed))
        run.first, run.last = min(run.first, w.at), max(run.last, w.completed)
        if w.is_begin and run.began is None:
            run.began = w.at
        if w.is_end:
            run.ended = max(run.ended or w.completed, w.completed)
    return by_key


def overlaps(found: Iterable[Write]) -> list[str]:
    """Keys two runs held at once: their spans meet."""
    problems = []
    for key, of_key in runs(found).items():
        for a, b in combinations(sorted(of_key.values(), key=lambda r: r.first), 2):
            if a.first <= b.last and b.first <= a.last:
                problems.append(f"{key}: runs {a.identity} [{a.first:%H:%M:%S.%f}, "
                                f"{a.last:%H:%M:%S.%f}] and {b.identity} [{b.first:%H:%M:%S.%f}, "
                                f"{b.last:%H:%M:%S.%f}]")
    return problems


def lost(found: list[Write]) -> list[str]:
    """Changes no run saw: no run of the key began after the change was complete and ended,
    and the object was not deleted after it."""
    of_keys = runs(found)
    deleted: dict[str, datetime] = {}
    for w in found:
        if w.succeeded and w.resource == ITEMS and w.verb == "delete":
            deleted[w.key] = max(deleted.get(w.key, w.at), w.at)
    problems = []
    for change in sorted((w for w in found if w.is_change), key=lambda w: w.at):
        if change.key in deleted and deleted[change.key] >= change.at:
            continue
        if any(r.began is not None and r.began > change.completed and r.ended is not None
               and r.ended > r.began for r in of_keys.get(change.key, {}).values()):
            continue
        problems.append(f"{change.key}: {change.verb} of {change.obj} by the soak, complete at "
                        f"{change.completed:%H:%M:%S.%f}, never seen by a run that ended")
    return problems


def outside_runs(found: Iterable[Write]) -> list[str]:
    """Successful writes neither a run of the operator nor an allowed other writer made."""
    return [f"{w.obj}: {w.verb} by {w.agent!r} at {w.at:%H:%M:%S.%f}" for w in found
            if w.succeeded and w.run is None and not w.agent.startswith(OTHERS)]


def refused_between(found: Iterable[Write], start: float, end: float,
                    codes: range) -> int:
    """Writes by runs answered with one of ``codes`` received between two unix times: what a
    fault on the api-server's side did to the operator."""
    return sum(1 for w in found if w.run is not None and w.code in codes
               and start <= w.at.timestamp() <= end)


def summary(found: list[Write]) -> dict:
    by_run = [w for w in found if w.run is not None]
    of_keys = runs(found)
    every = [r for of_key in of_keys.values() for r in of_key.values()]
    return {"writes": len(found), "writes by runs": len(by_run),
            "runs seen": len({w.run for w in by_run}),
            "runs with a begin and an end": sum(r.began is not None and r.ended is not None
                                                for r in every),
            "changes by the soak": sum(w.is_change for w in found),
            "writes refused (not 2xx)": sum(not w.succeeded for w in found),
            "objects written": len({w.obj for w in found})}
