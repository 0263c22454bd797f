"""A LIST in pages - client-go's pager (``tools/pager``): ``limit`` items a request, each next
page asked for with the previous page's ``continue`` token, until none is left.

The rules: a continue token that expired mid-list (410 on a page after the first: a very slow
list) starts the list again in one unpaginated request, as client-go's pager does, rather
than paging for ever, and what the earlier pages gave is dropped. Every item goes through
``keep`` as its page arrives, so only what the caller keeps of it (the reflector: a sanitised
copy) outlives its page.
"""

from __future__ import annotations

import logging
from typing import Callable, Mapping

from reconcilers._kube import kube

log = logging.getLogger(__name__)


def list_pages(api: kube.ApiClient, path: str, query: Mapping[str, str], accept: str,
               page: int, keep: Callable[[dict], tuple[str, dict]]) -> tuple[dict[str, dict], str]:
    """Every item the LIST of ``path`` (with ``query``: its selectors) returns, as ``keep``
    makes it (``keep(item) -> (path, what to hold)``), and the list's resourceVersion.
    ``page``: items a request (0: all in one)."""
    kept: dict[str, dict] = {}
    token = ""
    while True:
        asked: dict = {"limit": page, **query} if page else dict(query)
        if token:
            asked["continue"] = token
        try:
            body = kube.request(api, "GET", path, query=asked, timeout=(10, 120), accept=accept)
        except kube.ApiError as exc:
            if exc.status != 410 or not token:
                raise
            log.info("%s: list continuation expired; listing in one request", path)
            kept.clear()
            token, page = "", 0
            continue
        for item in body.get("items") or []:
            where, obj = keep(item)
            kept[where] = obj
        token = (body.get("metadata") or {}).get("continue") or ""
        if not token:
            return kept, body["metadata"]["resourceVersion"]
