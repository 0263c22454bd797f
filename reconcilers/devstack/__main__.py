"""``python -m reconcilers.devstack up|down|status|build|run`` - behind ``make up`` / ``make down``.

``run CMD...`` brings the stack up and runs CMD with ``KUBECONFIG``, ``DATABASE_URL`` and
``REDIS_URL`` pointing at it (for example ``python -m reconcilers.devstack run pytest``).
"""

from __future__ import annotations

import argparse
import os
import sys

from . import config, controlplane, stack
from .process import StartError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reconcilers.devstack", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["up", "down", "status", "build", "run"])
    parser.add_argument("--purge", action="store_true",
                        help="down: also delete the services' data")
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["run"]:  # everything after `run` is the command, options included
        argv, command = argv[:1], argv[1:]
        command = command[1:] if command[:1] == ["--"] else command
    args = parser.parse_args(argv)
    cfg = config.load()
    try:
        if args.command == "up":
            stack.up(cfg)
            print(f"stack up; connection settings in {cfg.env_file}")
        elif args.command == "down":
            stopped = stack.down(cfg, purge=args.purge)
            print("stopped: " + (", ".join(stopped) or "nothing was running"))
        elif args.command == "status":
            pids = stack.status(cfg)
            for name, pid in pids.items():
                print(f"{name:26} {'running pid ' + str(pid) if pid else 'stopped'}")
            return 1 if None in pids.values() else 0
        elif args.command == "build":
            print(controlplane.binary_dir())
        elif args.command == "run":
            if not command:
                parser.error("run needs a command, e.g. `run pytest`")
            env = {**os.environ, **stack.up(cfg)}
            os.execvpe(command[0], command, env)
    except StartError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
