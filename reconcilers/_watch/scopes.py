"""What each deployment's watchers cover, kept in Redis beside the cache they share.

Every leading watcher announces its scope - each reconciler it runs and the namespaces it
watches (none listed: all) - under its Lease's name, which is one per deployment; a leader of
the same deployment with another scope replaces it. The union of every announced scope is
what some watcher covers. From it:

- a new leader drops the synced markers of namespaces its deployment no longer covers (and no
  other does), so runs there read the api-server - where a deleted object is a 404, ``gone`` -
  rather than a cache nobody keeps;
- and forgets their keys (``Forgetting``: at once, and again for a while, so a run in flight
  then is forgotten once it ends): nobody keeps their objects cached or sends their events,
  so retrying them would run for ever on what nobody maintains.

Only a change of a deployment's own scope forgets anything - never the mere absence of an
entry: Redis restarted empty knows no scope until each leader's next start, and a deployment
may only be restarting. ``forget(lease)`` removes the entry of one taken away for good.
"""

from __future__ import annotations

import json
import logging
from typing import Iterable

import time

from reconcilers._kube import cache
from reconcilers._queue import workqueue
from reconcilers._authoring.reconciler import Reconciler

log = logging.getLogger(__name__)

SCOPES_KEY = "operator:scopes"

Scope = dict[str, "list[str] | None"]  # reconciler -> namespaces (None: all)


def of(reconcilers: Iterable[type[Reconciler]], namespaces: list[str]) -> Scope:
    """What a watcher of ``reconcilers`` over ``namespaces`` (empty: all) covers."""
    return {cls.name(): (sorted(namespaces) if namespaces and cls.primary().namespaced
                         else None) for cls in reconcilers}


def announce(lease: str, scope: Scope) -> Scope | None:
    """Record ``scope`` for ``lease``'s deployment; returns the one it replaces, if any."""
    r = cache.get_redis()
    seconds, _ = r.time()  # one clock for every host: Redis's
    previous = r.hget(SCOPES_KEY, lease)
    r.hset(SCOPES_KEY, lease, json.dumps({"at": seconds, "reconcilers": scope}))
    return json.loads(previous)["reconcilers"] if previous else None


def forget(lease: str) -> None:
    cache.get_redis().hdel(SCOPES_KEY, lease)


def covered() -> dict[str, set[str] | None]:
    """Every reconciler some deployment covers, with the namespaces it is covered in (None:
    all of them)."""
    out: dict[str, set[str] | None] = {}
    for raw in cache.get_redis().hvals(SCOPES_KEY):
        try:
            entry = json.loads(raw)["reconcilers"]
        except (ValueError, KeyError, TypeError):
            log.warning("ignoring a malformed scope entry in %s: %r", SCOPES_KEY, raw[:200])
            continue
        for reconciler, namespaces in entry.items():
            if namespaces is None or out.get(reconciler, set()) is None:
                out[reconciler] = None
            else:
                out.setdefault(reconciler, set()).update(namespaces)  # type: ignore[union-attr]
    return out


def dropped(previous: Scope | None) -> dict[str, set[str | None]]:
    """The synced markers, by reconciler, ``previous`` kept that no announced scope (this
    deployment's new one included) keeps now: a namespace, or None for the marker of all
    namespaces once nobody watches them all."""
    if not previous:
        return {}
    now = covered()
    out: dict[str, set[str | None]] = {}
    for reconciler, namespaces in previous.items():
        if reconciler not in now or now[reconciler] is None:
            continue  # nobody covers it any more (left alone), or somebody covers it all
        kept: set[str] = now[reconciler]  # type: ignore[assignment]
        gone: set[str | None] = {None} if namespaces is None else set(namespaces) - kept
        if gone:
            out[reconciler] = gone
    return out


class Forgetting:
    """Forget the keys a new leader's deployment stopped covering (``dropped``): at once, and
    at each call for ``seconds`` more - a key running at first is forgotten once its run ends
    (runs end within their hard limit)."""

    def __init__(self, dropped: dict[str, set[str | None]], seconds: float = 180.0):
        self.kept = covered() if dropped else {}
        self.dropped = dropped
        self.until = time.monotonic() + seconds
        self.forgotten = 0

    def __call__(self, streams: object = None) -> None:
        if not self.dropped or time.monotonic() > self.until:
            return
        try:
            for reconciler, namespaces in self.dropped.items():
                if None in namespaces:  # it watched every namespace: all but what is kept
                    self.forgotten += workqueue.forget_outside(
                        {reconciler: self.kept.get(reconciler) or set()})
                else:
                    self.forgotten += workqueue.forget_in(reconciler, namespaces)
        except Exception as exc:  # the database down: the next call tries again
            log.warning("could not forget the keys of namespaces no longer watched: %s", exc)
