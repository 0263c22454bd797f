"""The soak's faults record what they did, seen from outside the command that injected them:
a Redis restart (empty, or from a stale snapshot) on a private Redis of the test's own, a
process stopped. A fault that did nothing records no effect - a silent fault."""

from __future__ import annotations

import random
import signal
import subprocess
import time
from types import SimpleNamespace

import pytest

from reconcilers.devstack import config, services
from soak import faults
from soak.toxiproxy import free_port


@pytest.fixture
def private_redis(tmp_path):
    """A Redis of the test's own, started as the stack starts its own."""
    cfg = config.StackConfig(state_dir=tmp_path, etcd_port=0, etcd_peer_port=0,
                             apiserver_port=0, postgres_port=0, redis_port=free_port())
    cfg.run_dir.mkdir()
    cfg.log_dir.mkdir()
    services.start_redis(cfg)
    recorded: list[faults.Injected] = []
    soak = SimpleNamespace(cfg=cfg, rng=random.Random(1), run_id="t-1", record=recorded.append)
    yield soak, recorded
    services.stop_redis(cfg)


def test_a_redis_restart_records_the_new_process(private_redis):
    soak, recorded = private_redis
    faults.restart_redis(soak)
    assert recorded[0].kind == "Redis restarted (empty)"
    assert recorded[0].effect and recorded[0].effect.startswith("redis: pid ")
    assert faults.silent(recorded) == []


def test_a_restart_that_restarted_nothing_is_silent(private_redis):
    soak, _recorded = private_redis
    assert faults._restarted(soak, "redis", lambda: None) is None


def test_a_stale_snapshot_records_that_redis_went_back_in_time(private_redis):
    import redis

    soak, recorded = private_redis
    faults.redis_stale_snapshot(soak)
    assert recorded[0].effect and "pid" in recorded[0].effect, recorded[0]
    assert not redis.Redis(port=soak.cfg.redis_port).exists("soak:t-1:after-the-snapshot")


def test_a_stopped_process_is_seen_stopped():
    proc = subprocess.Popen(["sleep", "30"])
    try:
        assert not faults._stopped(proc.pid)
        proc.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while not faults._stopped(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert faults._stopped(proc.pid)
    finally:
        proc.kill()
        proc.wait()
