"""A workflow's run: apply the wanted dependents in order, delete the others in reverse,
report - through ``ctx``'s public reads and writes (see the package's docstring).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from reconcilers._kube import kube
from reconcilers._base.reconcile import Result
from reconcilers._kube.children import controller_of
from reconcilers._kube.context import Context
from reconcilers._base.vocab import Owns, rfc3339
from reconcilers._authoring.dependents.declaration import LABEL, Dependent, order

# What a dependent is after a run: one word each (``Progress.states``).
READY = "ready"          # applied, and ready(child) holds
PENDING = "pending"      # applied, not ready yet
WAITING = "waiting"      # not applied: something it depends on is not ready
DELETING = "deleting"    # not wanted; deleted (or waiting for its dependents to go), still there
ABSENT = "absent"        # not wanted and gone

SUMMARY_CONDITION = "DependentsReady"


@dataclass
class Progress:
    """What one run of a workflow did and found.

    ``states``: each dependent's state (``READY``, ``PENDING``, ``WAITING``, ``DELETING``,
    ``ABSENT``); ``children``: each applied dependent's child as the api-server returned it
    (status included: copy what you need into your object's status); ``removed``: children
    of dependents no longer declared, or of an old name, still there (``kind/name``).
    """

    states: dict[str, str] = field(default_factory=dict)
    children: dict[str, dict] = field(default_factory=dict)
    removed: list[str] = field(default_factory=list)
    recheck: float | None = None

    @property
    def done(self) -> bool:
        """Every wanted dependent is ready, and nothing is left to delete."""
        return not self.removed and all(s in (READY, ABSENT) for s in self.states.values())

    def ready(self, name: str) -> bool:
        """Whether the dependent ``name`` was applied and is ready."""
        return self.states.get(name) == READY

    @property
    def pending(self) -> list[str]:
        """The dependents not settled yet, in order."""
        return [name for name, s in self.states.items() if s not in (READY, ABSENT)]

    @property
    def result(self) -> Result | None:
        """``None`` when done, else a run after ``recheck`` seconds (the watch normally comes
        first; with no recheck, ``None``: the watch alone moves it on)."""
        if self.done or self.recheck is None:
            return None
        return Result.after(self.recheck)


class Workflow:
    """The dependents of a reconciler, checked and ordered when the class is defined. As a
    class attribute it adds an ``Owns`` for each kind the reconciler does not own yet, so
    its children's changes reconcile their owner.

    ``recheck``: seconds after which a run that left something pending runs again, even if
    the watch showed nothing (``None``: never; ``cleanup`` then still asks for 5 s, as it
    must keep the finalizer). ``conditions``: write the ``<Name>Ready`` and
    ``DependentsReady`` status conditions (needs a status subresource).
    """

    def __init__(self, *dependents: Dependent, recheck: float | None = 60.0,
                 conditions: bool = True):
        if not dependents:
            raise ValueError("a Workflow needs at least one Dependent")
        for dep in dependents:
            if not isinstance(dep, Dependent):
                raise TypeError(f"Workflow takes Dependent(...) declarations, not {dep!r}")
        self.dependents: tuple[Dependent, ...] = tuple(order(dependents))
        for dep in self.dependents:
            if dep.condition == SUMMARY_CONDITION:
                raise ValueError(f"dependent {dep.name!r}: its condition would be the "
                                 f"workflow's own {SUMMARY_CONDITION}; name it otherwise")
        self.recheck = recheck
        self.conditions = conditions
        self._by_name = {d.name: d for d in self.dependents}

    def __set_name__(self, owner: type, attr: str) -> None:
        owned = {(o.api_version, o.kind) for o in getattr(owner, "owns", ())}
        extra = []
        for dep in self.dependents:
            if (dep.api_version, dep.kind) not in owned:
                owned.add((dep.api_version, dep.kind))
                extra.append(Owns(dep.api_version, dep.kind, dep.plural))
        if extra:
            owner.owns = [*getattr(owner, "owns", ()), *extra]

    def dependents_of(self, name: str) -> list[Dependent]:
        """The dependents that depend on ``name``, directly."""
        return [d for d in self.dependents if name in d.depends_on]

    # --- a run -------------------------------------------------------------------------------

    def reconcile(self, obj: Any, ctx: Context) -> Progress:
        """Apply what is wanted, in order, as far as readiness allows; delete what is not, in
        reverse order; write the conditions. ``obj``: what ``reconcile`` got (typed or not)."""
        unwanted = self._unwanted(obj)
        # Deleting in order needs the truth: a child the last run made may not be in the
        # cache yet, and deleting what it depends on first would break the order.
        children = self._children(ctx, fresh={(d.api_version, d.kind) for d in self.dependents
                                              if d.name in unwanted})
        progress = Progress(recheck=self.recheck)
        self._delete(ctx, unwanted, children, progress)
        for dep in self.dependents:
            if dep.name in unwanted:
                continue
            blocking = [p for p in dep.depends_on if progress.states.get(p) != READY]
            if blocking:
                progress.states[dep.name] = WAITING
                continue
            child = ctx.apply(dep.manifest(obj, ctx), plural=dep.plural, force=dep.force)
            progress.children[dep.name] = child
            ok = dep.ready is None or bool(dep.ready(child))
            progress.states[dep.name] = READY if ok else PENDING
            for stale in children.get(dep.name, ()):  # its old name: garbage now
                if stale["metadata"]["name"] != child["metadata"]["name"]:
                    self._delete_child(ctx, dep, stale)
                    progress.removed.append(_ref(stale))
        progress.states = {d.name: progress.states[d.name] for d in self.dependents}
        if self.conditions:
            self._report(obj, ctx, progress)
        return progress

    def cleanup(self, obj: Any, ctx: Context) -> Progress:
        """Delete every dependent in reverse order, each once those depending on it are gone.
        Its ``result`` asks to run again until the last is gone (so ``finalize`` keeps the
        finalizer until then)."""
        progress = Progress(recheck=self.recheck if self.recheck is not None else 5.0)
        every_kind = {(d.api_version, d.kind) for d in self.dependents}
        self._delete(ctx, set(self._by_name), self._children(ctx, fresh=every_kind), progress)
        progress.states = {d.name: progress.states[d.name] for d in self.dependents}
        return progress

    # --- the parts ------------------------------------------------------------------------

    def _unwanted(self, obj: Any) -> set[str]:
        """Dependents whose ``when`` is false, and everything that depends on one."""
        out: set[str] = set()
        for dep in self.dependents:  # in order: parents are decided first
            if (dep.when is not None and not dep.when(obj)) or out.intersection(dep.depends_on):
                out.add(dep.name)
        return out

    def _children(self, ctx: Context, fresh: set[tuple[str, str]]) -> dict[str, list[dict]]:
        """This object's children carrying the dependent label, by the label's value (a name
        no longer declared included): read through ``ctx`` (the cache: the workflow's kinds
        are owned), or for the ``(apiVersion, kind)`` pairs in ``fresh`` from the api-server
        (one LIST per kind, by label)."""
        uid = ctx.obj["metadata"]["uid"]
        out: dict[str, list[dict]] = {}
        kinds = {(d.api_version, d.kind): d.plural for d in self.dependents}
        for (api_version, kind), plural in kinds.items():
            listed = (_list_fresh(ctx, api_version, kind, plural)
                      if (api_version, kind) in fresh
                      else ctx.list(api_version, kind, plural=plural))
            for child in listed:
                meta = child["metadata"]
                name = (meta.get("labels") or {}).get(LABEL)
                if name is not None and (controller_of(child) or {}).get("uid") == uid:
                    child.setdefault("apiVersion", api_version)
                    child.setdefault("kind", kind)
                    out.setdefault(name, []).append(child)
        return out

    def _delete(self, ctx: Context, unwanted: set[str], children: Mapping[str, list[dict]],
                progress: Progress) -> None:
        """Delete the children of ``unwanted`` dependents in reverse order - each only once
        the unwanted dependents that depend on it are gone - and those of names no longer
        declared (in no order: their graph is gone with them)."""
        for name, objs in children.items():
            if name not in self._by_name:
                for child in objs:
                    self._delete_child(ctx, None, child)
                    progress.removed.append(_ref(child))
        for dep in reversed(self.dependents):
            if dep.name not in unwanted:
                continue
            present = children.get(dep.name) or []
            if not present:
                progress.states[dep.name] = ABSENT
                continue
            progress.states[dep.name] = DELETING
            if any(progress.states.get(d.name) != ABSENT for d in self.dependents_of(dep.name)
                   if d.name in unwanted):
                continue  # what depends on it is not gone yet
            for child in present:
                self._delete_child(ctx, dep, child)

    @staticmethod
    def _delete_child(ctx: Context, dep: Dependent | None, child: dict) -> None:
        meta = child["metadata"]
        if meta.get("deletionTimestamp"):
            return  # already going
        if dep is None or dep.propagation == "Background":
            ctx.delete(child["apiVersion"], child["kind"], meta["name"],
                       plural=dep.plural if dep else None)
            return
        # ctx.delete sends no DeleteOptions: a fenced write of its own, with the propagation
        # policy (and the uid read, so a same-named successor is never hit).
        gvr = ctx.lister.resource(child["apiVersion"], child["kind"], dep.plural)
        try:
            ctx.request("DELETE", gvr.path(meta.get("namespace"), meta["name"]), {
                "apiVersion": "v1", "kind": "DeleteOptions",
                "propagationPolicy": dep.propagation,
                "preconditions": {"uid": meta["uid"]}})
        except kube.ApiError as exc:
            if not exc.gone:
                raise

    def _report(self, obj: Any, ctx: Context, progress: Progress) -> None:
        """The conditions: on a typed resource, into its status, so they go out with the
        status patch the run writes from it (one write, not two); otherwise one status patch
        of their own (none when nothing changed)."""
        wanted = self._conditions(progress)
        raw = getattr(obj, "raw", None)
        if isinstance(raw, dict) and callable(getattr(obj, "status_patch", None)):
            status = raw.get("status") or {}
            raw["status"] = status
            status["conditions"] = _merged(status.get("conditions") or [], wanted,
                                           raw["metadata"].get("generation"))
            return
        for type_, ok, reason, message in wanted:
            ctx.set_condition(type_, ok, reason, message)
        ctx.patch_status(observed_generation=False)

    def _conditions(self, progress: Progress) -> list[tuple[str, bool, str, str]]:
        out = []
        for dep in self.dependents:
            state = progress.states.get(dep.name)
            if state == READY:
                out.append((dep.condition, True, "Ready", f"{dep.kind} is ready"))
            elif state == PENDING:
                out.append((dep.condition, False, "NotReady",
                            f"{dep.kind} applied, not ready yet"))
            elif state == WAITING:
                waiting = [p for p in dep.depends_on if progress.states.get(p) != READY]
                out.append((dep.condition, False, "Waiting",
                            f"waiting for {', '.join(waiting)} to be ready"))
            elif state == DELETING:
                out.append((dep.condition, False, "Deleting", "not wanted; deleting"))
            elif state == ABSENT:
                out.append((dep.condition, False, "NotWanted", "not wanted"))
        if progress.done:
            out.append((SUMMARY_CONDITION, True, "AllReady", "every dependent is ready"))
        else:
            out.append((SUMMARY_CONDITION, False, "Progressing",
                        "not settled: " + ", ".join(progress.pending + progress.removed)))
        return out


def _list_fresh(ctx: Context, api_version: str, kind: str, plural: str | None) -> list[dict]:
    """The objects of a kind in the run's namespace that carry the dependent label, from the
    api-server (a read: no fence)."""
    gvr = ctx.lister.resource(api_version, kind, plural)
    listed = kube.request(ctx.api, "GET", gvr.path(ctx.key.namespace),
                          query={"labelSelector": LABEL})
    return list(listed.get("items") or [])


def _merged(current: list[dict], wanted: list[tuple[str, bool, str, str]],
            generation: int | None) -> list[dict]:
    """``current`` conditions with ``wanted`` set, as ``ctx.set_condition`` sets them:
    ``lastTransitionTime`` moves only when the status flips."""
    by_type = {c.get("type"): c for c in current}
    for type_, ok, reason, message in wanted:
        status = "True" if ok else "False"
        previous = by_type.get(type_)
        flipped = previous is None or previous.get("status") != status
        by_type[type_] = {
            "type": type_, "status": status, "reason": reason, "message": message,
            "observedGeneration": generation,
            "lastTransitionTime": (rfc3339() if flipped or not previous.get("lastTransitionTime")
                                   else previous["lastTransitionTime"])}
    return list(by_type.values())


def _ref(child: Mapping) -> str:
    return f"{child.get('kind', '')}/{child['metadata']['name']}"
