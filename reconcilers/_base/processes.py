"""The processes running in this container, read from their command lines in ``/proc``.

The ``health`` command asks which worker node or watcher pid is "ours" here: under host
networking every container shares the host's name, so the name alone cannot tell scaled
replicas apart, while the command lines can. Each role reads what it needs from them
(``_run.health.local_worker_nodes``, ``_watch.health.local_watcher_pids``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator


def command_lines() -> Iterator[tuple[int, list[str]]]:
    """``(pid, argv)`` of every process this container sees, lowest pid first; a process
    gone while it is read, or one without a command line (a kernel thread), is left out."""
    for entry in sorted(Path("/proc").glob("[0-9]*"), key=lambda p: int(p.name)):
        try:
            raw = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if raw:
            yield int(entry.name), raw.decode(errors="replace").rstrip("\0").split("\0")


def is_python(argv: list[str]) -> bool:
    """The interpreter itself, not a wrapper that names it (docker-init, sh -c, timeout)."""
    return Path(argv[0]).name.startswith("python")
