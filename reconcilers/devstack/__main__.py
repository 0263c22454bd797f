"""``python -m devstack up|down|status|env`` - the commands behind ``make up`` / ``make down``."""

from __future__ import annotations

import argparse
import sys

from . import config, controlplane, services
from .process import StartError, read_pid


def write_env(cfg: config.StackConfig) -> None:
    bins = controlplane.binary_dir()
    cfg.env_file.write_text(
        f"KUBECONFIG={cfg.kubeconfig}\n"
        f"DATABASE_URL={cfg.database_url}\n"
        f"REDIS_URL={cfg.redis_url}\n"
        f"OPERATOR_CONTROL_PLANE_BIN={bins}\n"
        # The local stack is for development and tests only.
        "DEBUG=1\n"
        "OPERATOR_SAMPLES=1\n"
    )


def up(cfg: config.StackConfig) -> None:
    cfg.state_dir.mkdir(parents=True, exist_ok=True)
    services.ensure_packages()
    services.start_postgres(cfg)
    services.start_redis(cfg)
    controlplane.start(cfg)
    write_env(cfg)
    print(f"stack up; connection settings in {cfg.env_file}")


def down(cfg: config.StackConfig) -> None:
    stopped = controlplane.stop_all(cfg)
    if services.stop_redis(cfg):
        stopped.append("redis")
    if services.stop_postgres(cfg):
        stopped.append("postgres")
    print("stopped: " + (", ".join(stopped) or "nothing was running"))


def status(cfg: config.StackConfig) -> int:
    names = ["postgres", "redis", "etcd", "kube-apiserver", "kube-controller-manager"]
    down_ = 0
    for name in names:
        pid = read_pid(cfg.run_dir / f"{name}.pid")
        print(f"{name:26} {'running pid ' + str(pid) if pid else 'stopped'}")
        down_ += pid is None
    return 1 if down_ else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devstack", description=__doc__)
    parser.add_argument("command", choices=["up", "down", "status", "build"])
    args = parser.parse_args(argv)
    cfg = config.load()
    try:
        if args.command == "up":
            up(cfg)
        elif args.command == "down":
            down(cfg)
        elif args.command == "status":
            return status(cfg)
        elif args.command == "build":
            print(controlplane.binary_dir())
    except StartError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
