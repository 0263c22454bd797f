"""Score a reconciler's capability level from evidence in history.

Each observable criterion (see ``capability_levels.py``) maps to one query that finds a run
proving it; the evidenced level is the highest level whose observable criteria - and those of
every level below - all have proof. Criteria nobody can observe (backups, auto-scaling) count
only as the operator's claim and are shown as such.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Exists, F, OuterRef, QuerySet

from .capability_levels import as_rows
from .models import Outcome, ReconcileRecord


def _success(reconciler: str) -> QuerySet:
    return ReconcileRecord.objects.filter(reconciler=reconciler, outcome=Outcome.SUCCESS)


def _recovered(reconciler: str) -> QuerySet:
    earlier_error = ReconcileRecord.objects.filter(
        reconciler=reconciler, namespace=OuterRef("namespace"), name=OuterRef("name"),
        outcome=Outcome.ERROR, started_at__lt=OuterRef("started_at"))
    return _success(reconciler).filter(Exists(earlier_error))


EVIDENCE = {
    "success": _success,
    "observed_generation": lambda r: _success(r).filter(observed_generation=F("generation")),
    "conditions": lambda r: _success(r).exclude(conditions=[]),
    "spec_change": lambda r: _success(r).filter(generation__gt=1),
    "finalizer": lambda r: _success(r).filter(phase="finalize"),
    "recovered": _recovered,
    "events": lambda r: ReconcileRecord.objects.filter(reconciler=r).exclude(events=[]),
    "auto_healing": lambda r: _success(r).filter(triggers__contains=["owned-child"]),
}


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
    """Per level, each criterion with the id of a run that proves it (if any).

    The definitions come from ``capability_levels`` (the same data the migration seeds into
    ``CapabilityLevel`` for the admin), so scoring never depends on seeded rows."""
    out = []
    for level in as_rows():
        criteria = []
        for c in level["criteria"]:
            finder = EVIDENCE.get(c.get("evidence") or "")
            proof = None
            if finder is not None:
                proof = finder(reconciler).order_by().values_list("id", flat=True).first()
            criteria.append(Criterion(c["id"], c["text"], finder is not None, proof))
        out.append(LevelScore(level["level"], level["name"], criteria))
    return out


def evidenced_level(scores: list[LevelScore]) -> int:
    level = 0
    for s in sorted(scores, key=lambda s: s.level):
        if not s.evidenced:
            break
        level = s.level
    return level
