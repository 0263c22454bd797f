"""Celery tasks: thin adapters from a message to plain-Python operator code."""

from __future__ import annotations

import os
import socket
import time

from celery import shared_task

from .cache import get_redis

HEARTBEAT_KEY = "operator:heartbeat:worker"


@shared_task(name="reconcilers.heartbeat", ignore_result=True)
def heartbeat() -> None:
    """Record that a worker consumed a message; the worker health check reads it."""
    get_redis().hset(HEARTBEAT_KEY, f"{socket.gethostname()}:{os.getpid()}", time.time())
