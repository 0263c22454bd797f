"""Dependent resources: children declared with their desired state, a readiness check and an
order, applied and garbage-collected by the framework - java-operator-sdk's dependent
resources and workflows, in a reconciler's own ``reconcile``.

    class WebsiteReconciler(Reconciler):
        resource = Website
        dependents = Workflow(
            Dependent("content", "v1", "ConfigMap", desired=content_config_map),
            Dependent("server", "apps/v1", "Deployment", desired=deployment,
                      ready=available, depends_on=["content"]),
            Dependent("service", "v1", "Service", desired=service,
                      depends_on=["server"], when=lambda site: site.spec.expose),
        )

        def reconcile(self, site, ctx):
            progress = self.dependents.reconcile(site, ctx)
            return progress.result

        def finalize(self, obj, ctx):              # optional: ordered deletion
            return self.dependents.cleanup(obj, ctx).result

The contract of ``Workflow.reconcile``, one run at a time (level-based: each run starts again
from what the cache shows):

- A dependent is applied (``ctx.apply``: server-side apply, this object as controller owner,
  labelled with ``LABEL: <dependent name>``) only once every dependent it ``depends_on`` is
  ready; until then it is ``waiting`` and left as it is. Ready means applied and ``ready(child)``
  true (no ``ready``: applied is ready).
- A dependent whose ``when(obj)`` is false is not wanted, nor is anything that depends on it.
  Its children are deleted in reverse order: a dependent is deleted only once every unwanted
  dependent that depends on it is gone - as the api-server says: a run with something to
  delete lists the children there (one LIST per kind, by label), not from the cache, which
  may not show yet a child the last run made. A child labelled for a dependent the workflow
  no longer declares is deleted too, as is a child of a dependent whose desired name changed.
- What moves the workflow on is the watch: the workflow's kinds are added to the reconciler's
  ``owns`` at class definition, so a child becoming ready, or going away, reconciles its owner.
  While anything is pending the result also asks for a run after ``recheck`` seconds, a safety
  net for a readiness the watch does not show (say one read from elsewhere).
- Each dependent gets a status condition ``<Name>Ready`` and the workflow a ``DependentsReady``
  summary, written with one status patch (none when nothing changed).

``cleanup`` (from ``finalize``) deletes every dependent in reverse order, each only once those
depending on it are gone; its ``result`` keeps the finalizer until the last is gone. Without a
``finalize`` the Kubernetes garbage collector deletes the children through their owner
references when the object goes - all at once, in no order.

The graph is checked when the class is defined: a dependent named twice, an unknown name in
``depends_on`` or a cycle raise ``ValueError`` there, naming the cycle.
"""

from __future__ import annotations

import functools
import inspect
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from . import kube
from .context import Context, controller_of
from .results import Result
from .vocab import Owns

LABEL = "reconcilers.django-crd-operator.io/dependent"

# What a dependent is after a run: one word each (``Progress.states``).
READY = "ready"          # applied, and ready(child) holds
PENDING = "pending"      # applied, not ready yet
WAITING = "waiting"      # not applied: something it depends on is not ready
DELETING = "deleting"    # not wanted; deleted (or waiting for its dependents to go), still there
ABSENT = "absent"        # not wanted and gone

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")

SUMMARY_CONDITION = "DependentsReady"


@dataclass(frozen=True)
class Dependent:
    """One child: ``name`` (unique in its workflow; a label value), its ``api_version`` and
    ``kind``, and ``desired(obj)`` or ``desired(obj, ctx)`` returning its manifest - ``metadata.
    name`` at least; apiVersion, kind, namespace, the owner reference and the label are filled
    in.

    ``ready(child) -> bool``: when it counts as ready (default: once applied).
    ``depends_on``: names of dependents that must be ready before this one is applied, and
    that are deleted only after it.
    ``when(obj) -> bool``: whether it is wanted at all (java-operator-sdk's reconcile
    precondition; default: always). Not wanted, it and what depends on it are deleted.
    ``force``: server-side apply takes over fields other managers set (controllers' usual
    choice; ``False``: such a conflict is an error, retried).
    ``propagation``: the deletion's ``propagationPolicy`` - ``"Background"`` (the API's
    default for most kinds) or ``"Foreground"``: the child stays until its own children (a
    Deployment's Pods) are gone, so "deleted before what it depends on" includes them.
    """

    name: str
    api_version: str
    kind: str
    desired: Callable[..., Mapping]
    ready: Callable[[dict], bool] | None = None
    depends_on: Sequence[str] = ()
    when: Callable[[Any], bool] | None = None
    plural: str | None = None
    force: bool = True
    propagation: str = "Background"

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"dependent name {self.name!r} must be a DNS label (lower-case "
                             f"letters, digits and '-', at most 63): it is a label value")
        if isinstance(self.depends_on, str):
            object.__setattr__(self, "depends_on", (self.depends_on,))
        object.__setattr__(self, "depends_on", tuple(self.depends_on))
        if self.propagation not in ("Background", "Foreground"):
            raise ValueError(f"dependent {self.name!r}: propagation must be 'Background' or "
                             f"'Foreground', not {self.propagation!r}")

    @property
    def condition(self) -> str:
        """Its status condition type: ``server`` -> ``ServerReady``."""
        return "".join(part.capitalize() for part in self.name.split("-")) + "Ready"

    def manifest(self, obj: Any, ctx: Context) -> dict:
        """``desired`` completed with apiVersion, kind and the dependent's label."""
        body = dict(self.desired(obj, ctx) if _takes_ctx(self.desired) else self.desired(obj))
        for field_, value in (("apiVersion", self.api_version), ("kind", self.kind)):
            if body.setdefault(field_, value) != value:
                raise ValueError(f"dependent {self.name!r} is a {self.api_version} {self.kind}, "
                                 f"but desired() returned {field_} {body[field_]!r}")
        meta = dict(body.get("metadata") or {})
        if not meta.get("name"):
            raise ValueError(f"dependent {self.name!r}: desired() returned no metadata.name")
        meta["labels"] = {**(meta.get("labels") or {}), LABEL: self.name}
        body["metadata"] = meta
        return body


@functools.lru_cache(maxsize=None)
def _takes_ctx(func: Callable) -> bool:
    params = [p for p in inspect.signature(func).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(params) >= 2


def order(dependents: Sequence[Dependent]) -> list[Dependent]:
    """The dependents in an order that puts each after everything it depends on (declaration
    order among the free ones). Raises ``ValueError`` for a duplicate name, an unknown
    ``depends_on`` or a cycle (named: ``a -> b -> a``, a depending on b)."""
    by_name: dict[str, Dependent] = {}
    for dep in dependents:
        if dep.name in by_name:
            raise ValueError(f"two dependents are named {dep.name!r}")
        by_name[dep.name] = dep
    for dep in dependents:
        for parent in dep.depends_on:
            if parent not in by_name:
                raise ValueError(f"dependent {dep.name!r} depends on {parent!r}, which is not "
                                 f"declared (declared: {', '.join(by_name)})")
    cycle = _find_cycle(by_name)
    if cycle:
        raise ValueError(f"dependents form a cycle: {' -> '.join(cycle)} (each depends on the "
                         f"next); nothing in it could ever be applied first")
    out: list[Dependent] = []
    placed: set[str] = set()
    while len(out) < len(dependents):
        for dep in dependents:  # no cycle: each pass places at least one
            if dep.name not in placed and placed.issuperset(dep.depends_on):
                out.append(dep)
                placed.add(dep.name)
    return out


def _find_cycle(by_name: Mapping[str, Dependent]) -> list[str]:
    """One cycle of the ``depends_on`` graph as a closed path, or ``[]``."""
    visiting: list[str] = []
    done: set[str] = set()

    def visit(name: str) -> list[str]:
        if name in visiting:
            return visiting[visiting.index(name):] + [name]
        if name in done:
            return []
        visiting.append(name)
        for parent in by_name[name].depends_on:
            found = visit(parent)
            if found:
                return found
        visiting.pop()
        done.add(name)
        return []

    for name in by_name:
        found = visit(name)
        if found:
            return found
    return []


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
        children = self._children(ctx, fresh=bool(unwanted))
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
            self._report(ctx, progress)
        return progress

    def cleanup(self, obj: Any, ctx: Context) -> Progress:
        """Delete every dependent in reverse order, each once those depending on it are gone.
        Its ``result`` asks to run again until the last is gone (so ``finalize`` keeps the
        finalizer until then)."""
        progress = Progress(recheck=self.recheck if self.recheck is not None else 5.0)
        self._delete(ctx, set(self._by_name), self._children(ctx, fresh=True), progress)
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

    def _children(self, ctx: Context, fresh: bool) -> dict[str, list[dict]]:
        """This object's children carrying the dependent label, by the label's value (a name
        no longer declared included): read through ``ctx`` (the cache: the workflow's kinds
        are owned), or with ``fresh`` from the api-server (one LIST per kind, by label)."""
        uid = ctx.obj["metadata"]["uid"]
        out: dict[str, list[dict]] = {}
        kinds = {(d.api_version, d.kind): d.plural for d in self.dependents}
        for (api_version, kind), plural in kinds.items():
            listed = (_list_fresh(ctx, api_version, kind, plural) if fresh
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

    def _report(self, ctx: Context, progress: Progress) -> None:
        for dep in self.dependents:
            state = progress.states.get(dep.name)
            if state == READY:
                ctx.set_condition(dep.condition, True, "Ready", f"{dep.kind} is ready")
            elif state == PENDING:
                ctx.set_condition(dep.condition, False, "NotReady",
                                  f"{dep.kind} applied, not ready yet")
            elif state == WAITING:
                waiting = [p for p in dep.depends_on if progress.states.get(p) != READY]
                ctx.set_condition(dep.condition, False, "Waiting",
                                  f"waiting for {', '.join(waiting)} to be ready")
            elif state == DELETING:
                ctx.set_condition(dep.condition, False, "Deleting", "not wanted; deleting")
            elif state == ABSENT:
                ctx.set_condition(dep.condition, False, "NotWanted", "not wanted")
        if progress.done:
            ctx.set_condition(SUMMARY_CONDITION, True, "AllReady", "every dependent is ready")
        else:
            ctx.set_condition(SUMMARY_CONDITION, False, "Progressing",
                              "not settled: " + ", ".join(progress.pending + progress.removed))
        ctx.patch_status(observed_generation=False)


def _list_fresh(ctx: Context, api_version: str, kind: str, plural: str | None) -> list[dict]:
    """The objects of a kind in the run's namespace that carry the dependent label, from the
    api-server (a read: no fence)."""
    gvr = ctx.lister.resource(api_version, kind, plural)
    listed = kube.request(ctx.api, "GET", gvr.path(ctx.key.namespace),
                          query={"labelSelector": LABEL})
    return list(listed.get("items") or [])


def _ref(child: Mapping) -> str:
    return f"{child.get('kind', '')}/{child['metadata']['name']}"


__all__ = ["ABSENT", "DELETING", "Dependent", "LABEL", "PENDING", "Progress", "READY",
           "WAITING", "Workflow", "order"]
