"""Scenario 5, relist: with N objects converged, force the watch to restart and measure the
time until the implementation handles a new change again, and how many reconciles it causes.

Two ways, both applied to each implementation:

- ``connections-dropped``: every TCP connection the implementation holds to the api-server is
  killed (``ss -K``, by its local ports); clients reconnect and resume their watches.
- ``restart``: the whole operator restarts, as a rolling upgrade replaces it (this project: the
  watcher and every worker; kopf and controller-runtime: their one process); the reconciles
  its start makes are counted (controller-runtime lists and reconciles all N objects again).
- ``watcher restart``: where the watch runs in a process of its own beside the workers (this
  project), that process alone restarts: the cold start of the watcher, timed three times
  like ``restart``.
- ``standby``: where an implementation has a standby (this project: a second watcher), the
  leader stops cleanly with the standby running, as in a rolling update of two replicas; the
  standby takes over. Nothing changed meanwhile but the canary, so every other reconcile the
  takeover makes is one too many (the target is 0).

Where the implementation names the lines its watching process writes as it starts
(``Impl.startup_lines``: this project's ``watching ...`` and ``leading: starting streams``),
each restart and the takeover record ``phases``: seconds from the disruption to each line, to
the canary's reconcile starting and to the canary converged - where the time goes.
- ``paired restart`` (``run_paired``): this project and kopf run side by side, each watching
  only its own namespace with N objects, and their restarts alternate - A, B, A, B, ... - so
  each pair is timed under the same conditions. A single start is CPU-bound, and on the shared
  2-core VMs here the same start's CPU moved by up to 1.8x in blocks of minutes: the
  ``restart`` mode, each implementation's restarts in a block of its own, measured this
  project at 0.75x and 1.33x kopf in two runs 25 minutes apart.

At the disruption the canary object gets a new generation; "resume" is the time from the
disruption to the canary converged (seen by the observer). Reconciles are counted until none
has started for 3 s; the canary's own run is not counted.

A restart is timed ``RESTARTS`` times per repetition and the repetition reports the median
(the samples are kept beside it): one restart is a process start, mostly CPU-bound imports,
and on the 2-core VMs here a single sample of either implementation ranged 0.45-0.92 s, so
three repetitions of one sample each could not tell a 10 % difference from noise.
"""

from __future__ import annotations

import contextlib
import math
import subprocess
import threading
import time
from pathlib import Path

from .. import probes, workload
from ..impls.base import Impl
from ..impls.ceiling import apiload
from ..probes import FOOTPRINT
from .common import Harness, Meter, Run, measured_run

VALUE = 3
RESTARTS = 3
PAIRED = ("this-project", "kopf")  # the implementations the paired restart runs together


def drop_connections(impl: Impl, api_port: int) -> int:
    ports = probes.established_ports(probes.tree(impl.roots()), api_port)
    for port in ports:
        subprocess.run(["ss", "-K", "-t", "src", f"127.0.0.1:{port}",
                        "dst", f"127.0.0.1:{api_port}"], capture_output=True)
    return len(ports)


def start_standby(impl: Impl, trace, timeout: float = 60) -> None:
    """Start the standby and wait until it stands by: started up (it says so), then two
    seconds for its first round, its Lease watch and its sender (connected once its first
    second without the Lease has passed)."""
    impl.start_standby(trace)
    standby = next(p for p in impl.procs if p.name == "standby")
    deadline = time.monotonic() + timeout
    while "watching " not in standby.log_tail():
        if not standby.alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the standby did not start: {standby.log_tail()}")
        time.sleep(0.1)
    time.sleep(2.0)


def run(h: Harness, impl: Impl, n: int, rep: int) -> dict:
    namespaces = max(1, math.ceil(n / 1000))
    results = {}
    with measured_run(h, impl, "rl", namespaces) as r:
        apiload(h.cfg, "create", n, r.ns.names, h.loader_concurrency, VALUE)
        names = [f"{r.ns.of(i)}/item-{i}" for i in range(n)]
        if not r.observer.wait(lambda o: all(o.converged_at(x, 1) for x in names),
                               max(120.0, n / 5)):
            raise TimeoutError(f"{impl.name}: {n} objects did not converge before the relist")
        r.wait_quiet(0, quiet=2.0, timeout=120)
        modes = (["connections-dropped", "restart"]
                 + (["watcher restart"] if impl.startup_lines else [])
                 + (["standby"] if impl.supports_standby else []))
        for mode in modes:
            if mode == "standby":
                start_standby(impl, r.trace)
            times = RESTARTS if mode in ("restart", "watcher restart") and not h.quick else 1
            results[mode] = _median_of([_disrupt(h, impl, r, mode) for _ in range(times)])
        expected = {(r.ns.of(i), f"item-{i}"): VALUE for i in range(n)}
        expected[(r.ns.names[0], workload.CANARY)] = r.canary_value
        check = workload.check(h.kube, r.ns.names, expected)
    ok = check.ok and all(m["resume_seconds"] is not None for m in results.values())
    return {"impl": impl.name, "n": n, "rep": rep, "ok": ok, "check": check.as_dict(),
            "modes": results}


def run_paired(h: Harness, impls: list[Impl], n: int, rep: int) -> dict[str, dict]:
    """The paired restart: ``{impl name: {"ok", "check", "mode"}}``, ``mode`` the median of
    its restarts (``_median_of``), which alternate with the other's, the first of each pair
    rotating with ``rep``."""
    namespaces = max(1, math.ceil(n / 1000))
    with contextlib.ExitStack() as stack:
        runs = [stack.enter_context(measured_run(h, impl, "rp", namespaces, scoped=True))
                for impl in impls]
        for r in runs:
            apiload(h.cfg, "create", n, r.ns.names, h.loader_concurrency, VALUE)
        for r in runs:
            names = [f"{r.ns.of(i)}/item-{i}" for i in range(n)]
            if not r.observer.wait(lambda o: all(o.converged_at(x, 1) for x in names),
                                   max(120.0, n / 5)):
                raise TimeoutError(f"{r.impl.name}: {n} objects did not converge before the "
                                   "paired restart")
        for r in runs:
            r.wait_quiet(0, quiet=2.0, timeout=120)
        samples: dict[str, list[dict]] = {r.impl.name: [] for r in runs}
        for i in range(1 if h.quick else RESTARTS):
            for r in alternate(runs, rep + i):
                samples[r.impl.name].append(_disrupt(h, r.impl, r, "restart"))
        out = {}
        for r in runs:
            expected = {(r.ns.of(i), f"item-{i}"): VALUE for i in range(n)}
            expected[(r.ns.names[0], workload.CANARY)] = r.canary_value
            check = workload.check(h.kube, r.ns.names, expected)
            mode = _median_of(samples[r.impl.name])
            out[r.impl.name] = {"ok": check.ok and mode["resume_seconds"] is not None,
                                "check": check.as_dict(), "mode": mode}
    return out


def alternate(items: list, turn: int) -> list:
    """``items`` in order on even turns, reversed on odd ones: neither always goes first."""
    return list(items) if turn % 2 == 0 else list(reversed(items))


def _disrupt(h: Harness, impl: Impl, r: Run, mode: str) -> dict:
    """One disruption of ``mode``, timed until the canary converged and the work settled."""
    meter = Meter(h, impl, sample_rss=False).start()
    lines = None
    if impl.startup_lines and mode != "connections-dropped":
        # The process whose start is timed: the new watcher, or the standby taking over.
        lines = LogLines(impl.process_log("standby" if mode == "standby" else "watcher"),
                         impl.startup_lines).start()
    t0 = time.time()
    dropped = None
    if mode == "restart":
        impl.restart(r.trace)
    elif mode == "watcher restart":
        impl.restart_watcher(r.trace)
    elif mode == "standby":
        impl.stop_leader()
    else:
        dropped = drop_connections(impl, h.cfg.stack.apiserver_port)
    _, generation = r.bump_canary()
    converged = r.wait_converged(r.canary, generation, 300)
    r.wait_quiet(t0, quiet=3.0, timeout=300)
    cost = meter.stop()
    runs = r.trace_lines(since=t0)
    out = {
        "connections_dropped": dropped,
        "resume_seconds": round(converged - t0, 3) if converged else None,
        "reconciles": len([x for x in runs if x[1] != r.canary]),
        "operator_cpu_seconds": cost["cpu_seconds"]["operator"],
        "footprint_cpu_seconds": cost["cpu_seconds"][FOOTPRINT],
        "api_requests": cost["api_requests"],
    }
    if lines is not None:
        seen = lines.stop()
        start = next((t for t, obj, g in runs if obj == r.canary and g >= generation), None)
        out["phases"] = phases(t0, seen, start, converged)
    return out


def phases(t0: float, lines: dict[str, float | None], reconcile_start: float | None,
           converged: float | None) -> dict[str, float | None]:
    """Seconds from the disruption to each start-up line, to the canary's reconcile start and
    to the canary converged (None: not seen)."""
    marks = {**{f"line {text.strip()!r}": t for text, t in lines.items()},
             "canary reconcile start": reconcile_start, "canary converged": converged}
    return {name: None if t is None else round(t - t0, 3) for name, t in marks.items()}


class LogLines(threading.Thread):
    """When each of ``texts`` first appears in a process's log after ``start()``: the log
    is polled every 10 ms from its size at the start (restarts append to the same file)."""

    def __init__(self, path: Path, texts: tuple[str, ...]):
        super().__init__(daemon=True, name="log-lines")
        self.path, self.texts = path, texts
        self.seen: dict[str, float | None] = {t: None for t in texts}
        self._done = threading.Event()
        try:
            self.offset = path.stat().st_size
        except OSError:
            self.offset = 0

    def run(self) -> None:
        while not self._done.wait(0.01):
            self.poll()
            if all(t is not None for t in self.seen.values()):
                return

    def poll(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                text = f.read().decode(errors="replace")
        except OSError:
            return
        now = time.time()
        for marker in self.texts:
            if self.seen[marker] is None and marker in text:
                self.seen[marker] = now

    def start(self) -> "LogLines":
        super().start()
        return self

    def stop(self) -> dict[str, float | None]:
        self._done.set()
        self.join(2)
        return dict(self.seen)


def _median_of(samples: list[dict]) -> dict:
    """The median sample by resume time (one that did not resume counts as the slowest), with
    every sample's resume time beside it and the most reconciles any of them caused."""
    if len(samples) == 1:
        return samples[0]
    ranked = sorted(samples, key=lambda m: (m["resume_seconds"] is None,
                                            m["resume_seconds"] or 0.0))
    out = dict(ranked[len(ranked) // 2])
    out["resume_samples"] = [m["resume_seconds"] for m in samples]
    out["reconciles"] = max(m["reconciles"] for m in samples)
    if any(m["resume_seconds"] is None for m in samples):
        out["resume_seconds"] = None
    return out
