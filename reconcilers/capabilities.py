"""Score a reconciler's capability level from evidence its runs leave behind.

Each observable criterion (see ``capability_levels.py``) is a predicate over one finished run;
the runner calls ``record_evidence`` for every run, and the first run that proves a criterion
is kept in ``CapabilityEvidence`` (a per-process memo makes that one INSERT per criterion per
process, not one per run); level 4's metrics criterion is proven by a scrape instead
(``record_scraped``). The evidenced level is the highest level whose observable criteria
- and those of every level below - all have proof. Criteria nobody can observe (backups,
auto-scaling) count only as the operator's claim and are shown as such.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from django.db import connection, transaction

from .capability_levels import ACTIONS, as_rows
from .models import CapabilityEvidence, Outcome, ReconcileRecord


# Not reported by the reconciler but seen by the runner: a run triggered by a changed or
# deleted child that wrote that kind of child again.
HEALED = "healed"


def _ok(r: ReconcileRecord) -> bool:
    return r.outcome == Outcome.SUCCESS


def _actions(r: ReconcileRecord) -> set[str]:
    return {a.get("action") for a in r.capabilities or []}


# criterion evidence id -> does this run prove it? (``attempts`` = failures before this run)
EVIDENCE: dict[str, Callable[[ReconcileRecord, int], bool]] = {
    "success": lambda r, a: _ok(r),
    "observed_generation": lambda r, a: _ok(r) and r.generation is not None
    and r.observed_generation == r.generation,
    "conditions": lambda r, a: _ok(r) and bool(r.conditions),
    "spec_change": lambda r, a: _ok(r) and (r.generation or 0) > 1,
    "finalizer": lambda r, a: _ok(r) and r.phase == "finalize",
    "recovered": lambda r, a: _ok(r) and a > 0,
    "events": lambda r, a: bool(r.events),
    "auto_healing": lambda r, a: _ok(r) and HEALED in _actions(r),
    "upgrade": lambda r, a: _ok(r) and "upgrade" in _actions(r),
    "lifecycle": lambda r, a: _ok(r) and any(ACTIONS.get(x) == "lifecycle" for x in _actions(r)),
    "autopilot": lambda r, a: _ok(r) and any(ACTIONS.get(x) == "autopilot" for x in _actions(r)),
}

# Not a property of one run: proven when a scrape of a worker's /metrics served the
# reconciler's reconcile counts (``record_scraped``). Its proof names the latest run then.
SCRAPED = "metrics_scraped"
OBSERVABLE = set(EVIDENCE) | {SCRAPED}

_recorded: set[tuple[str, str]] = set()


def new_evidence(record: ReconcileRecord, failures_before: int) -> list[tuple[str, str]]:
    """The criteria this run proves that this process has not seen proven yet."""
    return [(record.reconciler, cid) for cid, proves in EVIDENCE.items()
            if (record.reconciler, cid) not in _recorded and proves(record, failures_before)]


def record_evidence(record: ReconcileRecord, failures_before: int) -> None:
    """Keep the first proof of each criterion this run meets (inside the run's transaction)."""
    new = new_evidence(record, failures_before)
    if not new:
        return
    with connection.cursor() as cursor:
        cursor.executemany(
            f"INSERT INTO {CapabilityEvidence._meta.db_table} "
            "(reconciler, criterion, record_id, seen_at) VALUES (%s, %s, %s, now()) "
            "ON CONFLICT (reconciler, criterion) DO NOTHING",
            [(r, cid, record.pk) for r, cid in new])
    transaction.on_commit(lambda: _recorded.update(new))


def record_scraped(reconcilers: Iterable[str]) -> None:
    """Metrics with values for ``reconcilers`` were just served to a scrape: level 4's metrics
    criterion is evidenced for each that has a run to point at."""
    new = sorted(r for r in reconcilers if (r, SCRAPED) not in _recorded)
    if not new:
        return
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {CapabilityEvidence._meta.db_table} "
            "(reconciler, criterion, record_id, seen_at) "
            f"SELECT r.name, %s, max(h.id), now() FROM unnest(%s::text[]) AS r(name) "
            f"JOIN {ReconcileRecord._meta.db_table} h ON h.reconciler = r.name "
            "GROUP BY r.name ON CONFLICT (reconciler, criterion) DO NOTHING",
            [SCRAPED, new])
    _recorded.update((r, SCRAPED) for r in new)


@dataclass(frozen=True)
class Criterion:
    id: str
    text: str
    observable: bool
    record_id: int | None  # the run that proves it, when observable and proven

    @property
    def met(self) -> bool:
        return self.record_id is not None


@dataclass(frozen=True)
class LevelScore:
    level: int
    name: str
    criteria: list[Criterion]

    @property
    def evidenced(self) -> bool:
        return all(c.met for c in self.criteria if c.observable)


def score(reconciler: str) -> list[LevelScore]:
    """Per level, each criterion with the id of a run that proves it (one small query)."""
    proofs = dict(CapabilityEvidence.objects.filter(reconciler=reconciler)
                  .values_list("criterion", "record_id"))
    out = []
    for level in as_rows():
        criteria = [Criterion(c["id"], c["text"], c["evidence"] in OBSERVABLE,
                              proofs.get(c["evidence"]))
                    for c in level["criteria"]]
        out.append(LevelScore(level["level"], level["name"], criteria))
    return out


def evidenced_level(scores: list[LevelScore]) -> int:
    level = 0
    for s in sorted(scores, key=lambda s: s.level):
        if not s.evidenced:
            break
        level = s.level
    return level
