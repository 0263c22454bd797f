"""What the harness needs from an implementation: start it, stop it, know its processes.

Each implementation is one module in this package. It builds or installs what it needs once
(cached outside the repo), starts its processes against the local control plane with a trace
file (one line per reconcile start: ``<unix time> <namespace>/<name> <generation>``) and an
optional artificial reconcile duration, and describes itself - version and every setting -
for the record. Nothing here knows about scenarios.
"""

from __future__ import annotations

import compileall
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from ..config import REPO, BenchConfig


@dataclass
class Proc:
    """A started process (in its own session, so its children can be signalled together)."""

    name: str
    popen: subprocess.Popen
    log_path: Path

    @classmethod
    def spawn(cls, name: str, argv: list[str], env: dict[str, str], log_dir: Path,
              cwd: Path = REPO, ledger: Path | None = None) -> "Proc":
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path = log_dir / f"{name}.log"
        with open(log_path, "ab") as log:
            popen = subprocess.Popen(argv, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        if ledger is not None:
            with open(ledger, "a") as f:
                f.write(f"{popen.pid} {_start_time(popen.pid)}\n")
        return cls(name, popen, log_path)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, timeout: float = 20) -> None:
        """SIGTERM the main process (a clean, warm shutdown), then the group if it lingers."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)  # leftover pool children, if any
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.popen.wait(5)
        except subprocess.TimeoutExpired:
            pass


@dataclass
class Impl:
    """Base of every implementation. Subclasses set ``name`` and implement the hooks."""

    cfg: BenchConfig
    name: str = "impl"
    procs: list[Proc] = field(default_factory=list)
    log_dir: Path | None = None
    # The scenarios this implementation takes part in (None: all): a variant that only
    # changes one behaviour is measured only where that behaviour shows.
    only: tuple[str, ...] | None = None
    # The namespaces it watches when started (empty: all of them, as every scenario but the
    # paired restart runs it); only implementations with ``supports_scope`` read it.
    scope: list[str] = field(default_factory=list)
    supports_scope = False
    # The local stack's services this implementation needs to run (``postgres``, ``redis``):
    # its whole footprint is its own processes plus every process of these.
    services: ClassVar[tuple[str, ...]] = ()

    # --- lifecycle ------------------------------------------------------------------------

    def prepare(self) -> None:
        """Build or install what this implementation needs (cached); once per harness run."""

    def reset(self) -> None:
        """Forget any state a previous run left (this project: ledger, history, cache)."""

    def start(self, trace: Path, sleep_ms: int = 0) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()
        self.procs = []

    def restart(self, trace: Path, sleep_ms: int = 0) -> None:
        """Stop and start every process of the operator, as a rolling upgrade replaces them
        all (the relist scenario)."""
        self.stop()
        self.start(trace, sleep_ms)

    # A standby (a second watcher process that takes over when the leader stops): only
    # implementations that have one define these (the relist scenario's third mode).
    supports_standby = False

    def start_standby(self, trace: Path, sleep_ms: int = 0) -> None:
        raise NotImplementedError

    # Lines the process that watches writes as it starts, in order (none: not timed), and a
    # restart of that process alone where it has workers beside it (``restart_watcher``).
    startup_lines: ClassVar[tuple[str, ...]] = ()

    def restart_watcher(self, trace: Path, sleep_ms: int = 0) -> None:
        raise NotImplementedError

    def process_log(self, name: str) -> Path:
        raise NotImplementedError

    def stop_leader(self) -> None:
        raise NotImplementedError

    # --- what the harness measures -----------------------------------------------------------

    def roots(self) -> list[int]:
        """Pids of this implementation's processes (their children are found from these)."""
        return [p.pid for p in self.procs if p.alive()]

    def check_alive(self) -> None:
        for proc in self.procs:
            if not proc.alive():
                raise RuntimeError(f"{self.name}: {proc.name} exited with "
                                   f"{proc.popen.returncode}:\n{proc.log_tail()}")

    def describe(self) -> dict:
        """Version and every setting, for the results file and the docs."""
        return {"name": self.name}

    def run_version(self) -> str:
        """The version that ran, recorded with every run (a working tree can move mid-run)."""
        return ""

    def storage(self) -> dict:
        """What the implementation keeps outside its processes, in bytes (this project: its
        PostgreSQL tables, Redis's memory); a peer keeps everything in its processes."""
        return {}

    # --- helpers ---------------------------------------------------------------------------

    def base_env(self, trace: Path, sleep_ms: int) -> dict[str, str]:
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": os.environ.get("HOME", "/root"),
            "LANG": "C.UTF-8",
            "KUBECONFIG": str(self.cfg.kubeconfig),
            "BENCH_TRACE_FILE": str(trace),
            "BENCH_RECONCILE_SLEEP_MS": str(sleep_ms),
        }

    def logs(self) -> Path:
        return self.log_dir or (self.cfg.work_dir / "logs" / self.name)

    def spawn(self, name: str, argv: list[str], env: dict[str, str]) -> Proc:
        return Proc.spawn(name, argv, env, self.logs(), ledger=self.cfg.work_dir / "procs.txt")


def compile_bytecode(*dirs: Path) -> None:
    """Compile the Python sources an implementation runs from, as the image does (``compileall``
    in the Dockerfile; pip does it for installed packages): no measured start pays for
    compiling, whether or not its environment lets Python write bytecode (a source without
    current bytecode under ``PYTHONDONTWRITEBYTECODE`` is compiled again at every start: ~60 ms
    of each from a fresh clone, ~30 ms of a watcher restart in a tree with a few edited
    modules)."""
    for d in dirs:
        if not compileall.compile_dir(str(d), quiet=1):
            raise RuntimeError(f"could not compile {d}")


def _start_time(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
        return raw[raw.rfind(")") + 2:].split()[19]
    except (OSError, IndexError):
        return ""


def kill_leftovers(ledger: Path) -> int:
    """Kill the process groups a crashed or interrupted harness left running.

    Every process the harness starts leads its own session and is written to ``ledger`` with
    its start time, so only those very processes are signalled (a reused pid never matches)."""
    if not ledger.exists():
        return 0
    killed = 0
    for line in ledger.read_text().splitlines():
        parts = line.split()
        if len(parts) != 2 or not parts[0].isdigit():
            continue
        pid, started = int(parts[0]), parts[1]
        if started and _start_time(pid) == started:
            try:
                os.killpg(pid, signal.SIGKILL)
                killed += 1
            except (ProcessLookupError, PermissionError):
                pass
    ledger.write_text("")
    return killed


def wait_until(check, timeout: float, what: str, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
