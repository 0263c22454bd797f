"""Old public names kept importable for one release after a rename, each with a warning.

A door sets ``__getattr__ = renamed.lookup(__name__, globals(), {"Old": "New"})``: Python asks
a module's ``__getattr__`` only for names it does not hold, so current names cost nothing.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Mapping


def lookup(module: str, names: Mapping[str, Any], renamed: Mapping[str, str]
           ) -> Callable[[str], Any]:
    """A module ``__getattr__`` answering each old name of ``renamed`` with its successor in
    ``names`` (the module's globals) and a ``DeprecationWarning`` naming both."""
    def __getattr__(name: str) -> Any:
        if name in renamed:
            new = renamed[name]
            warnings.warn(f"{module}.{name} is renamed {module}.{new}; the old name goes in "
                          f"the next release", DeprecationWarning, stacklevel=2)
            return names[new]
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    return __getattr__
