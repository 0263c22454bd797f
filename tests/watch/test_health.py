"""The watcher's ``manage.py health`` (``_watch.health``): its heartbeat in the real Redis,
fresh, stale or another process's."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from reconcilers._watch import health as watcher

REPO = Path(__file__).resolve().parents[2]


def _manage_health(*args: str) -> subprocess.CompletedProcess:
    from django.conf import settings

    env = {**os.environ, "REDIS_URL": settings.REDIS_URL}
    return subprocess.run([sys.executable, "manage.py", "health", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)


def test_watcher_is_healthy_while_its_heartbeat_is_fresh(redis_client):
    pid = os.getpid()
    redis_client.hset(watcher.WATCHER_HEARTBEAT_KEY, watcher.watcher_field(pid) + ":0a1b2c3d", time.time())

    result = _manage_health("watcher", "--pid", str(pid))

    assert result.returncode == 0, result.stderr
    assert "watcher healthy" in result.stdout


def test_watcher_is_unhealthy_when_its_heartbeat_is_stale(redis_client):
    pid = os.getpid()
    redis_client.hset(watcher.WATCHER_HEARTBEAT_KEY, watcher.watcher_field(pid) + ":0a1b2c3d", time.time() - 120)

    result = _manage_health("watcher", "--pid", str(pid), "--max-age", "30")

    assert result.returncode != 0
    assert "s old (max 30s)" in result.stderr


def test_watcher_is_unhealthy_without_its_own_heartbeat(redis_client):
    # Another process's fresh heartbeat does not make this one healthy.
    redis_client.hset(watcher.WATCHER_HEARTBEAT_KEY, watcher.watcher_field(1) + ":0a1b2c3d", time.time())

    with pytest.raises(CommandError, match="no heartbeat from"):
        call_command("health", "watcher", "--pid", str(os.getpid()))


def test_the_heartbeat_hash_forgets_watchers_long_gone(redis_client):
    import time

    redis_client.hset(watcher.WATCHER_HEARTBEAT_KEY, "host:1:gone", time.time() - watcher.HEARTBEAT_KEPT - 5)
    redis_client.hset(watcher.WATCHER_HEARTBEAT_KEY, "host:2:recent", time.time() - 30)
    watcher._beats = 0
    watcher.heartbeat("host:3:me")
    assert set(redis_client.hkeys(watcher.WATCHER_HEARTBEAT_KEY)) == {b"host:2:recent", b"host:3:me"}
