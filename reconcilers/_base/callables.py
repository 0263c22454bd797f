"""How many positional arguments an author's function takes - for the hooks that may be
written with or without their optional last argument (``desired(obj)`` or
``desired(obj, ctx)``; ``map(obj)`` or ``map(obj, lister)``), so each is called the way it
was written.
"""

from __future__ import annotations

import functools
import inspect
from typing import Callable


@functools.lru_cache(maxsize=None)
def positional_count(func: Callable) -> int:
    """The positional parameters ``func`` names (``*args`` not counted); cached, as hooks are
    called for every object."""
    return sum(1 for p in inspect.signature(func).parameters.values()
               if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))
