"""The whole local stack as one thing: bring it up, say how to reach it, take it down."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from . import controlplane, services
from .config import StackConfig
from .process import StartError, read_pid

SERVICES = ("postgres", "redis", "etcd", "kube-apiserver", "kube-controller-manager",
            "kube-scheduler", "kwok")


def environment(cfg: StackConfig) -> dict[str, str]:
    """What a process needs to use the stack: the variables ``.local/env`` holds."""
    return {
        "KUBECONFIG": str(cfg.kubeconfig),
        "DATABASE_URL": cfg.database_url,
        "REDIS_URL": cfg.redis_url,
        "OPERATOR_CONTROL_PLANE_BIN": str(controlplane.binary_dir()),
        # The local stack is for development and tests only.
        "DEBUG": "1",
        "OPERATOR_SAMPLES": "1",
    }


def up(cfg: StackConfig) -> dict[str, str]:
    """Start whatever is not running yet (installing and building what is missing) and write
    ``env`` in the state directory; returns the same variables."""
    cfg.state_dir.mkdir(parents=True, exist_ok=True)
    services.ensure_packages()
    services.start_postgres(cfg)
    services.start_redis(cfg)
    controlplane.start(cfg)
    env = environment(cfg)
    cfg.env_file.write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    return env


def down(cfg: StackConfig, purge: bool = False) -> list[str]:
    """Stop every service; ``purge`` also deletes their data (the next ``up`` starts empty)."""
    stopped = controlplane.stop_all(cfg)
    if services.stop_redis(cfg):
        stopped.append("redis")
    if services.stop_postgres(cfg):
        stopped.append("postgres")
    if purge:
        for path in (services.pg_data_dir(cfg), cfg.state_dir):
            _remove(path)
    return stopped


def _remove(path: Path, timeout: float = 15) -> None:
    """A stopped service may still be flushing its last files for a moment: retry."""
    deadline = time.monotonic() + timeout
    while path.exists():
        shutil.rmtree(path, ignore_errors=True)
        if time.monotonic() > deadline:
            raise StartError(f"could not remove {path}")
        time.sleep(0.2)


def status(cfg: StackConfig) -> dict[str, int | None]:
    """Each service's pid, or None when it is not running."""
    return {name: read_pid(cfg.run_dir / f"{name}.pid") for name in SERVICES}
