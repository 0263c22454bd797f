"""The ``Reconciler`` base class: what a reconciler declares, read like a ``ModelAdmin``.

Subclass it, set the class attributes, implement ``reconcile(obj, ctx)`` (and optionally
``finalize(obj, ctx)``), and register it with ``@register``. Everything the engine needs to
know - which resource to watch, what it owns, how to retry - is read from these attributes.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, ClassVar, Sequence

from reconcilers._base.predicates import Predicate, check
from reconcilers._base.vocab import GVR, CacheScope, Index, Owns, Watches, plural

if TYPE_CHECKING:  # pragma: no cover
    from reconcilers._kube.context import Context
    from reconcilers._base.reconcile import Result

# A reconciler's own name begins every key (``<reconciler>:<namespace>/<object>``) and task
# id (``<key>#<token>``), is in admin URLs, and is the name part of its default finalizer
# (``<plural>.<group>/<name>``): so what a finalizer's name part may be, lower-cased - at most
# 63 letters, digits, '-' and '.', starting and ending with a letter or digit; never ':', '/'
# or '#'.
NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?")


def valid_name(name: str, owner: str) -> str:
    """``name`` when it may name a reconciler, else a ``TypeError`` saying why."""
    if not NAME.fullmatch(name):
        raise TypeError(
            f"{owner}.name = {name!r} is not a valid reconciler name: use at most 63 lower-case "
            f"letters, digits, '-' and '.', starting and ending with a letter or digit (it is "
            f"part of every key '<reconciler>:<namespace>/<name>' and of the finalizer name)")
    return name


class Reconciler:
    """Base class of every reconciler.

    Declare either ``resource`` (a typed resource class) or ``group``/``version``/``kind``.

    Attributes:
        name: the reconciler's own name, for a second reconciler of a kind (``"pod-labeller"``;
            ``valid_name``). It keys everything of this reconciler - the ledger, history,
            metrics, the admin, ``manage.py`` commands - so two reconcilers of one kind each
            keep their own; they share the kind's watch stream and cache. Default: the
            primary resource's ``<plural>.<group>``, as a CRD is named.
        group, version, kind, plural, namespaced: the primary resource.
        owns: child resources (``Owns(...)``) whose changes reconcile their controller owner.
        watches: related resources (``Watches(..., map=func)``) whose changes reconcile the
            objects ``func`` names.
        indexes: named indexes (``Index(...)``) over the primary, owned or watched resources,
            kept by the watcher in the shared cache; ``ctx.list(..., index=(name, value))``.
        predicates: ``(old, new) -> bool`` filters for update events of the primary resource
            (see ``predicates``); each ``Owns`` and ``Watches`` takes its own.
        finalizer: the finalizer name; set automatically when the class defines ``finalize``
            (``<plural>.<group>/finalizer``, or ``<plural>.<group>/<name>`` for a reconciler
            with a ``name`` of its own, so each reconciler of a kind holds the object for its
            own cleanup). Cleanup runs before the object may go away.
        resync_period: seconds between periodic re-reconciles of every object (None: the
            ``RECONCILERS_RESYNC_PERIOD`` default; 0: never).
        rate_limit: Celery rate limit of this reconciler's task, e.g. ``"10/s"`` (per worker).
        shared_rate_limit: the same notation, across every worker (one token bucket in Redis,
            as client-go's per controller; ``ratelimit``).
        queue: Celery queue of this reconciler's task (default ``celery``).
        backoff_base, backoff_max: per-key retry backoff in seconds (default 5 ms -> 1000 s).
        debounce: seconds to gather changes before a re-run (default 0: at once). The first
            change of a quiet object runs at once; changes that arrive while it runs (or waits)
            are merged into one run this long after it ends - a burst of updates costs a few
            runs, the last one on the final generation, for that much added latency.
        timeout: the run deadline in seconds (default ``RECONCILERS_LEASE_SECONDS``): past it
            user code is interrupted and the run recorded as an error with backoff; a run still
            going at the hard limit is abandoned (thread pool) or its process ended (prefork).
        capability_level: the Operator SDK level (1-5) this operator claims.
        metrics: names of the Prometheus metric families this operator exposes about its
            operand or its own health (``prometheus_client`` in your app); a scrape serving
            one is level 4's metrics evidence - the framework's own series are not.
        rbac_rules: extra rules ``manage.py rbac`` adds (e.g. reading Secrets): in the
            ClusterRole, or - watching some namespaces - in each one's Role (those on
            cluster-scoped resources stay in the ClusterRole; ``rbac.CLUSTER_SCOPED``).
    """

    resource: ClassVar[Any] = None
    group: ClassVar[str] = ""
    version: ClassVar[str] = ""
    kind: ClassVar[str] = ""
    plural: ClassVar[str | None] = None
    namespaced: ClassVar[bool] = True
    owns: ClassVar[Sequence[Owns]] = ()
    watches: ClassVar[Sequence[Watches]] = ()
    indexes: ClassVar[Sequence[Index]] = ()
    predicates: ClassVar[Sequence[Predicate]] = ()
    finalizer: ClassVar[str | None] = None
    resync_period: ClassVar[float | None] = None
    rate_limit: ClassVar[str | None] = None
    shared_rate_limit: ClassVar[str | None] = None
    queue: ClassVar[str | None] = None
    backoff_base: ClassVar[float | None] = None
    backoff_max: ClassVar[float | None] = None
    timeout: ClassVar[float | None] = None
    debounce: ClassVar[float] = 0.0
    capability_level: ClassVar[int] = 1
    metrics: ClassVar[Sequence[str]] = ()
    rbac_rules: ClassVar[Sequence[dict]] = ()

    # The ``name`` a class declared (``valid_name``), inherited by its subclasses; None: the
    # resource's name. Kept apart because ``name()`` is the one way every caller asks.
    _own_name: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Take a declared ``name`` and refuse predicates that could never work when the class
        is defined, not at the first event: the watcher would otherwise meet them on every
        change."""
        super().__init_subclass__(**kwargs)
        declared = cls.__dict__.get("name")
        if isinstance(declared, str):
            cls._own_name = valid_name(declared, cls.__name__)
            del cls.name  # ``name()`` (the base's classmethod) answers it from now on
        elif declared is not None and not isinstance(declared, (classmethod, staticmethod)):
            raise TypeError(f"{cls.__name__}.name must be a string, not {declared!r}")
        check(cls.predicates, f"{cls.__name__}.predicates")
        for related in (*cls.owns, *cls.watches):
            if hasattr(related, "predicates"):
                check(related.predicates, f"{cls.__name__}: {type(related).__name__}"
                                          f"({related.api_version!r}, {related.kind!r})")

    def reconcile(self, obj: dict, ctx: "Context") -> "Result | None":
        raise NotImplementedError(f"{type(self).__name__} must implement reconcile(obj, ctx)")

    # ``finalize(self, obj, ctx)`` is optional; defining it turns on finalizer handling.

    @classmethod
    def primary(cls) -> GVR:
        res = cls.resource
        if res is not None:
            meta = res._meta
            return GVR(meta.group, meta.storage_version.name, meta.plural, meta.kind,
                       meta.scope == "Namespaced")
        if not cls.version or not cls.kind:
            raise TypeError(f"{cls.__name__} declares neither resource nor version and kind")
        return GVR(cls.group, cls.version, cls.plural or plural(cls.kind), cls.kind,
                   cls.namespaced)

    @classmethod
    def watched(cls) -> dict[tuple[str, str], GVR]:
        """Every resource the watcher caches for this reconciler, by ``(apiVersion, kind)``."""
        out = {(w.api_version, w.kind): w.gvr() for w in cls.watches}
        out.update({(o.api_version, o.kind): o.gvr() for o in cls.owns})
        primary = cls.primary()
        out[(primary.api_version, primary.kind)] = primary
        return out

    @classmethod
    def cache_scopes(cls) -> dict[tuple[str, str], CacheScope]:
        """What the watcher caches of each watched resource, by ``(apiVersion, kind)``; the
        primary resource is always cached whole."""
        out = {(d.api_version, d.kind): d.scope() for d in (*cls.watches, *cls.owns)}
        primary = cls.primary()
        out[(primary.api_version, primary.kind)] = CacheScope()
        return out

    @classmethod
    def name(cls) -> str:
        """The reconciler's name: its declared ``name``, else its ``resource_name()``."""
        return cls._own_name or cls.resource_name()

    @classmethod
    def resource_name(cls) -> str:
        """The primary resource's name, as a CRD is named: ``<plural>.<group>`` (``<plural>``
        for the core group). Shared by every reconciler of the kind (its CRD file, RBAC)."""
        gvr = cls.primary()
        return f"{gvr.plural}.{gvr.group}" if gvr.group else gvr.plural

    @classmethod
    def finalizer_name(cls) -> str | None:
        """A finalizer of this reconciler's own: two reconcilers of one kind each hold the
        object until their own cleanup is done, so a reconciler with a ``name`` of its own
        names its finalizer after it; the default name keeps ``<plural>.<group>/finalizer``,
        which objects already carry."""
        if cls.finalizer:
            return cls.finalizer
        if callable(getattr(cls, "finalize", None)):
            gvr = cls.primary()
            return f"{gvr.plural}.{gvr.group or 'core'}/{cls._own_name or 'finalizer'}"
        return None
