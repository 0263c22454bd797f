"""Label and field selectors in the api-server's text syntax, matched against an object.

Pure data: what the fake cluster (``fake``) filters a list by. A label selector is
comma-separated requirements, all of which must hold: ``k=v`` / ``k==v``, ``k!=v`` (true when
the label is missing too), ``k in (a,b)``, ``k notin (a,b)`` (true when missing), ``k``
(exists) and ``!k`` (does not). A field selector is ``field=value`` / ``==`` / ``!=`` over the
fields the caller offers; any other field is refused as the api-server refuses it (400).
"""

from __future__ import annotations

import re
from typing import Mapping

from reconcilers._kube.fakefields import Refused

_SET = re.compile(r"^\s*([^\s!=(),]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")
_EQUALITY = re.compile(r"^\s*([^\s!=(),]+)\s*(==|=|!=)\s*([^\s!=(),]*)\s*$")
_EXISTS = re.compile(r"^\s*(!?)\s*([^\s!=(),]+)\s*$")


def _terms(selector: str) -> list[str]:
    """The requirements of a selector: split on commas outside parentheses."""
    terms, depth, current = [], 0, ""
    for char in selector:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += char
    if current.strip():
        terms.append(current)
    return [t for t in terms if t.strip()]


def matches_labels(selector: str, labels: Mapping[str, str]) -> bool:
    """True when ``labels`` satisfy every requirement of ``selector`` (an empty one: all)."""
    for term in _terms(selector):
        if m := _SET.match(term):
            key, op, values = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",")}
            if (op == "in") != (labels.get(key) in values if key in labels else False):
                return False
        elif m := _EQUALITY.match(term):
            key, op, value = m.groups()
            equal = key in labels and labels[key] == value
            if equal == (op == "!="):
                return False
        elif m := _EXISTS.match(term):
            if (m.group(2) in labels) == bool(m.group(1)):
                return False
        else:
            raise Refused(400, "BadRequest", f"unable to parse requirement: {term!r}")
    return True


def matches_fields(selector: str, fields: Mapping[str, str]) -> bool:
    """True when ``fields`` satisfy every ``field=value`` / ``field!=value`` of ``selector``."""
    for term in _terms(selector):
        m = _EQUALITY.match(term)
        if m is None:
            raise Refused(400, "BadRequest", f"invalid selector: {selector!r}")
        field, op, value = m.groups()
        if field not in fields:
            raise Refused(400, "BadRequest", f'field label not supported: {field}')
        if (fields[field] == value) == (op == "!="):
            return False
    return True
