"""One call of user code over one key: read the object, call the user's ``reconcile`` (or
``finalize``, or its timers) inside exception capture, and decide what follows.

``attempt`` is the one way user code runs: a worker's run (``runner``), a test's
(``reconcilers.testing.reconcile_once``) and a replay of a recorded run (``replay``) all go
through it, so whatever a run does around user code - the object read from the cache or the
api-server, finalizers, the typed status written back, exceptions turned into a ``Decision`` -
each of them does the same. It never raises for anything user code does, and it ends nothing:
ending the run (the ledger, the record) is the caller's.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Callable, Sequence

from reconcilers._authoring.reconciler import Reconciler
from reconcilers._authoring.registry import ReconcilerRegistry
from reconcilers._base.conf import Backoff
from reconcilers._base.reconcile import Decision, Key, Outcome, PermanentError, Result
from reconcilers._kube import cache, kube
from reconcilers._kube.context import Context
from reconcilers._kube.lister import Lister
from reconcilers._queue.decision import decide
from reconcilers._run import inputs, timers


@dataclass
class Seen:
    """What user code saw and did; filled as the run goes, so a crash keeps what it had."""

    obj: dict | None = None
    final: dict | None = None
    events: list = field(default_factory=list)
    phase: str = ""
    capabilities: list = field(default_factory=list)  # actions reported or seen
    read: dict | None = None  # a copy of ``obj`` as read, when the run's inputs are noted


def read_object(cls: type[Reconciler], key: Key, api: kube.ApiClient) -> dict | None:
    """The current object: from the cache once it is synced, else from the api-server.

    A miss in a synced cache is asked of the api-server before the run is ``gone``: Redis
    that went back in time (an older snapshot, a failover to a lagging replica) holds a
    synced marker over a cache without what was created since, until the watcher notices
    and relists (``epoch``). It costs one GET per deleted object's run."""
    gvr = cls.primary()
    namespace = key.namespace if gvr.namespaced else None
    if isinstance(api, kube.Offline):  # a test's fake cluster: no shared cache in front of it
        return kube.get_or_none(api, gvr.path(namespace, key.name))
    synced, obj = cache.get_if_synced(gvr, namespace, key.name)
    if synced and obj is not None:
        return obj
    return kube.get_or_none(api, gvr.path(namespace, key.name))


def invoke(reconciler: Reconciler, cls: type[Reconciler], obj: dict, ctx: Context,
           seen: Seen, triggers: Sequence[str] = ()) -> tuple[str, Result | None]:
    """Finalizer handling around the user's code. Returns (outcome if decided here, result).
    A run triggered only by timers calls them instead of ``reconcile``; with other triggers
    too, ``reconcile`` and then the timers (``timers``)."""
    finalizer = cls.finalizer_name()
    meta = obj["metadata"]
    if meta.get("deletionTimestamp"):
        if finalizer and finalizer in (meta.get("finalizers") or []):
            seen.phase = "finalize"
            result = reconciler.finalize(obj, ctx)  # type: ignore[attr-defined]
            if result is None or (not result.requeue and result.requeue_after is None):
                ctx.remove_finalizer(finalizer)
            return "", result
        return Outcome.SKIPPED, None
    fired = timers.fired(triggers)
    timers_only = bool(fired) and only_timers(triggers)
    seen.phase = "timer" if timers_only else "reconcile"
    if finalizer:
        ctx.add_finalizer(finalizer)
        obj = ctx.obj
    if cls.resource is None:
        result = None if timers_only else reconciler.reconcile(obj, ctx)
        timed = timers.run(reconciler, fired, obj, ctx) if fired else None
        return "", timed if timers_only else result
    typed = cls.resource(obj)
    result = None if timers_only else reconciler.reconcile(typed, ctx)
    if fired:
        timed = timers.run(reconciler, fired, typed, ctx)
        result = timed if timers_only else result
    status = typed.status_patch().get("status")
    if status or _observed_behind(ctx.obj):
        ctx.patch_status(status or {})  # observedGeneration rides along
    return "", result


def _observed_behind(obj: dict) -> bool:
    """The object's status tracks ``observedGeneration`` and names an older generation: a run
    that saw the newer spec says so even when no other status field changed."""
    observed = (obj.get("status") or {}).get("observedGeneration")
    return observed is not None and observed != (obj.get("metadata") or {}).get("generation")


def only_timers(triggers: Sequence[str]) -> bool:
    """Whether a run was triggered by its timers alone (``timers``)."""
    return bool(triggers) and all(t.startswith(timers.PREFIX) for t in triggers)


@dataclass(frozen=True)
class Attempt:
    """One pass of user code over one key, and the decision on what follows."""

    decision: Decision
    seen: Seen
    ctx: Context | None  # None when user code never ran (no object, no reconciler)
    error: BaseException | None


def attempt(key: Key, cls: type[Reconciler] | None, registry: ReconcilerRegistry, *, attempts: int,
            backoff: Backoff, api: kube.ApiClient | None = None,
            fence: Callable[[], None] | None = None, triggers: Sequence[str] = (),
            reads: Callable[[Lister], Lister] | None = None) -> Attempt:
    """Read the object, call the user's code, decide: what a worker does for a key it holds,
    what ``reconcilers.testing`` does for a test, and what ``replay`` does on a record's
    inputs. Never raises for anything user code does.

    ``reads``: a replay's reads answered from the record instead - given the lister ``ctx``
    would read through, the one it reads through (a replay keeps no inputs of its own).
    """
    seen, ctx = Seen(), None
    try:
        if cls is None:
            raise PermanentError(f"no reconciler named {key.reconciler!r} is registered here")
        api = api or kube.api_client()
        seen.obj = read_object(cls, key, api)
        if seen.obj is None:
            return Attempt(decide(attempts=attempts, backoff=backoff, decided=Outcome.GONE),
                           seen, None, None)
        ctx = Context(key, seen.obj, primary=cls.primary(), watched=cls.watched(), api=api,
                      fence=fence, indexes=cls.indexes, scopes=cls.cache_scopes())
        if reads is not None:
            ctx.lister = reads(ctx.lister)
        elif inputs.recording():  # for a replay of this run (``replay``): copies, before use
            seen.read, ctx.lister.reads = copy.deepcopy(seen.obj), []
        try:
            decided, result = invoke(registry.get(key.reconciler), cls, seen.obj, ctx, seen,
                                     triggers)
        finally:
            seen.events, seen.final = ctx.events, ctx.obj
            seen.capabilities = list(ctx.capabilities)
        return Attempt(decide(attempts=attempts, backoff=backoff, result=result,
                              decided=decided), seen, ctx, None)
    except (Exception, SystemExit) as exc:
        # SystemExit too: user code calling sys.exit() must not take the worker process (and
        # every run it would have done) down with it; it is an error of this run, retried.
        return Attempt(decide(attempts=attempts, backoff=backoff, error=exc), seen, ctx, exc)
