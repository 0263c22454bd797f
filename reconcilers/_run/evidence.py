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

from reconcilers._base.capability_levels import ACTIONS, as_rows
from reconcilers.models import CapabilityEvidence, ReconcileRecord
from reconcilers._base.reconcile import Outcome


# Not reported by the reconciler but seen by the runner: a run triggered by a changed or
# deleted child that wrote that kind of child again.
HEALED = "healed"


def _ok(r: ReconcileRecord) -> bool:
    return r.outcome == Outcome.SUCCESS


def _actions(r: ReconcileRecord) -> set[str]:
    return {a.get("action") for a in r.capabilities or []}


def _acted(r: ReconcileRecord, kinds: set[str]) -> bool:
    """A successful run reported one of these actions, said what it did, and changed a
    child in the cluster while at it: a reported sentence alone proves nothing."""
    return _ok(r) and any(ACTIONS.get(a.get("action")) in kinds and a.get("detail")
                          and a.get("changed") for a in r.capabilities or [])


# criterion evidence id -> does this run prove it? (``attempts`` = failures before this run)
EVIDENCE: dict[str, Callable[[ReconcileRecord, int], bool]] = {
    "success": lambda r, a: _ok(r),
    "observed_generation": lambda r, a: _ok(r) and r.generation is not None
    and r.observed_generation == r.generation,
    "conditions": lambda r, a: _ok(r) and bool(r.conditions),
    "spec_change": lambda r, a: _ok(r) and (r.generation or 0) > 1,
    "finalizer": lambda r, a: _ok(r) and r.phase == "finalize",
    "recovered": lambda r, a: _ok(r) and a > 0,
    "events": lambda r, a: _ok(r) and bool(r.events),
    "auto_healing": lambda r, a: _ok(r) and HEALED in _actions(r),
    "upgrade": lambda r, a: _acted(r, {"upgrade"}),
    "lifecycle": lambda r, a: _acted(r, {"lifecycle"}),
    "autopilot": lambda r, a: _acted(r, {"autopilot"}),
}

# Not a property of one run: proven when a scrape of /metrics served a metric family the
# reconciler declares as its own (``Reconciler.metrics``) - the framework's own series come
# with every operator, and prove nothing about this one (``record_scraped``). Its proof names
# the latest run then.
SCRAPED = "metrics_scraped"
OBSERVABLE = set(EVIDENCE) | {SCRAPED}

# The criteria this process has seen proven (never proven twice): added after each run's
# transaction commits, by whichever thread ran it. Module level: a cache of the process's,
# which a restart forgets at the cost of one query per criterion.
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


def served_families(body: bytes) -> set[str]:
    """The metric families a Prometheus text exposition has samples of."""
    out = set()
    for line in body.decode(errors="replace").splitlines():
        if line and not line.startswith("#"):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            out.add(name)
            for suffix in ("_total", "_bucket", "_sum", "_count", "_created"):
                if name.endswith(suffix):
                    out.add(name[:-len(suffix)])
    return out


def record_scraped(reconcilers: Iterable[str]) -> None:
    """A scrape was just served samples of metric families these reconcilers declare as
    their own: level 4's metrics criterion is evidenced for each that has a run to point
    at."""
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


# What is missing while an observable criterion has no proof: the admin shows it.
MISSING = {
    "success": "no successful run yet",
    "observed_generation": "no successful run left status.observedGeneration at the "
                           "generation it acted on",
    "conditions": "no successful run left status.conditions",
    "spec_change": "no successful run of a changed spec (generation > 1)",
    "upgrade": "no successful run reported ctx.capability(\"upgrade\", detail) while "
               "changing a child",
    "finalizer": "no successful cleanup through a finalizer",
    "recovered": "no failed run of an object followed by a success",
    "lifecycle": "no successful run reported a backup, restore, fail-over, fail-back or "
                 "member change while changing a child",
    "events": "no successful run emitted an Event (ctx.event)",
    SCRAPED: "no scrape of /metrics served a family the reconciler declares in `metrics`",
    "auto_healing": "no run triggered by a changed or deleted child put it back",
    "autopilot": "no successful run reported auto-scaling or auto-tuning while changing a "
                 "child",
}


@dataclass(frozen=True)
class Criterion:
    id: str
    text: str
    observable: bool
    record_id: int | None  # the run that proves it, when observable and proven
    evidence: str | None = None  # the evidence id (``EVIDENCE``, ``SCRAPED``)

    @property
    def met(self) -> bool:
        return self.record_id is not None

    @property
    def why(self) -> str:
        """Why it is or is not met, in a sentence."""
        if not self.observable:
            return "not observable from runs: the author's claim only"
        if self.met:
            return f"shown by run #{self.record_id}"
        return MISSING.get(self.evidence or "", "no run has shown it yet")


@dataclass(frozen=True)
class LevelScore:
    level: int
    name: str
    criteria: list[Criterion]

    @property
    def evidenced(self) -> bool:
        return all(c.met for c in self.criteria if c.observable)

    @property
    def why(self) -> str:
        """Why this level alone is or is not evidenced (a level also needs those below)."""
        missing = [c.why for c in self.criteria if c.observable and not c.met]
        if missing:
            return "not met: " + "; ".join(missing)
        claimed = sum(not c.observable for c in self.criteria)
        return "met: a run shows each observable criterion" + (
            f" ({claimed} more only claimed)" if claimed else "")


def score(reconciler: str) -> list[LevelScore]:
    """Per level, each criterion with the id of a run that proves it (one small query)."""
    proofs = dict(CapabilityEvidence.objects.filter(reconciler=reconciler)
                  .values_list("criterion", "record_id"))
    out = []
    for level in as_rows():
        criteria = [Criterion(c["id"], c["text"], c["evidence"] in OBSERVABLE,
                              proofs.get(c["evidence"]), c["evidence"])
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


def shortfall(reconcilers: Iterable[str], level: int) -> list[str]:
    """Why the evidence does not reach ``level`` for these reconcilers (empty when it does):
    for each one short of it, the first level it misses and the admin's reason, e.g.
    ``foos.example.com: level 2 (Seamless Upgrades) not met: no successful run ...``.
    An operator is as capable as its least capable reconciler, so each must reach it."""
    reasons = []
    for name in reconcilers:
        for s in sorted(score(name), key=lambda s: s.level):
            if s.level > level:
                break
            if not s.evidenced:
                reasons.append(f"{name}: level {s.level} ({s.name}) {s.why}")
                break
    return reasons


def claimable(reconcilers: list[str], level: int | None = None) -> tuple[int, int, list[str]]:
    """The level an operator of these reconcilers may claim: ``level`` or, when None, the
    highest every one's runs evidence (at least 1, the least a claim can be); with the level
    they evidence together and why the evidence falls short of the claim (``shortfall``)."""
    evidenced = min((evidenced_level(score(n)) for n in reconcilers), default=0)
    wanted = level if level is not None else max(evidenced, 1)
    return wanted, evidenced, shortfall(reconcilers, wanted)
