"""Background processes with pid files and logs, and waiting for them to answer."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Callable, Mapping, Sequence


class StartError(RuntimeError):
    """A service did not come up; the message names its log file."""


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still "exists"; treat it as dead.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (clock ticks since boot), or None when it is gone.

    A pid names a process only together with its start time: once a process dies its number is
    free, and after a reset that killed the stack (a CI runner, a crashed host) an unrelated
    process may hold it.
    """
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[19]
    except (OSError, IndexError):
        return None


def read_pid(pid_file: Path) -> int | None:
    """The live process ``pid_file`` names, or None - also when its number now belongs to
    another process (the start time in the file does not match)."""
    try:
        fields = pid_file.read_text().split()
        pid = int(fields[0])
    except (OSError, ValueError, IndexError):
        return None
    if not pid_alive(pid):
        return None
    if len(fields) > 1 and start_time(pid) not in (None, fields[1]):
        return None
    return pid


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def spawn(
    name: str,
    argv: Sequence[str],
    run_dir: Path,
    log_dir: Path,
    env: Mapping[str, str] | None = None,
    user: str | None = None,
) -> int:
    """Start ``argv`` detached in its own session; stdout/stderr go to ``log_dir/name.log``.

    Detached so that ``make up`` can return and the services outlive it; ``stop`` finds them
    again through the pid file.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    if user:
        argv = ["runuser", "-u", user, "--", *argv]
    log = open(log_dir / f"{name}.log", "ab")
    proc = subprocess.Popen(
        list(argv),
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
        start_new_session=True,
    )
    log.close()
    (run_dir / f"{name}.pid").write_text(f"{proc.pid} {start_time(proc.pid) or ''}".strip())
    return proc.pid


def stop(name: str, run_dir: Path, timeout: float = 20.0) -> bool:
    """SIGTERM the process group in ``run_dir/name.pid``, then SIGKILL after ``timeout``."""
    pid_file = run_dir / f"{name}.pid"
    pid = read_pid(pid_file)
    if pid is None:
        pid_file.unlink(missing_ok=True)
        return False
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + timeout
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if pid_alive(pid):
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    pid_file.unlink(missing_ok=True)
    return True


def wait_until(
    what: str, check: Callable[[], bool], timeout: float, log_file: Path | None = None,
    pid: int | None = None,
) -> None:
    """Poll ``check`` until it is true; fail early when ``pid`` died, naming the log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception:  # the service is still starting; any error means "not yet"
            pass
        if pid is not None and not pid_alive(pid):
            break
        time.sleep(0.2)
    tail = ""
    if log_file and log_file.exists():
        tail = "\n".join(log_file.read_text(errors="replace").splitlines()[-25:])
    raise StartError(f"{what} did not become ready (log: {log_file})\n{tail}")
