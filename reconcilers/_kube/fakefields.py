"""What the fake cluster (``fake``) does to an object's fields: patches and field ownership.

Pure data: no I/O, no store. Three patch types as the api-server applies them - a JSON merge
patch (RFC 7386), a JSON patch (RFC 6902) and a server-side apply with its field ownership
(``managedFields``) - and the fake's two errors: ``Refused``, which it answers as the
api-server's status code and reason, and ``NotModelled``, for what it does not model.

Field ownership works on sets of *field paths*: tuples of map keys down to a leaf. A list is
one leaf (an atomic list, what a CRD's list is unless its schema says otherwise) except the
two the api-server merges by key in every object: ``metadata.ownerReferences`` (by ``uid``,
a path element ``("k", uid)``) and ``metadata.finalizers`` (a set, ``("v", name)``). Lists
of built-in kinds that Kubernetes merges by key (a Pod's ``containers`` by name) are atomic
here: the fake's documentation says so.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonpatch
import jsonpointer

# Lists merged by a key (``("k", key value)``) or as sets (``("v", value)``), wherever they
# sit in an object's metadata.
KEYED = {("metadata", "ownerReferences"): "uid"}
SETS = {("metadata", "finalizers")}
# What an apply's body names without owning: the object's identity and its preconditions.
IDENTITY = {("apiVersion",), ("kind",), ("metadata", "name"), ("metadata", "namespace"),
            ("metadata", "uid"), ("metadata", "resourceVersion"),
            ("metadata", "managedFields"), ("metadata", "generation"),
            ("metadata", "creationTimestamp"), ("metadata", "deletionTimestamp")}

Path = tuple


class NotModelled(NotImplementedError):
    """A request the fake cluster does not answer as the api-server would: the message names
    what is not modelled. A test that meets it needs the real control plane."""


class Refused(Exception):
    """A request the api-server would refuse: its HTTP status, reason and message, and the
    causes its ``Status.details`` would carry."""

    def __init__(self, code: int, reason: str, message: str, causes: list | None = None):
        super().__init__(message)
        self.code, self.reason, self.message, self.causes = code, reason, message, causes or []


# --- JSON merge patch (RFC 7386) ---------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """``patch`` merged into ``target``: a null removes a key, a map merges, anything else
    (a list included) replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


# --- JSON patch (RFC 6902) ---------------------------------------------------------------


def json_patch(target: Any, operations: Any) -> Any:
    """The operations applied in order to a copy of ``target`` (python-json-patch); a failed
    ``test`` or a path that is not there refuses the whole patch (422, as the api-server
    answers it)."""
    if not isinstance(operations, list):
        raise Refused(400, "BadRequest", "a JSON patch is a list of operations")
    try:
        return jsonpatch.apply_patch(target, operations)  # a copy: in_place=False
    except jsonpatch.JsonPatchTestFailed as exc:
        raise Refused(422, "Invalid", "the server rejected our request due to an error in our "
                      f"request: {exc}") from None
    except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException, KeyError,
            IndexError, TypeError) as exc:
        raise Refused(422, "Invalid", "the server rejected our request due to an error in our "
                      f"request: {exc}") from None


# --- field paths -------------------------------------------------------------------------


def leaves(value: Any, path: Path = ()) -> set[Path]:
    """The field paths ``value`` sets (an empty map is a leaf of its own)."""
    if isinstance(value, dict) and value:
        out: set[Path] = set()
        for key, item in value.items():
            out |= leaves(item, path + (key,))
        return out
    if isinstance(value, list) and path in KEYED:
        key = KEYED[path]
        out = set()
        for item in value:
            if isinstance(item, dict) and key in item:
                out |= leaves(item, path + (("k", item[key]),))
        return out
    if isinstance(value, list) and path in SETS:
        return {path + (("v", item),) for item in value}
    return {path}


def owned(value: Any) -> set[Path]:
    """The field paths an apply of ``value`` owns: all but its identity."""
    return {p for p in leaves(value) if p[:2] not in IDENTITY and p[:1] not in IDENTITY}


_MISSING = object()


def value_at(obj: Any, path: Path) -> Any:
    """The value at ``path``, or ``_MISSING``."""
    node = obj
    for element in path:
        if isinstance(element, tuple):
            kind, wanted = element
            if not isinstance(node, list):
                return _MISSING
            if kind == "v":
                return wanted if wanted in node else _MISSING
            key = KEYED.get(_list_path(path, element))
            node = next((i for i in node if isinstance(i, dict) and i.get(key) == wanted),
                        _MISSING)
        elif isinstance(node, dict) and element in node:
            node = node[element]
        else:
            return _MISSING
        if node is _MISSING:
            return _MISSING
    return node


def _list_path(path: Path, element: tuple) -> Path:
    return path[:path.index(element)]


def remove_at(obj: dict, path: Path) -> None:
    """Remove the field at ``path`` (nothing when it is not there)."""
    *parents, last = path
    node = value_at(obj, tuple(parents))
    if node is _MISSING:
        return
    if isinstance(last, tuple):
        kind, wanted = last
        if isinstance(node, list):
            key = KEYED.get(tuple(path[:-1]))
            node[:] = [i for i in node if not (
                i == wanted if kind == "v" else isinstance(i, dict) and i.get(key) == wanted)]
    elif isinstance(node, dict):
        node.pop(last, None)


def apply_merge(live: Any, applied: Any, path: Path = ()) -> Any:
    """``applied`` laid over ``live`` as a server-side apply merges: maps field by field,
    keyed lists item by item, set lists as a union, anything else replaced."""
    if isinstance(applied, dict) and isinstance(live, dict):
        out = dict(live)
        for key, value in applied.items():
            out[key] = apply_merge(live.get(key), value, path + (key,))
        return out
    if isinstance(applied, list) and isinstance(live, list) and path in KEYED:
        key = KEYED[path]
        out = [copy.deepcopy(i) for i in live]
        for item in applied:
            at = next((n for n, i in enumerate(out) if isinstance(i, dict)
                       and isinstance(item, dict) and i.get(key) == item.get(key)), None)
            if at is None:
                out.append(copy.deepcopy(item))
            else:
                out[at] = apply_merge(out[at], item, path + (("k", item.get(key)),))
        return out
    if isinstance(applied, list) and isinstance(live, list) and path in SETS:
        return list(live) + [i for i in applied if i not in live]
    return copy.deepcopy(applied)


def apply(current: dict, applied: dict, ownership: dict[tuple, set], manager: str,
          force: bool) -> tuple[dict, dict[tuple, set]]:
    """``applied`` applied to ``current`` by ``manager``, and who owns what after it
    (``ownership``: field paths by ``(manager, operation, subresource)``).

    A field another manager owns with a different value is a conflict: 409 naming them all,
    unless ``force`` takes them over. A field this manager applied before and applies no
    longer is removed, unless another manager owns it too; a field whose value it applies as
    it already is becomes shared."""
    mine = (manager, "Apply", "")
    ownership = {k: set(v) for k, v in ownership.items()}
    new = owned(applied)
    conflicts: dict[str, list] = {}
    for other, paths in ownership.items():
        if other[0] == manager:
            continue
        for path in sorted(new & paths, key=repr):
            if value_at(applied, path) != value_at(current, path):
                conflicts.setdefault(other[0], []).append(path)
    if conflicts and not force:
        message, causes = conflicts_message(conflicts)
        raise Refused(409, "Conflict", message, causes)
    for other, paths in ownership.items():
        if other[0] in conflicts:
            paths -= set(conflicts[other[0]])
    wanted = copy.deepcopy(current)
    shared = set().union(*(p for o, p in ownership.items() if o != mine))
    for path in ownership.get(mine, set()) - new - shared:
        remove_at(wanted, path)
    meta = applied.get("metadata") or {}
    wanted = apply_merge(wanted, {k: v for k, v in applied.items() if k != "metadata"})
    wanted["metadata"] = apply_merge(
        wanted["metadata"], {k: v for k, v in meta.items()
                             if k not in ("uid", "resourceVersion", "managedFields")},
        ("metadata",))
    ownership[mine] = new
    return wanted, ownership


def changed(before: Any, after: Any) -> set[Path]:
    """The field paths whose value a write set or changed (what it comes to own)."""
    return {p for p in leaves(after) if value_at(before, p) != value_at(after, p)}


def removed(before: Any, after: Any) -> set[Path]:
    """The field paths a write took away."""
    return {p for p in leaves(before) if value_at(after, p) is _MISSING}


def fields_v1(paths: set[Path]) -> dict:
    """Field paths in the api-server's ``FieldsV1`` notation (``{"f:spec": {"f:replicas":
    {}}}``), as ``managedFields`` shows them."""
    tree: dict = {}
    for path in sorted(paths, key=repr):
        node = tree
        for element in path:
            if isinstance(element, tuple):
                kind, value = element
                label = f"v:{json.dumps(value)}" if kind == "v" else \
                    f"k:{json.dumps({'uid': value}, separators=(',', ':'))}"
                node = node.setdefault(label, {".": {}} if kind == "k" else {})
            else:
                node = node.setdefault(f"f:{element}", {})
    return tree


def conflicts_message(conflicts: dict[str, list[Path]]) -> tuple[str, list[dict]]:
    """The api-server's message and causes for an apply that conflicts with other managers."""
    causes = [{"reason": "FieldManagerConflict", "message": f'conflict with "{manager}"',
               "field": dotted(p)} for manager, paths in conflicts.items() for p in paths]
    count = len(causes)
    detail = "; ".join(f'conflict with "{m}": {", ".join(dotted(p) for p in ps)}'
                       for m, ps in conflicts.items())
    return (f"Apply failed with {count} conflict{'s' if count > 1 else ''}: {detail}",
            causes)


def dotted(path: Path) -> str:
    return "".join(f"[{e[0]}={e[1]}]" if isinstance(e, tuple) else f".{e}" for e in path)
