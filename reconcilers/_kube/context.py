"""``ctx``: what a reconcile gets besides the object - reads, writes, status, events.

A ``Context`` is one run's: its key and object, a logger bound to the key, and every write it
made, in order. Its reads are its ``Lister``'s (``lister``): from the shared cache when the
resource is watched (and its cache is synced), otherwise from the api-server. Its writes of
children are ``Children``'s (``children``); the writes of its own object - status, conditions,
finalizers - and its Events are here. Writes go to the api-server and carry the
resourceVersion read, so a write based on a stale copy fails with 409 Conflict and the key is
retried - client-go's "read from the cache, write to the api-server". Nothing here mutates a
cached object.

Every write ``ctx`` makes is fenced by the run's hold on its key (``fence``), twice:

- Before it is sent, the claim is checked (``_write``): refused once the run was abandoned
  (its key released for a retry) or its lease may have passed, and otherwise bounded by what
  is left of the lease - the call's own timeout, and the api-server's (its ``timeout``
  parameter), so neither waits past it.
- A write based on a copy the run read carries that copy's resourceVersion, and the
  api-server refuses it (409) if the object changed since: the status and finalizer patches
  here, and the writes of children as ``children`` says (``adopt``, ``create_or_update``'s
  patch, ``apply`` of a child that exists, ``delete``). So a run stopped between its check and
  its write - a paused process, a request held in the network, an abandoned thread's write in
  flight - cannot overwrite what a run that took its key over wrote.

Left with the check alone: a create (POST: the api-server refuses one whose name exists, the
only condition a create can have), ``apply`` of a child that did not exist when read,
``patch`` without a ``metadata.resourceVersion`` in its body, ``request`` without one of the
api-server's preconditions, and Events (a record of what happened, not state). A write sent
before the claim ended may still land after it, on an object no successor wrote since it was
read. Writes a reconciler makes past ``ctx`` (its own client, ``ctx.api`` directly) are not
fenced at all: make them through ``ctx.request``.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any, Callable, Iterable, Mapping

from reconcilers._kube import events, kube
from reconcilers._base.capability_levels import ACTIONS
from reconcilers._base.reconcile import Key
from reconcilers._base.vocab import GVR, CacheScope, Index, rfc3339
from reconcilers._kube.children import Children, is_subset
from reconcilers._kube.lister import Lister


# fence(): raises when the run may no longer write; otherwise the seconds its writes may still
# take (None: no bound).
Fence = Callable[[], "float | None"]


def fence_until(check: Callable[[], None], held_until: float) -> Fence:
    """The fence of a run that holds its key until ``held_until`` (local monotonic time):
    ``check`` raises once the hold is gone; otherwise the seconds left until then (None for
    a hold without end)."""

    def fence() -> float | None:
        check()
        if held_until == math.inf:
            return None
        left = held_until - time.monotonic()
        if left <= 0:
            check()  # the hold ran out since: raises now
        return max(left, 0.001)

    return fence


def _within(timeout: float | tuple[float, float], left: float) -> tuple[float, float]:
    """A call's ``(connect, read)`` timeout cut so that the two together end within
    ``left`` seconds."""
    connect, read = timeout if isinstance(timeout, tuple) else (timeout, timeout)
    connect = min(connect, left / 2)
    return connect, min(read, left - connect)


class KeyLogger(logging.LoggerAdapter):
    """A logger whose every line names the object key (and carries it as ``record.key``)."""

    def __init__(self, logger: logging.Logger, key: Key):
        super().__init__(logger, {"key": str(key)})

    def process(self, msg, kwargs):
        kwargs["extra"] = {**self.extra, **(kwargs.get("extra") or {})}
        return f"[{self.extra['key']}] {msg}", kwargs


class Context(Children):
    """Per-run helpers. ``ctx.log`` is a logger bound to the key; the writes of children
    are ``Children``'s."""

    def __init__(self, key: Key, obj: dict, *, primary: GVR,
                 watched: Mapping[tuple[str, str], GVR] | None = None,
                 api: kube.ApiClient | None = None, fence: Fence | None = None,
                 indexes: Iterable[Index] = (),
                 scopes: Mapping[tuple[str, str], CacheScope] | None = None):
        """``watched``: the resources the watcher caches for this reconciler, by
        ``(apiVersion, kind)``; reads of those come from the shared cache. ``fence`` raises
        when this run may no longer write (its key's lease ran out), and otherwise returns
        how many seconds a write may still take (``fence_until``). ``indexes``: the
        reconciler's ``Index`` declarations, for ``list(index=...)``. ``scopes``: what the
        watcher caches of each watched resource (default: everything, in full)."""
        self._fence = fence or (lambda: None)
        self.key = key
        self.obj = obj
        self.api = api or kube.api_client()
        self.primary = primary
        self.log = KeyLogger(logging.getLogger(f"reconcilers.{key.reconciler}"), key)
        self.events: list[dict] = []
        # Every write the run made, ``(method, path, body)``, in order (reconcilers.testing
        # shows them to a test).
        self.writes: list[tuple[str, str, Any]] = []
        # Children this run created or changed (a no-op apply is not a change).
        self.changed_children: list[str] = []
        # Capability actions the reconciler reported (``capability``).
        self.capabilities: list[dict] = []
        self.lister = Lister(self.api, watched or {(primary.api_version, primary.kind): primary},
                             indexes, scopes)
        self._conditions: dict[str, dict] = {}

    def _write(self, method: str, path: str, body: Any, **kwargs) -> dict:
        """Every write of a run: fenced first, so a run past its lease never acts, and given
        no more time than its lease has left - checked, then a 30 s call, could land long
        after another run took the key."""
        left = self._fence()
        if left is not None:
            kwargs["timeout"] = _within(kwargs.get("timeout", 30), left)
            # The api-server's own deadline for the call (its request timeout filter).
            kwargs["query"] = {**(kwargs.get("query") or {}), "timeout": f"{left:.3f}s"}
        result = kube.request(self.api, method, path, body, **kwargs)
        self.writes.append((method, path, body))
        return result

    def request(self, method: str, path: str, body: Any = None, **kwargs) -> dict:
        """Any other api-server write (``kube.request``'s arguments: ``query``,
        ``content_type``...), fenced like ``ctx``'s own: refused once the run's lease may be
        gone, and bounded by what is left of it. Use it rather than ``ctx.api`` for writes
        ``ctx`` has no helper for; reads need no fence."""
        return self._write(method, path, body, **kwargs)

    # --- reads ---------------------------------------------------------------------------

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None,
            plural: str | None = None) -> dict | None:
        """The object (in this object's namespace unless ``namespace`` says otherwise), or
        None when it does not exist; see ``Lister.get``."""
        ns = namespace if namespace is not None else self.key.namespace
        return self.lister.get(api_version, kind, name, ns, plural)

    def list(self, api_version: str, kind: str, namespace: str | None = None,
             labels: Mapping[str, str] | None = None, index: tuple[str, str] | None = None,
             plural: str | None = None) -> list[dict]:
        """Objects of a kind - in this object's namespace by default (``""``: all) - with
        these ``labels``, filed under ``index=(name, value)``; see ``Lister.list``."""
        ns = namespace if namespace is not None else self.key.namespace
        return self.lister.list(api_version, kind, ns, labels=labels, index=index,
                                plural=plural)

    # --- capability evidence -------------------------------------------------------------------

    def capability(self, action: str, detail: str = "") -> None:
        """Say that this run did a capability action - ``upgrade`` (the operand to a new
        version), ``backup``, ``restore``, ``failover``, ``failback``, ``scale-members``,
        ``auto-scaling``, ``auto-tuning`` - with what it did in ``detail``. Kept with the run
        in history; a successful run that reports one is the evidence for its capability
        level (see the admin's Reconcilers page). Call it where the action happens, not on
        every run."""
        if action not in ACTIONS:
            raise ValueError(f"unknown capability action {action!r}; one of: "
                             f"{', '.join(sorted(ACTIONS))}")
        self.capabilities.append({"action": action, "detail": str(detail)[:500]})

    # --- status ----------------------------------------------------------------------------

    def set_condition(self, type_: str, status: bool | str, reason: str, message: str = "") -> None:
        """A metav1.Condition to write with the next ``patch_status``.

        ``lastTransitionTime`` changes only when the status flips, as the convention requires.
        """
        status_str = status if isinstance(status, str) else ("True" if status else "False")
        old = {c.get("type"): c for c in (self.obj.get("status") or {}).get("conditions") or []}
        previous = old.get(type_)
        changed = previous is None or previous.get("status") != status_str
        self._conditions[type_] = {
            "type": type_, "status": status_str, "reason": reason, "message": message,
            "observedGeneration": self.obj["metadata"].get("generation"),
            "lastTransitionTime": rfc3339() if changed else previous["lastTransitionTime"],
        }

    def patch_status(self, status: Mapping | None = None, observed_generation: bool = True) -> dict:
        """Merge-patch the status subresource with the fields given, conditions set with
        ``set_condition`` and ``observedGeneration``. Skipped when nothing would change.
        A stale object (someone wrote since it was read) gets 409 and the key is retried."""
        patch: dict[str, Any] = dict(status or {})
        if observed_generation and "generation" in self.obj["metadata"]:
            patch["observedGeneration"] = self.obj["metadata"]["generation"]
        if self._conditions:
            merged = {c["type"]: c for c in (self.obj.get("status") or {}).get("conditions") or []}
            merged.update(self._conditions)
            patch["conditions"] = list(merged.values())
        current = self.obj.get("status") or {}
        if is_subset(patch, current):
            return self.obj
        body = {"metadata": {"resourceVersion": self.obj["metadata"]["resourceVersion"]},
                "status": patch}
        updated = self._write("PATCH",
                               self.primary.path(self.key.namespace, self.key.name) + "/status",
                               body, content_type=kube.MERGE_PATCH)
        self.obj = updated
        self._conditions.clear()
        return updated

    # --- events ----------------------------------------------------------------------------

    def event(self, type_: str, reason: str, message: str) -> None:
        """A Kubernetes Event on the object (``Normal`` or ``Warning``), aggregated so an error
        loop cannot flood the api-server, and kept in this run's history."""
        self.events.append({"type": type_, "reason": reason, "message": message})
        self._fence()
        events.record(self.api, self.obj, type_, reason, message)

    # --- finalizers --------------------------------------------------------------------------

    def _patch_finalizers(self, finalizers: list[str]) -> dict:
        body = {"metadata": {"finalizers": finalizers,
                             "resourceVersion": self.obj["metadata"]["resourceVersion"]}}
        self.obj = self._write("PATCH",
                                self.primary.path(self.key.namespace, self.key.name), body,
                                content_type=kube.MERGE_PATCH)
        return self.obj

    def add_finalizer(self, name: str) -> None:
        current = list(self.obj["metadata"].get("finalizers") or [])
        if name not in current:
            self._patch_finalizers(current + [name])

    def remove_finalizer(self, name: str) -> None:
        current = list(self.obj["metadata"].get("finalizers") or [])
        if name in current:
            self._patch_finalizers([f for f in current if f != name])
