"""What a run's kept inputs may hold of a Secret: its keys, never its values.

A run's inputs (``inputs``) are stored in the database and printed into regression tests
meant for a repository (``replay.regression_test``), so the data of a core/v1 Secret - and of
any kind ``RECONCILERS_REDACT_KINDS`` adds - is redacted before they are stored: in every
``ctx.get`` answer, every ``ctx.list`` answer's items, the object the run read, and the
bodies of its writes. Of such an object ``apiVersion``, ``kind`` and ``metadata`` are kept
as they were, except the last-applied annotation (``kubectl apply`` copies the whole object,
data included, into it); everything else keeps its keys, at every depth, and each value
becomes ``REDACTED`` (a null stays null: it carries nothing, and in a merge patch it means
"remove"). A replay then runs on the keys; code that uses a value sees the marker.

An object is known by its own ``apiVersion`` and ``kind``, else by the read that answered
it; a write by its body's, else by its path (a merge patch names neither), whose resource is
the kind's conventional plural (``plural``).
"""

from __future__ import annotations

import copy
from typing import Any, Collection, Mapping

from reconcilers._base.conf import settings
from reconcilers._base.vocab import plural
from reconcilers._kube.cache import LAST_APPLIED

REDACTED = "<redacted>"

# Kept as read: what names an object and says what it is.
_KEPT = ("apiVersion", "kind")


class Redaction:
    """Redacts the objects of ``kinds`` (``(apiVersion, kind)`` pairs) from a run's reads and
    writes; returns what it is given unchanged when nothing in it is of those kinds."""

    def __init__(self, kinds: Collection[tuple[str, str]]):
        self.kinds = frozenset(kinds)
        # A write is known by its path's resource: (group, version, plural).
        self._resources = frozenset(
            (api_version.rpartition("/")[0], api_version.rpartition("/")[2], plural(kind))
            for api_version, kind in self.kinds)

    @classmethod
    def configured(cls) -> "Redaction":
        """Secrets, and the kinds ``RECONCILERS_REDACT_KINDS`` names."""
        return cls(settings().redacted_kinds)

    def object(self, obj: Any, api_version: str | None = None, kind: str | None = None) -> Any:
        """``obj`` redacted if it is of a redacted kind (its own ``apiVersion`` and ``kind``,
        else those given)."""
        if not isinstance(obj, Mapping):
            return obj
        if (obj.get("apiVersion") or api_version, obj.get("kind") or kind) not in self.kinds:
            return obj
        return _redacted(obj)

    def read(self, read: dict) -> dict:
        """A noted read (``{"read", "args", "result"}``) with its answer redacted: the
        arguments of ``get`` and ``list`` both begin with apiVersion and kind."""
        api_version, kind = (list(read.get("args") or []) + [None, None])[:2]
        result = read.get("result")
        if isinstance(result, list):
            redacted: Any = [self.object(o, api_version, kind) for o in result]
        else:
            redacted = self.object(result, api_version, kind)
        return {**read, "result": redacted}

    def write(self, write: dict) -> dict:
        """A write (``{"method", "path", "body"}``) with its body redacted when it goes to
        a redacted kind."""
        body = write.get("body")
        if body is None:
            return write
        if isinstance(body, Mapping) and (body.get("apiVersion"), body.get("kind")) in self.kinds:
            return {**write, "body": _redacted(body)}
        if _resource_of(str(write.get("path") or "")) not in self._resources:
            return write
        if isinstance(body, Mapping):  # a merge patch, or a body that names no kind
            return {**write, "body": _redacted(body)}
        if isinstance(body, list):  # a JSON patch (RFC 6902)
            return {**write, "body": [_operation(op) for op in body]}
        return {**write, "body": REDACTED}  # YAML or bytes: nothing to keep apart


def _redacted(obj: Mapping) -> dict:
    out: dict = {}
    for key, value in obj.items():
        if key in _KEPT:
            out[key] = copy.deepcopy(value)
        elif key == "metadata" and isinstance(value, Mapping):
            out[key] = _metadata(value)
        else:
            out[key] = _hidden(value)
    return out


def _metadata(meta: Mapping) -> dict:
    out = copy.deepcopy(dict(meta))
    annotations = out.get("annotations")
    if isinstance(annotations, dict) and LAST_APPLIED in annotations:
        annotations[LAST_APPLIED] = REDACTED
    return out


def _hidden(value: Any) -> Any:
    """The keys of ``value`` at every depth, each value the marker."""
    if isinstance(value, Mapping):
        return {k: _hidden(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_hidden(v) for v in value]
    return None if value is None else REDACTED


def _operation(op: Any) -> Any:
    """A JSON patch operation's value, redacted as the part of an object its path puts it
    in (``/data/password``, ``/metadata/annotations/...``)."""
    if not isinstance(op, Mapping) or "value" not in op:
        return op
    segments = [s.replace("~1", "/").replace("~0", "~")
                for s in str(op.get("path") or "").split("/")[1:]]
    whole: Any = op["value"]
    for segment in reversed(segments):
        whole = {segment: whole}
    part: Any = _redacted(whole) if isinstance(whole, Mapping) else _hidden(whole)
    for segment in segments:
        part = part[segment]
    return {**op, "value": part}


def _resource_of(path: str) -> tuple[str, str, str] | None:
    """``(group, version, plural)`` of an api-server path: ``/api/v1/namespaces/ns/secrets/x``
    is ``("", "v1", "secrets")``."""
    parts = path.split("?", 1)[0].strip("/").split("/")
    if parts[0] == "api" and len(parts) >= 3:
        group, version, rest = "", parts[1], parts[2:]
    elif parts[0] == "apis" and len(parts) >= 4:
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    if rest[0] == "namespaces" and len(rest) >= 3:
        rest = rest[2:]
    return group, version, rest[0]
