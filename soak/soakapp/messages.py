"""Every Celery message the soak's processes publish and every one a worker receives, counted
at the broker's edge (``$SOAK_MESSAGES``, one line each, ``O_APPEND``):
``publish <task id> <unix time> <key>...`` and ``receive <task id> <unix time>``.

The checker (``soak/check.py``) pairs them: a message published and never received was lost
by the broker (a Redis restart, a stale snapshot); each key it carried must have run after
it anyway (the reaper sends a lost key again) or its object be gone.
"""

from __future__ import annotations

import os
import time


def _append(line: str) -> None:
    path = os.environ.get("SOAK_MESSAGES")
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)


def keys_of(body) -> list[str]:
    """The keys a reconcile message carries (protocol 2 body: ``(args, kwargs, embed)``)."""
    try:
        kwargs = body[1] if isinstance(body, (list, tuple)) else {}
    except IndexError:
        return []
    if "key" in kwargs:
        return [kwargs["key"]]
    return [k for k, _token in kwargs.get("keys") or []]


def _published(sender=None, body=None, headers=None, **_kw) -> None:
    task_id = (headers or {}).get("id", "?")
    _append(" ".join([f"publish {task_id} {time.time():.6f}", *keys_of(body)]))


def _received(sender=None, request=None, **_kw) -> None:
    _append(f"receive {getattr(request, 'id', '?')} {time.time():.6f}")


def connect() -> None:
    if not os.environ.get("SOAK_MESSAGES"):
        return
    from celery.signals import before_task_publish, task_received

    before_task_publish.connect(_published, weak=False)
    task_received.connect(_received, weak=False)
